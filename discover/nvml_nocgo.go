//go:build !cgo

package discover

import "fmt"

// openNVML: NVML is loaded through cgo, and this kiln was built without it.
func openNVML(libPath string) (nvmlLib, error) {
	lib := libPath
	if lib == "" {
		lib = "libnvidia-ml.so.1"
	}
	return nil, fmt.Errorf("%w: this kiln was built without cgo (CGO_ENABLED=0) and cannot load %s", ErrNoNVML, lib)
}
