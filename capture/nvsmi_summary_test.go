package capture

import (
	"strings"
	"testing"
)

func TestNvidiaSMISummaryH100(t *testing.T) {
	s, err := ParseNvidiaSMISummary(nvsmiRead(t, "nvidia-smi-summary/h100x8-550.90.07.txt"))
	if err != nil {
		t.Fatal(err)
	}
	nvsmiInvariants(t, s)
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(s.GPUs))
	}
	if len(s.Sources) != 1 || s.Sources[0].Kind != kindNvsmiSummary || s.Sources[0].Version != "550.90.07" {
		t.Errorf("sources %+v", s.Sources)
	}
	if s.Drivers.NVIDIAUser != "550.90.07" || s.Drivers.CUDADriver != "12.4" {
		t.Errorf("drivers %+v", s.Drivers)
	}
	if s.CollectedAt.IsZero() || s.CollectedAt.Year() != 2025 || s.CollectedAt.Day() != 20 {
		t.Errorf("collected at %v", s.CollectedAt)
	}
	buses := []string{"19", "3b", "4c", "5d", "9b", "bb", "cb", "db"}
	draws := []float64{72, 74, 70, 72, 73, 74, 73, 72}
	for i, g := range s.GPUs {
		if want := "0000:" + buses[i] + ":00.0"; g.PCIAddress != want || g.Index != i {
			t.Errorf("GPU %d: %s index %d, want %s", i, g.PCIAddress, g.Index, want)
		}
		if g.Model != "NVIDIA H100 80GB HBM3" || !nvsmiEqB(g.Persistence, true) || g.PerformanceState != "P0" || g.ComputeMode != "Default" {
			t.Errorf("GPU %s: %q persistence %v %s %q", g.PCIAddress, g.Model, g.Persistence, g.PerformanceState, g.ComputeMode)
		}
		if g.ECC == nil || !nvsmiEqU(g.ECC.VolatileUncorrectable, 0) || g.ECC.Enabled != nil {
			t.Errorf("GPU %s ECC %+v", g.PCIAddress, g.ECC)
		}
		if g.MIG == nil || g.MIG.Enabled {
			t.Errorf("GPU %s MIG %+v", g.PCIAddress, g.MIG)
		}
		if g.Power == nil || !nvsmiEqF(g.Power.DrawW, draws[i]) || !nvsmiEqF(g.Power.LimitW, 700) {
			t.Errorf("GPU %s power %+v", g.PCIAddress, g.Power)
		}
		if g.MemoryTotalBytes != 81559<<20 || g.MemoryUsedBytes != 1<<20 || !nvsmiEqF(g.UtilizationGPU, 0) {
			t.Errorf("GPU %s memory %d/%d util %v", g.PCIAddress, g.MemoryUsedBytes, g.MemoryTotalBytes, g.UtilizationGPU)
		}
		if len(g.Fans) != 0 || g.Processes != 0 {
			t.Errorf("GPU %s fans %+v processes %d", g.PCIAddress, g.Fans, g.Processes)
		}
	}
	if tc := s.GPUs[0].Temperature; tc == nil || !nvsmiEqF(tc.GPUC, 27) {
		t.Errorf("GPU 0 temperature %+v", tc)
	}
	if len(s.Claims) != 0 {
		t.Errorf("the table states no GPU count, got claims %+v", s.Claims)
	}
}

func TestNvidiaSMISummaryFanError(t *testing.T) {
	s, err := ParseNvidiaSMISummary(nvsmiRead(t, "nvidia-smi-summary/geforce-525.125.06-fan-err.txt"))
	if err != nil {
		t.Fatal(err)
	}
	nvsmiInvariants(t, s)
	if len(s.GPUs) != 1 {
		t.Fatalf("%d GPUs, want 1", len(s.GPUs))
	}
	g := s.GPUs[0]
	if g.PCIAddress != "0000:01:00.0" || len(g.Fans) != 1 || g.Fans[0].Error != "ERR!" || g.Fans[0].Percent != nil {
		t.Errorf("GPU %s fans %+v, want one fan in error ERR!", g.PCIAddress, g.Fans)
	}
	if g.ComputeMode != "Exclusive_Process" || !nvsmiEqB(g.Persistence, false) || g.PerformanceState != "P5" {
		t.Errorf("compute %q persistence %v pstate %s", g.ComputeMode, g.Persistence, g.PerformanceState)
	}
	// "NVIDIA GeForce ..." is a cut name: not a model.
	if g.Model != "" {
		t.Errorf("model %q from a cut name", g.Model)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, `"NVIDIA GeForce ..."`) {
		t.Errorf("notes %+v", s.Notes)
	}
	if !nvsmiEqF(g.Power.DrawW, 49) || !nvsmiEqF(g.Power.LimitW, 450) || !nvsmiEqF(g.Temperature.GPUC, 38) ||
		g.MemoryUsedBytes != 2021<<20 || g.MemoryTotalBytes != 23028<<20 {
		t.Errorf("power %+v temp %+v memory %d/%d", g.Power, g.Temperature, g.MemoryUsedBytes, g.MemoryTotalBytes)
	}
	if g.MIG != nil {
		t.Errorf("MIG M. is N/A, got %+v", g.MIG)
	}
	if s.Sources[0].Version != "525.125.06" || s.Drivers.CUDADriver != "12.0" {
		t.Errorf("version %q CUDA %q", s.Sources[0].Version, s.Drivers.CUDADriver)
	}
}

