package discover

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A kiln built without cgo says so, and how to get one that reads NVML,
// instead of blaming a library the machine may well have.
func TestNVMLNote(t *testing.T) {
	noCgo := noCgoError{lib: "libnvidia-ml.so.1"}
	if !errors.Is(noCgo, ErrNoNVML) {
		t.Error("noCgoError does not count as ErrNoNVML: discovery would treat it as a failure of the node")
	}
	got := nvmlNote(noCgo)
	for _, want := range []string{"this kiln was built without cgo and cannot read NVIDIA GPUs through NVML", "libnvidia-ml.so.1", "scripts/install.sh", "unknown"} {
		if !strings.Contains(got, want) {
			t.Errorf("note %q does not say %q", got, want)
		}
	}
	if strings.Contains(got, "not found") {
		t.Errorf("note %q blames a missing library", got)
	}
	missing := nvmlNote(fmt.Errorf("%w: cannot load libnvidia-ml.so.1 (is the NVIDIA driver installed?)", ErrNoNVML))
	if !strings.HasPrefix(missing, "NVML library not found") || strings.Contains(missing, "cgo") {
		t.Errorf("a missing library reads %q", missing)
	}
}
