package capture

import (
	"os"
	"path/filepath"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func addSeeds(f *testing.F, glob string) {
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		f.Fatalf("no seeds for %s", glob)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// addSmallSeeds adds the files of glob, each cut to its first 8 KiB: large
// captures make the fuzzer's minimisation crawl, and their head (a banner,
// the first GPU entries) holds their shape.
func addSmallSeeds(f *testing.F, glob string) {
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		f.Fatalf("no seeds for %s", glob)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 8<<10)])
	}
}

// checkAMDSnapshot checks what every AMD importer promises.
func checkAMDSnapshot(t *testing.T, s *snapshot.Snapshot) {
	t.Helper()
	for _, g := range s.GPUs {
		if g.PCIAddress != "" {
			if c, err := snapshot.CanonicalPCI(g.PCIAddress); err != nil || c != g.PCIAddress {
				t.Errorf("PCI address %q is not canonical", g.PCIAddress)
			}
		}
		if g.NUMANode != nil && *g.NUMANode < -1 {
			t.Errorf("NUMA node %d", *g.NUMANode)
		}
		if g.Partition != nil && g.Partition.Count < 0 {
			t.Errorf("partition count %d", g.Partition.Count)
		}
		if g.PCIe != nil && (g.PCIe.CurrentGen < 0 || g.PCIe.MaxGen > 6 || g.PCIe.CurrentWidth < 0 || g.PCIe.MaxWidth > 32) {
			t.Errorf("PCIe %+v", g.PCIe)
		}
		if g.DeviceID != "" && len(g.DeviceID) != 4 {
			t.Errorf("device id %q", g.DeviceID)
		}
	}
	for _, l := range s.Links {
		if l.A == l.B || l.Weight < 0 || l.Hops < 0 {
			t.Errorf("link %+v", l)
		}
	}
	for _, g := range s.GPUs {
		if g.NUMANode != nil && *g.NUMANode > rocmMaxIndex {
			t.Errorf("NUMA node %d", *g.NUMANode)
		}
		for _, k := range g.KFDNodes {
			if k < 0 || k > rocmMaxIndex {
				t.Errorf("KFD node %d", k)
			}
		}
		if g.Processes < 0 {
			t.Errorf("processes %d", g.Processes)
		}
	}
	for _, e := range s.Events {
		switch {
		case e.Kind != snapshot.EventToolError:
			t.Errorf("event kind %q", e.Kind)
		case e.Reason != snapshot.ToolGPUError && e.Reason != snapshot.ToolDriverUnreachable && e.Reason != snapshot.ToolPermissionDenied:
			t.Errorf("event reason %q", e.Reason)
		case e.Device != "":
			if c, err := snapshot.CanonicalPCI(e.Device); err != nil || c != e.Device {
				t.Errorf("event device %q", e.Device)
			}
		}
	}
	if m := s.Matrix; m != nil {
		n := len(m.Devices)
		if len(m.Cells) != n || m.Weights != nil && len(m.Weights) != n || m.Hops != nil && len(m.Hops) != n {
			t.Errorf("matrix of %d devices: %d rows, %d weight rows, %d hop rows", n, len(m.Cells), len(m.Weights), len(m.Hops))
		}
		for i := range m.Cells {
			if len(m.Cells[i]) != n || m.Weights != nil && len(m.Weights[i]) != n || m.Hops != nil && len(m.Hops[i]) != n {
				t.Errorf("matrix row %d is not %d wide", i, n)
			}
		}
	}
	for _, c := range s.Claims {
		if c.Count < 0 {
			t.Errorf("claim %+v", c)
		}
	}
}

func FuzzRocmSMI(f *testing.F) {
	addSeeds(f, "../testdata/captures/rocm-smi/*")
	f.Fuzz(func(t *testing.T, data []byte) {
		var s *snapshot.Snapshot
		var err error
		switch {
		case rocmIsJSON(data):
			s, err = parseRocmJSON(data)
		case rocmIsText(data):
			s, err = parseRocmText(data)
		default:
			return
		}
		if err == nil {
			checkAMDSnapshot(t, s)
		}
	})
}

func FuzzAMDSMI(f *testing.F) {
	addSeeds(f, "../testdata/amd-smi/*.json")
	addSeeds(f, "../testdata/amd-smi/*.txt")
	addSmallSeeds(f, "../testdata/captures/amd-smi/*")
	f.Fuzz(func(t *testing.T, data []byte) {
		var s *snapshot.Snapshot
		var err error
		switch {
		case amdIsJSON(data):
			s, err = parseAMDSMIJSON(data)
		case amdIsText(data):
			s, err = parseAMDSMIText(data)
		default:
			return
		}
		if err == nil {
			checkAMDSnapshot(t, s)
		}
	})
}

// FuzzAMDSMIText feeds any input to the text reader (key-value blocks,
// monitor and process tables, topology tables, the permission banner), not
// only what Detect accepts.
func FuzzAMDSMIText(f *testing.F) {
	addSeeds(f, "../testdata/amd-smi/*.txt")
	addSmallSeeds(f, "../testdata/captures/amd-smi/*")
	f.Add([]byte("GPU  POWER  GPU_TEMP  MEM_TEMP\n  0  248 W  55 \u00b0C  48 \u00b0C\n"))
	f.Add([]byte("WEIGHT TABLE:\n             0000:05:00.0 0000:26:00.0\n0000:05:00.0 0 15\n0000:26:00.0 15 0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if s, err := parseAMDSMIText(data); err == nil {
			checkAMDSnapshot(t, s)
		}
	})
}

// FuzzRocmSMIText feeds any input to the rocm-smi text reader (concise and
// hardware tables, matrices, error lines, partition folding).
func FuzzRocmSMIText(f *testing.F) {
	addSeeds(f, "../testdata/captures/rocm-smi/*.txt")
	// Found by the fuzzer: a --showhw row cut at the header's columns gave
	// KFD node 7000.
	f.Add([]byte("0\n==0ConCise HArdwAre Info0=\nGPU  NODE  0000BUS0\n000007000"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if s, err := parseRocmText(data); err == nil {
			checkAMDSnapshot(t, s)
		}
	})
}
