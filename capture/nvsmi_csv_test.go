package capture

import (
	"testing"

	"kiln.dev/kiln/snapshot"
)

func TestNvidiaSMICSV(t *testing.T) {
	in := "Unable to determine the device handle for GPU 0000:CA:00.0: GPU is lost.  Reboot the system to recover this GPU\n" +
		"index, name, pci.bus_id, driver_version, pstate, pcie.link.gen.max, pcie.link.gen.current, pcie.link.width.current, temperature.gpu, utilization.gpu [%], memory.total [MiB], memory.used [MiB], power.draw [W], clocks_throttle_reasons.sw_power_cap, ecc.errors.uncorrected.volatile.total\n" +
		"0, NVIDIA H100 80GB HBM3, 00000000:19:00.0, 535.129.03, P0, 5, 5, 16, 34, 97 %, 81559 MiB, 70000 MiB, 650.12 W, Active, 0\n" +
		"1, NVIDIA H100 80GB HBM3, 00000000:3B:00.0, 535.129.03, P0, 5, 3, 16, 35, 98 %, 81559 MiB, 70000 MiB, 640.00 W, Not Active, [N/A]\n" +
		"index, name, pci.bus_id, driver_version, pstate, pcie.link.gen.max, pcie.link.gen.current, pcie.link.width.current, temperature.gpu, utilization.gpu [%], memory.total [MiB], memory.used [MiB], power.draw [W], clocks_throttle_reasons.sw_power_cap, ecc.errors.uncorrected.volatile.total\n" +
		"1, NVIDIA H100 80GB HBM3, 00000000:3B:00.0, 535.129.03, P0, 5, 4, 8, 36, 99 %, 81559 MiB, 70000 MiB, 640.00 W, Not Active, 2\n"
	s, err := ParseBytes("smi.csv", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if s.Sources[0].Kind != "nvidia-smi-csv" || len(s.GPUs) != 2 || s.Drivers.NVIDIAUser != "535.129.03" {
		t.Fatalf("kind %s, %d GPUs, driver %q", s.Sources[0].Kind, len(s.GPUs), s.Drivers.NVIDIAUser)
	}
	g0, g1 := s.GPUs[0], s.GPUs[1]
	if g0.PCIAddress != "0000:19:00.0" || g0.MemoryTotalBytes != 81559<<20 || g0.UtilizationGPU == nil || *g0.UtilizationGPU != 97 ||
		g0.Power == nil || g0.Power.DrawW == nil || *g0.Power.DrawW != 650.12 || len(g0.Throttle) != 1 || !g0.Throttle[0].Active {
		t.Errorf("GPU 0 %+v", g0)
	}
	// The second row of GPU 1 (a later sample of -l) wins: x8, 2 errors.
	if g1.PCIe == nil || g1.PCIe.CurrentWidth != 8 || g1.PCIe.CurrentGen != 4 || g1.ECC == nil || g1.ECC.VolatileUncorrectable == nil || *g1.ECC.VolatileUncorrectable != 2 {
		t.Errorf("GPU 1 %+v", g1)
	}
	if len(s.Events) != 1 || s.Events[0].Reason != snapshot.ToolGPULost || s.Events[0].Device != "0000:ca:00.0" {
		t.Errorf("events %+v", s.Events)
	}
	// Without a header the fields are unknown: not read as this format.
	if detectNvsmiCSV("x", []byte("0, NVIDIA H100 80GB HBM3, 00000000:19:00.0, 34\n")) {
		t.Error("headerless CSV detected")
	}
}
