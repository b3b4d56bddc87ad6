//go:build !cgo

package discover

// openNVML: NVML is loaded through cgo, and this kiln was built without it.
func openNVML(libPath string) (nvmlLib, error) {
	if libPath == "" {
		libPath = "libnvidia-ml.so.1"
	}
	return nil, noCgoError{lib: libPath}
}
