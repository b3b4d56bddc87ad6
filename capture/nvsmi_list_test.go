package capture

import (
	"strings"
	"testing"
)

func TestNvidiaSMIList(t *testing.T) {
	in := "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-6b3c4a2e-0f0e-3c2d-8f1a-1b2c3d4e5f60)\n" +
		"  MIG 3g.40gb     Device  0: (UUID: MIG-5c3d2a1b-0a0b-5c6d-9e8f-7a6b5c4d3e2f)\n" +
		"  MIG 3g.40gb     Device  1: (UUID: MIG-1a2b3c4d-5e6f-5a7b-8c9d-0e1f2a3b4c5d)\n" +
		"GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5e)\n" +
		"Unable to determine the device handle for GPU 0000:ca:00.0: Unknown Error\n"
	if !detectNvsmiList("x", []byte(in)) {
		t.Fatal("not detected")
	}
	s, err := ParseBytes("x", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if s.Sources[0].Kind != "nvidia-smi-list" || len(s.GPUs) != 2 || s.GPUs[0].UUID != "GPU-6b3c4a2e-0f0e-3c2d-8f1a-1b2c3d4e5f60" ||
		s.GPUs[0].MIG == nil || !s.GPUs[0].MIG.Enabled || s.GPUs[1].MIG != nil {
		t.Fatalf("snapshot %+v", s.GPUs)
	}
	if len(s.Events) != 1 || s.Events[0].Device != "0000:ca:00.0" {
		t.Errorf("the dead GPU's line: events %+v", s.Events)
	}
	if len(s.Notes) == 0 || !strings.Contains(s.Notes[0].Message, "2 MIG devices: 3g.40gb, 3g.40gb") {
		t.Errorf("notes %+v", s.Notes)
	}
	// nvlink -s starts the same way; each detector keeps to its own.
	nvlink := "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-6b3c4a2e-0f0e-3c2d-8f1a-1b2c3d4e5f60)\n\t Link 0: 25 GB/s\n"
	if detectNvsmiList("x", []byte(nvlink)) || detectNVLinkS("x", []byte(in)) {
		t.Error("nvidia-smi -L and nvlink -s detectors overlap")
	}
}
