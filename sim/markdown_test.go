package sim

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWriteMarkdown(t *testing.T) {
	mk := func(trace string, pols ...string) *Experiment {
		ex := &Experiment{Trace: trace, Nodes: 3, GPUs: 24, Tasks: 10, Seeds: []int64{42, 43, 44}}
		for i, p := range pols {
			ex.Summary = append(ex.Summary, Summary{Policy: p, Alloc100Mean: 90 + float64(i), Alloc100SD: 0.1, Alloc130Mean: 91 + float64(i), Alloc130SD: 0.2, FailedMean: 7})
		}
		return ex
	}
	var b bytes.Buffer
	if err := WriteMarkdown(&b, []*Experiment{mk("default", "bestfit", "fgd", "kiln")}, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"### default: 3 nodes, 24 GPUs, 10 tasks, seeds 42-44",
		"| fgd | 91.00 (0.10) | 92.00 (0.20) | 95.39 | 8.00 | 7 |",
		"| kiln | 92.00 (0.10) | 93.00 (0.20) | | 7.00 | 7 |",
		"9 simulation(s) in 1.5 s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := WriteMarkdown(&b, []*Experiment{mk("default", "fgd", "kiln"), mk("multigpu40", "fgd", "kiln")}, 0); err != nil {
		t.Fatal(err)
	}
	out = b.String()
	if strings.Contains(out, "### default:") || !strings.Contains(out, "| multigpu40 | 90.00 (0.10) | 91.00 (0.10) | +1.00 | 91.00 (0.20) | 92.00 (0.20) | +1.00 |") || strings.Contains(out, "simulation(s)") {
		t.Errorf("comparison:\n%s", out)
	}
	if err := WriteMarkdown(failWriter{}, []*Experiment{mk("default", "fgd")}, 0); err == nil {
		t.Error("write error lost")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }
