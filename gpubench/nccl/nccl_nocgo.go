//go:build !cgo

package nccl

import (
	"errors"
	"fmt"

	"kiln.dev/kiln/gpubench"
)

// Lib is not available without cgo.
type Lib struct{}

// Open fails: the library is loaded through cgo, and this kiln was built
// without it.
func Open(flavour, path string) (*Lib, error) {
	return nil, gpubench.NoDriver(fmt.Errorf("this kiln was built without cgo (CGO_ENABLED=0) and cannot load %s", flavour))
}

func (*Lib) Name() string    { return "" }
func (*Lib) Version() string { return "" }
func (*Lib) Path() string    { return "" }
func (*Lib) Comms([]int) (gpubench.Comms, error) {
	return nil, gpubench.NoDriver(errors.New("this kiln was built without cgo"))
}
