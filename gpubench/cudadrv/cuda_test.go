//go:build cgo

package cudadrv

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/gpubench"
	"kiln.dev/kiln/testenv"
)

// fakeLibrary builds testdata/fakecuda.c into a shared object.
func fakeLibrary(t *testing.T) string {
	t.Helper()
	cc := testenv.Need(t, "gcc", "apt-get install gcc libc6-dev (it builds the fake library)")
	out := filepath.Join(t.TempDir(), "libcuda-fake.so")
	cmd := exec.Command(cc, "-shared", "-fPIC", "-pthread", "-O1", "-o", out, "testdata/fakecuda.c")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the fake libcuda: %v\n%s", err, b)
	}
	return out
}

// TestFakeLibcuda runs gpubench through the real cgo trampolines on a
// library that reports known timings.
func TestFakeLibcuda(t *testing.T) {
	d, err := Open(fakeLibrary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Version() != "12.4" || d.Name() != "cuda" {
		t.Errorf("driver %s %s", d.Name(), d.Version())
	}
	devs, _ := d.Devices()
	if len(devs) != 2 || devs[0].PCI != "0000:1a:00.0" || devs[1].PCI != "0000:2a:00.0" || devs[1].Name != "Fake CUDA GPU 1" || devs[0].MemoryBytes != 80<<30 {
		t.Fatalf("devices %+v", devs)
	}
	p := gpubench.DefaultPlan()
	p.Bytes = 1_000_000
	p.Warmup, p.Repetitions = 1, 3
	p.LatencyCopies = 4
	p.Groups = []string{gpubench.GroupHost, gpubench.GroupDevice, gpubench.GroupP2P, gpubench.GroupLatency}
	ms, _, err := gpubench.Run(context.Background(), d, gpubench.Options{Plan: p})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"h2d pinned": 25, "d2h pinned": 20, "h2d pageable": 10, "d2h pageable": 10,
		// Within a device, bytes read plus written.
		"device": 1000,
		"p2p":    50, "p2p-bidi": 100,
	}
	seen := 0
	for _, m := range ms.Results {
		if m.Error != "" {
			t.Errorf("%s: %s", m.Test, m.Error)
			continue
		}
		key := strings.TrimSpace(m.Test + " " + m.Memory)
		if m.Test == "p2p-latency" {
			// 1 us, and 8 bytes at 50 GB/s: 0.16 ns.
			if math.Abs(m.MedianUS-1.00016) > 1e-3 { // the timer counts whole nanoseconds
				t.Errorf("latency %v us", m.MedianUS)
			}
			seen++
			continue
		}
		w, ok := want[key]
		if !ok {
			t.Errorf("unexpected %s", key)
			continue
		}
		// Each copy costs 1 us besides its size at the rate.
		copies := 1.0
		if m.Test == "p2p-bidi" || m.Test == "device" {
			copies = 2 // two copies' bytes moved in one copy's time
		}
		w = copies * 1e6 / (1000 + copies*1e6/w)
		if math.Abs(m.MedianGBps-w)/w > 1e-4 {
			t.Errorf("%s on %v: %v GB/s, want %v", key, m.Devices, m.MedianGBps, w)
		}
		if m.Test == "p2p" && (m.PeerAccess == nil || !*m.PeerAccess) {
			t.Errorf("p2p without peer access")
		}
		seen++
	}
	// 2 GPUs x 4 host tests (memory not placed: sysfs has no such
	// devices), 2 device, 2 p2p, 1 bidi, 1 latency.
	if seen != 14 {
		t.Errorf("%d measurements, want 14", seen)
	}
	for _, n := range ms.Notes {
		if strings.Contains(n, "not held") {
			t.Errorf("latency runs not gated: %s", n)
		}
	}
	if len(d.host) != 0 {
		t.Errorf("%d host regions left", len(d.host))
	}
}

func TestOpenFails(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "libcuda.so.1"))
	if !errors.Is(err, gpubench.ErrNoDriver) || !strings.Contains(err.Error(), "is the NVIDIA driver installed?") {
		t.Errorf("missing library: %v", err)
	}
	// A library that is not libcuda.
	if _, err := os.Stat("/lib/x86_64-linux-gnu/libm.so.6"); err == nil {
		_, err := Open("libm.so.6")
		if !errors.Is(err, gpubench.ErrNoDriver) || !strings.Contains(err.Error(), "has no cuInit") {
			t.Errorf("libm: %v", err)
		}
	}
	lib := fakeLibrary(t)
	t.Setenv("FAKECUDA_NODEVICE", "1")
	_, err = Open(lib)
	if !errors.Is(err, gpubench.ErrNoDriver) || !strings.Contains(err.Error(), "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)") {
		t.Errorf("no device: %v", err)
	}
}