// A table with processes, a WDDM driver model and a MIG-enabled GPU, laid out
// as nvidia-smi 535 prints it.
const summaryWithProcesses = `Tue Jul  2 10:00:00 2024
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.54.03              Driver Version: 535.54.03    CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|
|   0  NVIDIA A100-SXM4-80GB          Off | 00000000:01:00.0 Off |                    0 |
| N/A   27C    P0              67W / 500W |     50MiB / 81920MiB |     N/A      Default |
|                                         |                      |              Enabled |
+-----------------------------------------+----------------------+----------------------+
|   1  NVIDIA GeForce RTX 3080      WDDM  | 00000000:04:00.0  On |                  N/A |
|  0%   31C    P8              22W / 336W |   1128MiB / 10240MiB |      3%      Default |
|                                         |                      |                  N/A |
+-----------------------------------------+----------------------+----------------------+

+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|    1   N/A  N/A       835      G   /usr/lib/Xorg                               550MiB |
|    1   N/A  N/A      1481      G   /usr/bin/gnome-shell                         18MiB |
|    0    3    0      12345      C   python                                       12MiB |
+---------------------------------------------------------------------------------------+
WARNING: infoROM is corrupted at gpu 0000:04:00.0
`

func TestNvidiaSMISummaryProcessesAndModes(t *testing.T) {
	s, err := ParseNvidiaSMISummary([]byte(summaryWithProcesses))
	if err != nil {
		t.Fatal(err)
	}
	nvsmiInvariants(t, s)
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	a, b := s.GPUs[0], s.GPUs[1]
	if a.Processes != 1 || b.Processes != 2 {
		t.Errorf("processes %d %d, want 1 2", a.Processes, b.Processes)
	}
	if a.MIG == nil || !a.MIG.Enabled || a.UtilizationGPU != nil {
		t.Errorf("GPU 0 MIG %+v util %v", a.MIG, a.UtilizationGPU)
	}
	if b.DriverModel != "WDDM" || b.Persistence != nil || b.ECC != nil || !nvsmiEqF(b.UtilizationGPU, 3) || !nvsmiEqF(b.Fans[0].Percent, 0) {
		t.Errorf("GPU 1 dm %q persistence %v ECC %+v util %v fans %+v", b.DriverModel, b.Persistence, b.ECC, b.UtilizationGPU, b.Fans)
	}
	if b.InfoROM == nil || !nvsmiEqB(b.InfoROM.Valid, false) {
		t.Errorf("GPU 1 InfoROM %+v", b.InfoROM)
	}
}

func TestNvidiaSMISummaryErrors(t *testing.T) {
	for name, in := range map[string]string{
		"no header":  "hello\n",
		"no rule":    "| NVIDIA-SMI 535.54.03   Driver Version: 535.54.03 |\n| 0 x Off | 00000000:01:00.0 Off | 0 |\n",
		"bad bus id": "| NVIDIA-SMI 535.54.03   Driver Version: 535.54.03 |\n|===|\n|   0  X  Off  | zz:00.0 Off | 0 |\n",
	} {
		if _, err := ParseNvidiaSMISummary([]byte(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func FuzzNvidiaSMISummary(f *testing.F) {
	for _, p := range nvsmiFiles(f, "nvidia-smi-summary") {
		f.Add(nvsmiRead(f, p))
	}
	f.Add([]byte(summaryWithProcesses))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseNvidiaSMISummary(data)
		if err != nil {
			return
		}
		nvsmiInvariants(t, s)
	})
}
