package capture

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/snapshot"
)

const dmesgDir = "../testdata/captures/dmesg/"

func dmesgImport(t *testing.T, name string) *snapshot.Snapshot {
	t.Helper()
	b, err := os.ReadFile(dmesgDir + name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseBytes(dmesgDir+name, b)
	if err != nil {
		t.Fatalf("ParseBytes(%s): %v", name, err)
	}
	if len(s.Sources) != 1 || s.Sources[0].Kind != "dmesg" {
		t.Fatalf("%s read as %+v, want dmesg", name, s.Sources)
	}
	return s
}

// eventCounts counts events by "kind code device".
func eventCounts(evs []snapshot.Event) map[string]int {
	m := map[string]int{}
	for _, e := range evs {
		k := e.Kind
		if e.Code != 0 {
			k += " " + strconv.Itoa(e.Code)
		}
		m[k+" "+e.Device]++
	}
	return m
}

func gpuAddrs(gs []snapshot.GPU) string {
	var a []string
	for _, g := range gs {
		a = append(a, g.PCIAddress)
	}
	return strings.Join(a, " ")
}

func TestDmesgCaptures(t *testing.T) {
	tests := []struct {
		file     string
		events   map[string]int
		gpus     string
		switches int
		kernel   string
		open     *bool
	}{
		{
			file:   "h100-xid119-gsp-rpc-timeout.log",
			events: map[string]int{"xid 119 0000:9b:00.0": 5},
			gpus:   "0000:9b:00.0",
		},
		{
			file:   "h100-xid13-xid109-ctxsw-timeout.log",
			events: map[string]int{"xid 13 0000:cb:00.0": 3, "xid 109 0000:cb:00.0": 1},
		},
		{
			file:   "nvrm-fallen-off-bus-no-xid.log",
			events: map[string]int{"fallen-off-bus 0000:b3:00.0": 1, "probe-failed ": 1},
			gpus:   "0000:b3:00.0",
			kernel: "570.158.01", open: snapshot.Ptr(true),
		},
		{
			file:     "h100-hgx-boot-dmesg-iso.log",
			events:   map[string]int{},
			gpus:     "0000:19:00.0 0000:3b:00.0 0000:4c:00.0 0000:5d:00.0 0000:9b:00.0 0000:bb:00.0 0000:cb:00.0 0000:db:00.0",
			switches: 4,
			kernel:   "550.90.07", open: snapshot.Ptr(false),
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			s := dmesgImport(t, tt.file)
			got := eventCounts(s.Events)
			if len(got) != len(tt.events) {
				t.Errorf("events %v, want %v", got, tt.events)
			}
			for k, n := range tt.events {
				if got[k] != n {
					t.Errorf("%q: %d events, want %d (all: %v)", k, got[k], n, got)
				}
			}
			if a := gpuAddrs(s.GPUs); a != tt.gpus {
				t.Errorf("GPUs %q, want %q", a, tt.gpus)
			}
			for i, g := range s.GPUs {
				if g.Index != i || g.Vendor != snapshot.VendorNVIDIA {
					t.Errorf("GPU %d: index %d vendor %q", i, g.Index, g.Vendor)
				}
			}
			n := 0
			for _, p := range s.PCI {
				if p.Kind != snapshot.KindNVSwitch || p.VendorID != "10de" || p.DeviceID != "22a3" {
					t.Errorf("PCI device %+v is not an H100-board NVSwitch", p)
				}
				n++
			}
			if n != tt.switches {
				t.Errorf("%d NVSwitches, want %d", n, tt.switches)
			}
			if s.Drivers.NVIDIAKernel != tt.kernel {
				t.Errorf("NVIDIA kernel module %q, want %q", s.Drivers.NVIDIAKernel, tt.kernel)
			}
			if (s.Drivers.NVIDIAOpenKernel == nil) != (tt.open == nil) ||
				(tt.open != nil && *s.Drivers.NVIDIAOpenKernel != *tt.open) {
				t.Errorf("open kernel module %v, want %v", s.Drivers.NVIDIAOpenKernel, tt.open)
			}
		})
	}
}

func TestDmesgDetails(t *testing.T) {
	s := dmesgImport(t, "h100-xid119-gsp-rpc-timeout.log")
	g := s.GPUs[0]
	if g.UUID != "GPU-509665ad-b600-ac93-3616-d754b23d636d" || g.Serial != "1650124014249" {
		t.Errorf("GPU %+v, want the UUID and serial NVRM printed", g)
	}
	e := s.Events[3]
	if e.Process != "cache_mgr_main" || e.PID != 1263500 || e.Source != "dmesg" ||
		!e.Time.Equal(time.Date(2025, 2, 23, 16, 27, 12, 0, time.UTC)) {
		t.Errorf("4th event %+v", e)
	}

	s = dmesgImport(t, "nvrm-fallen-off-bus-no-xid.log")
	if g := s.GPUs[0]; g.DeviceID != "26b5" {
		t.Errorf("fallen-off GPU %+v, want device id 26b5 from the PCI ID", g)
	}

	// The boot log's "BAR 13/14/15: failed to assign" lines are bridge
	// windows, not GPU faults.
	s = dmesgImport(t, "h100-hgx-boot-dmesg-iso.log")
	if len(s.Events) != 0 {
		t.Errorf("boot log events %+v, want none", s.Events)
	}
	for _, g := range s.GPUs {
		if g.PCIAddress == "0000:17:02.0" || g.PCIAddress == "0000:1a:00.0" {
			t.Errorf("a bridge or NIC became a GPU: %+v", g)
		}
	}
}

