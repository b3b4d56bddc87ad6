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
