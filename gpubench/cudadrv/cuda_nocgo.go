//go:build !cgo

package cudadrv

import (
	"errors"
	"fmt"
	"time"

	"kiln.dev/kiln/gpubench"
)

// Driver is not available without cgo.
type Driver struct{}

// Open fails: libcuda is loaded through cgo, and this kiln was built
// without it.
func Open(path string) (*Driver, error) {
	if path == "" {
		path = DefaultLibrary
	}
	return nil, gpubench.NoDriver(fmt.Errorf("this kiln was built without cgo (CGO_ENABLED=0) and cannot load %s", path))
}

func (*Driver) Name() string                        { return "cuda" }
func (*Driver) Version() string                     { return "" }
func (*Driver) Devices() ([]gpubench.Device, error) { return nil, nil }
func (*Driver) HostNUMANodes() []int                { return nil }
func (*Driver) AllocHost(int64, bool, int) (gpubench.Buffer, error) {
	return gpubench.Buffer{}, errNoCgo
}
func (*Driver) AllocDevice(int, int64) (gpubench.Buffer, error)             { return gpubench.Buffer{}, errNoCgo }
func (*Driver) Free(gpubench.Buffer) error                                  { return errNoCgo }
func (*Driver) NewStream(int) (gpubench.Stream, error)                      { return gpubench.Stream{}, errNoCgo }
func (*Driver) DestroyStream(gpubench.Stream) error                         { return errNoCgo }
func (*Driver) NewEvent(int) (gpubench.Event, error)                        { return gpubench.Event{}, errNoCgo }
func (*Driver) DestroyEvent(gpubench.Event) error                           { return errNoCgo }
func (*Driver) Copy(_, _ gpubench.Buffer, _ int64, _ gpubench.Stream) error { return errNoCgo }
func (*Driver) Record(gpubench.Event, gpubench.Stream) error                { return errNoCgo }
func (*Driver) Wait(gpubench.Stream, gpubench.Event) error                  { return errNoCgo }
func (*Driver) Sync(gpubench.Event) error                                   { return errNoCgo }
func (*Driver) Elapsed(_, _ gpubench.Event) (time.Duration, error)          { return 0, errNoCgo }
func (*Driver) CanAccessPeer(int, int) (bool, error)                        { return false, errNoCgo }
func (*Driver) EnablePeerAccess(int, int) error                             { return errNoCgo }
func (*Driver) Close() error                                                { return nil }
func (*Driver) Path() string                                                { return "" }

var errNoCgo = gpubench.NoDriver(errors.New("this kiln was built without cgo"))
