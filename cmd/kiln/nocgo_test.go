package main

import (
	"os/exec"
	"strings"
	"testing"
)

// A kiln built without cgo, asked to read NVIDIA GPUs live, says that its
// build is the reason and how to get one that reads them.
func TestNoCgoKilnSaysSo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kiln")
	}
	bin := buildKiln(t) // CGO_ENABLED=0
	// The bundle's tree stands for a live machine's root with eight H100s;
	// naming the library makes discovery load NVML for it.
	out, err := exec.Command(bin, "inventory", "--root", "../../testdata/fixtures/h100-hgx8-sysfs/sysfs", "--nvml-lib", "libnvidia-ml.so.1").CombinedOutput()
	if err != nil {
		t.Fatalf("kiln inventory: %v\n%s", err, out)
	}
	for _, want := range []string{"this kiln was built without cgo and cannot read NVIDIA GPUs through NVML", "build it with scripts/install.sh"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kiln inventory does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "NVML library not found") {
		t.Errorf("kiln inventory blames a missing library for its own build:\n%s", out)
	}
}
