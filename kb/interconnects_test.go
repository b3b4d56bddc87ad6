package kb

import (
	"strings"
	"testing"
)

func TestLinkGBpsUni(t *testing.T) {
	k := Default()
	tests := []struct {
		kind string
		gen  int
		want float64
	}{
		{"nvlink", 1, 20},
		{"nvlink", 2, 25},
		{"nvlink", 3, 25},
		{"nvlink", 4, 25},
		{"nvlink", 5, 50},
		{"xgmi", 2, 46},
		{"xgmi", 3, 50},
		{"xgmi", 4, 64},
		{"nvlink", 9, 0},
		{"xgmi", 1, 0},
		{"pcie", 5, 0},
	}
	for _, tt := range tests {
		if got := k.LinkGBpsUni(tt.kind, tt.gen); got != tt.want {
			t.Errorf("LinkGBpsUni(%q, %d) = %v, want %v", tt.kind, tt.gen, got, tt.want)
		}
	}
}

// The per-GPU totals vendors publish follow from the per-link rows:
// H100 18 x NVLink4 = 450 GB/s per direction, B200 18 x NVLink5 = 900,
// A100 12 x NVLink3 = 300, MI300X 7 x xGMI4 = 448 (896 bidirectional).
func TestInterconnectTotals(t *testing.T) {
	k := Default()
	tests := []struct {
		name  string
		kind  string
		gen   int
		links int
		uni   float64
	}{
		{"H100", "nvlink", 4, 18, 450},
		{"B200", "nvlink", 5, 18, 900},
		{"A100", "nvlink", 3, 12, 300},
		{"V100", "nvlink", 2, 6, 150},
		{"P100", "nvlink", 1, 4, 80},
		{"MI300X", "xgmi", 4, 7, 448},
	}
	for _, tt := range tests {
		if got := float64(tt.links) * k.LinkGBpsUni(tt.kind, tt.gen); got != tt.uni {
			t.Errorf("%s: %d x %s%d = %v GB/s per direction, want %v", tt.name, tt.links, tt.kind, tt.gen, got, tt.uni)
		}
	}
}

func TestInterconnectRows(t *testing.T) {
	k := Default()
	seen := map[string]bool{}
	for _, l := range k.Interconnects {
		key := l.Kind + string(rune('0'+l.Gen))
		if seen[key] {
			t.Errorf("duplicate interconnect row %s gen %d", l.Kind, l.Gen)
		}
		seen[key] = true
		if l.Kind != "nvlink" && l.Kind != "xgmi" {
			t.Errorf("row %s gen %d: kind must be nvlink or xgmi", l.Kind, l.Gen)
		}
		if len(l.Source) < 20 {
			t.Errorf("row %s gen %d: source %q is too short to be checked", l.Kind, l.Gen, l.Source)
		}
		if strings.HasPrefix(l.Source, "derived") && !strings.Contains(l.Source, "=") && !strings.Contains(l.Source, "so ") {
			t.Errorf("row %s gen %d: a derived row must show its arithmetic: %q", l.Kind, l.Gen, l.Source)
		}
	}
}
