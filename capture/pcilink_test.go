package capture

import "testing"

func TestPCIeGenFromGTps(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"2.5GT/s", 1}, {"5GT/s", 2}, {"5.0 GT/s PCIe", 2}, {"8GT/s", 3}, {"16.0 GT/s", 4},
		{"32GT/s", 5}, {"64GT/s", 6}, {"128GT/s", 7}, {"unknown", 0}, {"", 0}, {"1.2.3GT/s", 0},
	} {
		if got := pcieGenFromGTps(c.in); got != c.want {
			t.Errorf("pcieGenFromGTps(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestLnkSpeedWidth(t *testing.T) {
	for _, c := range []struct {
		in        string
		gen, wide int
	}{
		{"\tPort #0, Speed 32GT/s, Width x4, ASPM L0s L1, Exit Latency L0s <4us, L1 <32us", 5, 4},
		{"\tSpeed 16GT/s (downgraded), Width x4 (ok)", 4, 4},
		{"\tSpeed 5GT/s (downgraded), Width x1 (ok)", 2, 1},
		{"Speed 2.5GT/s, Width x16", 1, 16},
		{"Speed unknown (downgraded), Width x0 (downgraded)", 0, 0},
		{"Port #12", 0, 0},
	} {
		g, w := lnkSpeedWidth(c.in)
		if g != c.gen || w != c.wide {
			t.Errorf("lnkSpeedWidth(%q) = %d, x%d; want %d, x%d", c.in, g, w, c.gen, c.wide)
		}
	}
}
