//go:build cgo

package hip

import (
	"context"
	"errors"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/gpubench"
	"kiln.dev/kiln/testenv"
)

func fakeLibrary(t *testing.T) string {
	t.Helper()
	cc := testenv.Need(t, "gcc", "apt-get install gcc libc6-dev (it builds the fake library)")
	out := filepath.Join(t.TempDir(), "libamdhip64-fake.so")
	if b, err := exec.Command(cc, "-shared", "-fPIC", "-pthread", "-O1", "-o", out, "testdata/fakehip.c").CombinedOutput(); err != nil {
		t.Fatalf("building the fake libamdhip64: %v\n%s", err, b)
	}
	return out
}

// TestFakeHIP runs gpubench through the HIP trampolines on a library that
// reports known timings, one pair without peer access.
func TestFakeHIP(t *testing.T) {
	t.Setenv("FAKEHIP_DEVICES", "3")
	d, err := Open(fakeLibrary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Version() != "6.1.40091" {
		t.Errorf("version %q", d.Version())
	}
	devs, _ := d.Devices()
	if len(devs) != 3 || devs[2].PCI != "0000:4c:00.0" || devs[0].MemoryBytes != 192<<30 {
		t.Fatalf("devices %+v", devs)
	}
	p := gpubench.DefaultPlan()
	p.Bytes = 1_000_000
	p.Warmup, p.Repetitions = 1, 3
	p.Groups = []string{gpubench.GroupHost, gpubench.GroupDevice, gpubench.GroupP2P, gpubench.GroupLatency}
	ms, _, err := gpubench.Run(context.Background(), d, gpubench.Options{Plan: p})
	if err != nil {
		t.Fatal(err)
	}
	rate := map[string]float64{"h2d pinned": 24, "d2h pinned": 16, "h2d pageable": 8, "d2h pageable": 8, "device": 800, "p2p": 40, "p2p-bidi": 40}
	for _, m := range ms.Results {
		if m.Error != "" {
			t.Errorf("%s: %s", m.Test, m.Error)
			continue
		}
		key := strings.TrimSpace(m.Test + " " + m.Memory)
		if m.Test == "p2p-latency" {
			// 1 us, and 8 bytes at 40 GB/s.
			if math.Abs(m.MedianUS-1.0002) > 1e-3 {
				t.Errorf("latency %v us", m.MedianUS)
			}
			continue
		}
		copies := 1.0
		if m.Test == "p2p-bidi" || m.Test == "device" {
			copies = 2
		}
		w := copies * 1e6 / (1000 + 1e6/rate[key])
		if math.Abs(m.MedianGBps-w)/w > 1e-4 {
			t.Errorf("%s on %v: %v GB/s, want %v", key, m.Devices, m.MedianGBps, w)
		}
		if m.Test == "p2p" || m.Test == "p2p-bidi" {
			pair02 := strings.Contains(strings.Join(m.Devices, ","), "0000:0c:00.0") && strings.Contains(strings.Join(m.Devices, ","), "0000:4c:00.0")
			if m.PeerAccess == nil || *m.PeerAccess == pair02 {
				t.Errorf("%s %v: peer access %v", m.Test, m.Devices, m.PeerAccess)
			}
		}
	}
	for _, n := range ms.Notes {
		if strings.Contains(n, "not held") {
			t.Errorf("latency runs not gated: %s", n)
		}
	}
}

func TestOpenFails(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "libamdhip64.so"))
	if !errors.Is(err, gpubench.ErrNoDriver) || !strings.Contains(err.Error(), "is ROCm installed?") {
		t.Errorf("missing library: %v", err)
	}
	lib := fakeLibrary(t)
	t.Setenv("FAKEHIP_DEVICES", "0")
	if _, err := Open(lib); !errors.Is(err, gpubench.ErrNoDriver) || !strings.Contains(err.Error(), "hipErrorNoDevice") {
		t.Errorf("no device: %v", err)
	}
}

func TestVersionText(t *testing.T) {
	for v, want := range map[int]string{60140091: "6.1.40091", 50422804: "5.4.22804", 70000000: "7.0.0", 0: ""} {
		if got := versionText(v); got != want {
			t.Errorf("%d: %q, want %q", v, got, want)
		}
	}
}
