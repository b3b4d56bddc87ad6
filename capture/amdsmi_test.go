package capture

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const amdDir = "../testdata/amd-smi/"

func TestAMDSMIStaticJSON(t *testing.T) {
	s := parseFile(t, amdDir+"static-mi300x-x2.json")
	if s.Sources[0].Kind != "amd-smi" || len(s.GPUs) != 2 || s.Drivers.AMDGPU != "6.8.5" {
		t.Fatalf("kind %s, %d GPUs, driver %q", s.Sources[0].Kind, len(s.GPUs), s.Drivers.AMDGPU)
	}
	g := gpuAt(t, s, "0000:05:00.0")
	if g.Model != "AMD Instinct MI300X" || g.DeviceID != "74a1" || g.GFXTarget != "gfx942" ||
		g.UniqueID != "0xe3aa140f9a5f9e31" || g.Serial != "692351000001" || g.VBIOS != "022.040.003.042.000001" ||
		g.MemoryTotalBytes != 196592<<20 || g.BoardPart != "102-G30211-00" {
		t.Errorf("05:00.0 = %+v", g)
	}
	if g.NUMANode == nil || *g.NUMANode != 0 {
		t.Errorf("05:00.0 NUMA %v, want 0", g.NUMANode)
	}
	if g.PCIe == nil || g.PCIe.MaxGen != 5 || g.PCIe.MaxWidth != 16 || g.PCIe.CurrentGen != 0 {
		t.Errorf("05:00.0 PCIe %+v, want max Gen5 x16, current unknown", g.PCIe)
	}
	if g.Partition == nil || g.Partition.Compute != "SPX" || g.Partition.Memory != "NPS1" || g.Partition.Count != 1 {
		t.Errorf("05:00.0 partition %+v", g.Partition)
	}
	if f(g.Power.LimitW) != 750 || f(g.Temperature.SlowdownC) != 100 || f(g.Temperature.ShutdownC) != 110 ||
		f(g.Temperature.MemMaxC) != 105 {
		t.Errorf("05:00.0 limits %+v %+v", g.Power, g.Temperature)
	}
	g = gpuAt(t, s, "0000:27:00.0")
	if g.NUMANode != nil || g.Power != nil || g.VBIOS != "022.040.003.041.000001" {
		t.Errorf("27:00.0: NUMA %v (affinity -1) power %+v vbios %q", g.NUMANode, g.Power, g.VBIOS)
	}
}

func TestAMDSMIListAndMetricJSON(t *testing.T) {
	s := parseFile(t, amdDir+"list-metric-mi300x-x2.json")
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	g := gpuAt(t, s, "0000:05:00.0")
	if g.UUID != "d7ff74a1-0000-1000-80e3-aa140f9a5f9e" || len(g.KFDNodes) != 1 || g.KFDNodes[0] != 2 ||
		f(g.UtilizationGPU) != 97 || f(g.Power.DrawW) != 612 || f(g.Temperature.JunctionC) != 71 ||
		f(g.Temperature.MemoryC) != 58 || g.Temperature.EdgeC != nil || g.PerfLevel != "auto" ||
		g.MemoryUsedBytes != 150213<<20 || g.MemoryTotalBytes != 196592<<20 || g.Partition != nil || g.Fans != nil {
		t.Errorf("05:00.0 = %+v", g)
	}
	if g.PCIe.CurrentGen != 5 || g.PCIe.CurrentWidth != 16 || *g.PCIe.Replays != 12 {
		t.Errorf("05:00.0 PCIe %+v", g.PCIe)
	}
	g = gpuAt(t, s, "0000:27:00.0")
	if g.PCIe.CurrentGen != 4 || g.MemoryVisibleBytes != 0 {
		t.Errorf("27:00.0 = PCIe %+v visible %d", g.PCIe, g.MemoryVisibleBytes)
	}
}