func TestDmesgGPUsFromEnumeration(t *testing.T) {
	log := "[    0.5] pci 0000:00:02.0: [8086:56c0] type 00 class 0x038000\n" +
		"[    0.6] pci 0000:03:00.0: [1a03:2000] type 00 class 0x030000\n" +
		"[    0.7] pci 0000:41:00.0: [1002:74a1] type 00 class 0x038000\n" +
		"[    0.7] pci 0000:41:00.1: [1002:ab20] type 00 class 0x040300\n" +
		"[    0.8] pci 0000:81:00.0: [10de:2330] type 00 class 0x030200\n" +
		"[    0.9] pci 0000:83:00.0: [10de:1af1] type 00 class 0x068000\n"
	s, err := ParseBytes("boot.log", []byte(log))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ addr, vendor, dev string }{
		{"0000:00:02.0", snapshot.VendorIntel, "56c0"},
		{"0000:41:00.0", snapshot.VendorAMD, "74a1"},
		{"0000:81:00.0", snapshot.VendorNVIDIA, "2330"},
	}
	if len(s.GPUs) != len(want) {
		t.Fatalf("GPUs %+v, want %d (no BMC VGA, no HDMI audio, no NVSwitch)", s.GPUs, len(want))
	}
	for i, w := range want {
		g := s.GPUs[i]
		if g.PCIAddress != w.addr || g.Vendor != w.vendor || g.DeviceID != w.dev {
			t.Errorf("GPU %d = %s %s %s, want %s %s %s", i, g.PCIAddress, g.Vendor, g.DeviceID, w.addr, w.vendor, w.dev)
		}
	}
	if len(s.PCI) != 1 || s.PCI[0].Address != "0000:83:00.0" || s.PCI[0].Kind != snapshot.KindNVSwitch {
		t.Errorf("PCI %+v, want the A100-board NVSwitch 0000:83:00.0", s.PCI)
	}
	if s.Drivers.NVIDIAKernel != "" || s.Drivers.NVIDIAOpenKernel != nil {
		t.Errorf("driver facts %+v invented from a log without an NVRM load line", s.Drivers)
	}
}

// Each capture is claimed by its own importer only: the kernel-log and
// fabric-manager detectors must not take lspci, nvidia-smi or rocm-smi files.
func TestDmesgAndFabricManagerDetect(t *testing.T) {
	root := "../testdata/captures"
	checked := 0
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		// Files at the top (README.md, expected.json) describe the set;
		// KFD topology copies are directories of small files.
		if !strings.Contains(rel, string(filepath.Separator)) || strings.HasPrefix(rel, "kfd-topology") ||
			bundleFolders[strings.Split(rel, string(filepath.Separator))[0]] {
			return nil
		}
		checked++
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		kind := strings.Split(rel, string(filepath.Separator))[0]
		if got, want := detectDmesg(filepath.Base(p), b), kind == "dmesg"; got != want {
			t.Errorf("dmesg Detect(%s) = %v, want %v", rel, got, want)
		}
		if got, want := detectFabricManager(filepath.Base(p), b), kind == "fabricmanager"; got != want {
			t.Errorf("fabricmanager Detect(%s) = %v, want %v", rel, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Errorf("checked %d captures, want all of them", checked)
	}
}

func FuzzDmesg(f *testing.F) {
	files, _ := filepath.Glob(dmesgDir + "*.log")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 4<<10)])
	}
	f.Add([]byte("[ 0.8] pci 0000:81:00.0: [10de:2330] type 00 class 0x030200\n[ 7.0] [drm] Initialized nvidia-drm 0.0.0 20160202 for 0000:81:00.0 on minor 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if !detectDmesg("x", data) {
			return
		}
		s, err := parseDmesg("x", bytes.NewReader(data))
		if err != nil {
			t.Fatalf("parse error on in-memory data: %v", err)
		}
		seen := map[string]bool{}
		for i, g := range s.GPUs {
			if c, err := snapshot.CanonicalPCI(g.PCIAddress); err != nil || c != g.PCIAddress {
				t.Fatalf("GPU address %q is not canonical", g.PCIAddress)
			}
			if seen[g.PCIAddress] || g.Index != i || g.Vendor == "" {
				t.Fatalf("bad GPU list %+v", s.GPUs)
			}
			seen[g.PCIAddress] = true
		}
		for _, p := range s.PCI {
			if c, err := snapshot.CanonicalPCI(p.Address); err != nil || c != p.Address || p.Kind != snapshot.KindNVSwitch {
				t.Fatalf("bad PCI device %+v", p)
			}
		}
		for _, e := range s.Events {
			if e.Device != "" {
				if c, err := snapshot.CanonicalPCI(e.Device); err != nil || c != e.Device {
					t.Fatalf("event device %q is not canonical", e.Device)
				}
			}
			if e.Code < 0 || e.PID < 0 {
				t.Fatalf("negative count in %+v", e)
			}
		}
	})
}
