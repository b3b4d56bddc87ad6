package capture

import (
	"strings"
	"testing"
)

// TestNvidiaSMIProcessesRead: "Processes : None" and a process list are
// readings (zero included); "N/A" and a missing section say nothing, in
// nvidia-smi -q and in -q -x.
func TestNvidiaSMIProcessesRead(t *testing.T) {
	const rel = "nvidia-smi-q/a10-vm-535.129.03-remap-pending.txt"
	q := string(nvsmiRead(t, rel))
	if !strings.Contains(q, "    Processes                             : None") {
		t.Fatalf("%s has no 'Processes : None' line", rel)
	}
	for _, tc := range []struct {
		name, text string
		read       bool
	}{
		{"None", q, true},
		{"N/A", strings.Replace(q, "    Processes                             : None", "    Processes                             : N/A", 1), false},
		{"missing", strings.Replace(q, "    Processes                             : None\n", "", 1), false},
	} {
		s, err := ParseNvidiaSMIQ([]byte(tc.text))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if g := s.GPUs[0]; g.ProcessesRead != tc.read || g.Processes != 0 {
			t.Errorf("-q with Processes %s: read %v, %d processes; want read %v", tc.name, g.ProcessesRead, g.Processes, tc.read)
		}
	}
	x := string(nvsmiRead(t, "nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml"))
	for _, tc := range []struct {
		name, text string
		read       bool
	}{
		{"empty", x, true},
		{"N/A", strings.Replace(x, "<processes />", "<processes>N/A</processes>", 1), false},
		{"missing", strings.Replace(x, "<processes />", "", 1), false},
	} {
		s, err := ParseNvidiaSMIXML([]byte(tc.text))
		if err != nil {
			t.Fatalf("xml %s: %v", tc.name, err)
		}
		if g := s.GPUs[0]; g.ProcessesRead != tc.read {
			t.Errorf("-q -x with processes %s: read %v, want %v", tc.name, g.ProcessesRead, tc.read)
		}
	}
}
