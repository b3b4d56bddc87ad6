package capture

import (
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func TestNVLinkSA100(t *testing.T) {
	s, err := ParseNvidiaSMINVLink(lspciReadCapture(t, "nvidia-smi-nvlink/a100-sxm4-80gb-x8-azure-nvlink-s.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(s.GPUs))
	}
	g := s.GPUs[0]
	if g.Index != 0 || g.Model != "NVIDIA A100-SXM4-80GB" || g.UUID != "GPU-5269b708-678a-b1a8-60f0-c90406537486" || g.Vendor != snapshot.VendorNVIDIA {
		t.Errorf("GPU 0 = %+v", g)
	}
	if g := s.GPUs[7]; g.Index != 7 || g.UUID != "GPU-754035b4-4708-efcd-b261-623aea38bcad" {
		t.Errorf("GPU 7 = %+v", g)
	}
	for _, g := range s.GPUs {
		if len(g.NVLinks) != 12 {
			t.Errorf("GPU %d: %d links, want 12", g.Index, len(g.NVLinks))
		}
		for i, l := range g.NVLinks {
			if l != (snapshot.NVLink{Link: i, State: "active", SpeedGBps: 25}) {
				t.Errorf("GPU %d link %d = %+v", g.Index, i, l)
			}
		}
	}
	if len(s.Notes) != 0 {
		t.Errorf("notes %v", s.Notes)
	}
}

func TestNVLinkSStates(t *testing.T) {
	in := "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n" +
		"\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n\t Link 2: <disabled>\n" +
		"GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n" +
		"\t NVML: Unable to retrieve NVLink information as all links are inActive\n"
	if !detectNVLinkS("x", []byte(in)) {
		t.Fatal("not detected")
	}
	s, err := ParseNvidiaSMINVLink([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []snapshot.NVLink{{Link: 0, State: "active", SpeedGBps: 26.562}, {Link: 1, State: "inactive"}, {Link: 2, State: "disabled"}}
	if len(s.GPUs) != 2 || len(s.GPUs[0].NVLinks) != 3 {
		t.Fatalf("GPUs %+v", s.GPUs)
	}
	for i, l := range s.GPUs[0].NVLinks {
		if l != want[i] {
			t.Errorf("link %d = %+v, want %+v", i, l, want[i])
		}
	}
	if len(s.GPUs[1].NVLinks) != 0 || len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, "GPU 1: NVML") {
		t.Errorf("GPU 1 %+v, notes %v", s.GPUs[1], s.Notes)
	}
	// nvidia-smi -L lists GPUs without links: not claimed.
	if detectNVLinkS("x", []byte("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5269b708-678a-b1a8-60f0-c90406537486)\nGPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-a7605225-d684-1f65-4ad4-ee2ab39338b4)\n")) {
		t.Error("nvidia-smi -L claimed")
	}
	for _, bad := range []string{"", "Link 0: 25 GB/s\n", "GPU 0: X (UUID: GPU-1)\n\t Link 0: fast\n", "GPU x: X\n"} {
		if _, err := ParseNvidiaSMINVLink([]byte(bad)); err == nil {
			t.Errorf("ParseNvidiaSMINVLink(%q): no error", bad)
		}
	}
}

func FuzzParseNvidiaSMINVLink(f *testing.F) {
	f.Add(lspciReadCapture(f, "nvidia-smi-nvlink/a100-sxm4-80gb-x8-azure-nvlink-s.txt"))
	f.Add([]byte("GPU 0: NVIDIA H100 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		detectNVLinkS("f", data)
		s, err := ParseNvidiaSMINVLink(data)
		if err != nil {
			return
		}
		for _, g := range s.GPUs {
			if g.Index < 0 {
				t.Fatalf("GPU index %d", g.Index)
			}
			for _, l := range g.NVLinks {
				if l.Link < 0 || l.SpeedGBps < 0 || (l.State != "active" && l.State != "inactive" && l.State != "disabled") {
					t.Fatalf("link %+v", l)
				}
			}
		}
	})
}
