//go:build cgo

package nccl

import (
	"context"
	"errors"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/gpubench"
	"kiln.dev/kiln/gpubench/cudadrv"
	"kiln.dev/kiln/testenv"
)

// fakeLibrary builds the fake libcuda and the fake NCCL into one library.
func fakeLibrary(t *testing.T) string {
	t.Helper()
	cc := testenv.Need(t, "gcc", "apt-get install gcc libc6-dev (it builds the fake library)")
	out := filepath.Join(t.TempDir(), "libfake-cuda-nccl.so")
	if b, err := exec.Command(cc, "-shared", "-fPIC", "-pthread", "-O1", "-o", out, "../cudadrv/testdata/fakecuda.c", "testdata/fakenccl.c").CombinedOutput(); err != nil {
		t.Fatalf("building the fake libraries: %v\n%s", err, b)
	}
	return out
}

// TestFakeNCCL measures the three collectives over four fake GPUs through
// the real trampolines: bus bandwidth as nccl-tests computes it from
// known times.
func TestFakeNCCL(t *testing.T) {
	lib := fakeLibrary(t)
	t.Setenv("FAKECUDA_DEVICES", "4")
	d, err := cudadrv.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := Open("nccl", lib)
	if err != nil {
		t.Fatal(err)
	}
	if c.Version() != "2.21.5" || c.Name() != "nccl" {
		t.Errorf("library %s %s", c.Name(), c.Version())
	}
	p := gpubench.DefaultPlan()
	p.CollectiveBytes = 4_000_000
	p.Warmup, p.Repetitions = 1, 3
	p.Groups = []string{gpubench.GroupCollective}
	ms, _, err := gpubench.Run(context.Background(), d, gpubench.Options{Plan: p, Collectives: c})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms.Results) != 3 || ms.Collectives != "nccl 2.21.5" {
		t.Fatalf("%d results, collectives %q, notes %q", len(ms.Results), ms.Collectives, ms.Notes)
	}
	// 4 MB in 2 us + 40 us.
	alg := 4e6 / 42000.0
	for _, m := range ms.Results {
		if m.Error != "" {
			t.Fatalf("%s: %s", m.Test, m.Error)
		}
		bus := alg * 0.75
		if m.Test == "all-reduce" {
			bus = alg * 1.5
		}
		if math.Abs(m.AlgGBps-alg)/alg > 1e-4 || math.Abs(m.MedianGBps-bus)/bus > 1e-4 || m.Bytes != 4_000_000 {
			t.Errorf("%s: alg %v bus %v size %d, want %v %v 4000000", m.Test, m.AlgGBps, m.MedianGBps, m.Bytes, alg, bus)
		}
	}
}

func TestOpenFails(t *testing.T) {
	_, err := Open("nccl", filepath.Join(t.TempDir(), "libnccl.so.2"))
	if !errors.Is(err, gpubench.ErrNoDriver) {
		t.Errorf("missing library: %v", err)
	}
	if _, err := Open("gloo", ""); err == nil || !strings.Contains(err.Error(), "want nccl or rccl") {
		t.Errorf("unknown flavour: %v", err)
	}
}

func TestVersionText(t *testing.T) {
	for v, want := range map[int]string{22105: "2.21.5", 21903: "2.19.3", 2804: "2.8.4", 0: ""} {
		if got := versionText(v); got != want {
			t.Errorf("%d: %q, want %q", v, got, want)
		}
	}
}