func TestAMDSMIStaticText(t *testing.T) {
	s := parseFile(t, amdDir+"static-mi300a.txt")
	if s.Sources[0].Kind != "amd-smi" || len(s.GPUs) != 1 {
		t.Fatalf("kind %s, %d GPUs", s.Sources[0].Kind, len(s.GPUs))
	}
	if s.Drivers.ROCm != "6.2.1" || s.Drivers.AMDGPU != "6.8.5" {
		t.Errorf("drivers %+v", s.Drivers)
	}
	g := s.GPUs[0]
	if g.PCIAddress != "0000:02:00.0" || g.Model != "AMD Instinct MI300A" || g.DeviceID != "74a0" ||
		g.GFXTarget != "gfx942" || g.MemoryTotalBytes != 96434<<20 || g.VBIOS != "" || g.Serial != "" {
		t.Errorf("GPU = %+v", g)
	}
	if g.NUMANode != nil {
		t.Errorf("NUMA %d from AFFINITY NONE", *g.NUMANode)
	}
	if g.Partition == nil || g.Partition.Compute != "TPX" || g.Partition.Memory != "NPS1" || g.Partition.Count != 0 {
		t.Errorf("partition %+v", g.Partition)
	}
	if g.PCIe.MaxGen != 5 || g.PCIe.MaxWidth != 16 || f(g.Power.MaxLimitW) != 550 || f(g.Temperature.ShutdownC) != 110 {
		t.Errorf("PCIe %+v power %+v temp %+v", g.PCIe, g.Power, g.Temperature)
	}
}

func TestAMDSMIPartitionsGrouped(t *testing.T) {
	data := `{"gpu_data": [
{"gpu": 0, "bus": {"bdf": "0000:05:00.0"}, "partition": {"accelerator_partition": "CPX", "memory_partition": "NPS1", "partition_id": 0}},
{"gpu": 1, "bus": {"bdf": "0000:05:00.1"}, "partition": {"accelerator_partition": "CPX", "memory_partition": "NPS1", "partition_id": 1}},
{"gpu": 2, "bus": {"bdf": "0000:05:00.2"}, "partition": {"accelerator_partition": "CPX", "memory_partition": "NPS1", "partition_id": 2}},
{"gpu": 3, "bus": {"bdf": "0000:27:00.0"}, "partition": {"accelerator_partition": "CPX", "memory_partition": "NPS1", "partition_id": 0}}
]}`
	s, err := ParseBytes("static.json", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs, want 2 physical", len(s.GPUs))
	}
	if p := s.GPUs[0].Partition; s.GPUs[0].PCIAddress != "0000:05:00.0" || p.Count != 3 || p.Compute != "CPX" {
		t.Errorf("GPU0 %s %+v", s.GPUs[0].PCIAddress, p)
	}
	if p := s.GPUs[1].Partition; p.Count != 0 {
		t.Errorf("GPU1 partition %+v: one CPX entry, count unknown", p)
	}
}

// TestAMDDetectExclusive checks that every capture in testdata is claimed by
// the AMD importers only when it is AMD's, and each by the right one.
func TestAMDDetectExclusive(t *testing.T) {
	want := map[string]string{"rocm-smi": "rocm-smi", "amd-smi": "amd-smi"}
	for _, root := range []string{"../testdata/captures", "../testdata/amd-smi"} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.HasSuffix(p, ".md") || strings.HasSuffix(p, ".json") && strings.HasSuffix(p, "expected.json") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			kind := want[filepath.Base(filepath.Dir(p))]
			rocm := rocmIsJSON(b) || rocmIsText(b)
			amd := amdIsJSON(b) || amdIsText(b)
			if rocm != (kind == "rocm-smi") || amd != (kind == "amd-smi") {
				t.Errorf("%s: rocm-smi detect %v, amd-smi detect %v", p, rocm, amd)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestAMDCapturesMerge(t *testing.T) {
	s, err := Load(context.Background(), amdDir+"static-mi300x-x2.json", amdDir+"list-metric-mi300x-x2.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs after merge, want 2", len(s.GPUs))
	}
	g := gpuAt(t, s, "0000:05:00.0")
	if g.Model != "AMD Instinct MI300X" || f(g.UtilizationGPU) != 97 || g.PCIe.MaxGen != 5 || g.PCIe.CurrentGen != 5 {
		t.Errorf("merged 05:00.0 = %+v", g)
	}
}

func TestAMDSMIMetricWithoutBDFJoinsStatic(t *testing.T) {
	dir := t.TempDir()
	metric := filepath.Join(dir, "metric.json")
	if err := os.WriteFile(metric, []byte(`[{"gpu": 1, "usage": {"gfx_activity": {"value": 55, "unit": "%"}}}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Load(context.Background(), amdDir+"static-mi300x-x2.json", metric)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 2 || f(gpuAt(t, s, "0000:27:00.0").UtilizationGPU) != 55 {
		t.Errorf("GPUs %+v", s.GPUs)
	}
}
