package plan

import (
	"fmt"
	"strings"
)

// explain says why the first of ranked (fastest first) wins, what the
// runner-up costs, and what the usual folklore layouts (FSDP everywhere,
// plain DDP) would cost where they fit.
func explain(j Job, c *Cluster, ranked []Estimate) []string {
	if len(ranked) == 0 {
		return nil
	}
	best := ranked[0]
	var out []string
	out = append(out, whyBest(j, c, best))
	if len(ranked) > 1 {
		out = append(out, "Runner-up "+compare(best, ranked[1]))
	}
	if j.Mode == ModeTrain && c.GPUs() > 1 {
		named := map[string]bool{best.LayoutString: true}
		if len(ranked) > 1 {
			named[ranked[1].LayoutString] = true
		}
		alts := []struct {
			label string
			match func(Layout) bool
		}{
			{"FSDP full shard over all GPUs", func(l Layout) bool { return l.Zero == 3 && !l.Hybrid && l.TP == 1 && l.PP == 1 }},
			{"Plain DDP", func(l Layout) bool { return l.Zero == 0 && l.TP == 1 && l.PP == 1 }},
		}
		for _, a := range alts {
			for _, e := range ranked {
				if !a.match(e.Layout) {
					continue
				}
				if !named[e.LayoutString] {
					out = append(out, a.label+" "+compare(best, e))
					named[e.LayoutString] = true
				}
				break
			}
		}
	}
	return out
}

func whyBest(j Job, c *Cluster, e Estimate) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Best %s: %s tokens/s, MFU %.0f%%, %s of %s per GPU.",
		e.LayoutString, humanRate(e.TokensPerS), 100*e.MFU, gbString(e.MemoryPerGPUBytes), gbString(e.MemoryCapacityBytes))
	l := e.Layout
	if l.TP > 1 {
		fmt.Fprintf(&b, " Tensor parallelism (tp=%d) runs over %s", l.TP, e.Breakdown.TPLink)
		if strings.Contains(e.Breakdown.TPLink, "network") {
			b.WriteString(", across nodes")
		}
		b.WriteString(".")
	} else if c.GPUs() > 1 {
		b.WriteString(" No tensor parallelism: every GPU holds whole layers.")
	}
	if j.Mode == ModeTrain && l.DP > 1 {
		fmt.Fprintf(&b, " %s data parallelism (dp=%d) over %s.", l.Sharding(), l.DP, e.Breakdown.DPLink)
	}
	parts := parts(e.Breakdown)
	if len(parts) > 0 {
		fmt.Fprintf(&b, " Step %s: ", FormatSeconds(e.StepTimeS))
		var ws []string
		for _, p := range parts {
			if p.s/e.StepTimeS < 0.01 {
				continue
			}
			ws = append(ws, fmt.Sprintf("%s %.0f%%", p.name, 100*p.s/e.StepTimeS))
		}
		b.WriteString(strings.Join(ws, ", ") + ".")
	}
	return b.String()
}

type part struct {
	name, phrase string
	s            float64
}

func parts(bd Breakdown) []part {
	return []part{
		{"compute", "more compute", bd.ComputeS},
		{"recomputation", "recomputing activations", bd.RecomputeS},
		{"pipeline bubble", "a larger pipeline bubble", bd.BubbleS},
		{"tensor-parallel communication", "tensor-parallel collectives over " + bd.TPLink, bd.TPCommS},
		{"pipeline communication", "pipeline sends over " + bd.PPLink, bd.PPCommS},
		{"data-parallel communication", "data-parallel traffic over " + bd.DPLink, bd.DPCommS},
		{"optimizer", "a longer optimizer step", bd.OptimizerS},
		{"decode", "memory-bound token generation", bd.DecodeS},
	}
}

// compare says how much slower other is than best, and which part of the
// step makes the difference.
func compare(best, other Estimate) string {
	slower := best.TokensPerS/other.TokensPerS - 1
	var b strings.Builder
	fmt.Fprintf(&b, "%s", other.LayoutString)
	if slower < 0.005 {
		b.WriteString(" is as fast (within 0.5%)")
	} else {
		fmt.Fprintf(&b, " is %.0f%% slower (%s tokens/s)", 100*slower, humanRate(other.TokensPerS))
	}
	// Put the other layout's parts on the best one's batch.
	scale := float64(best.GlobalBatch) / float64(max(other.GlobalBatch, 1))
	bp, op := parts(best.Breakdown), parts(other.Breakdown)
	worst, worstD := -1, 0.0
	for i := range bp {
		d := op[i].s*scale - bp[i].s
		if d > worstD {
			worst, worstD = i, d
		}
	}
	if slower >= 0.005 && worst >= 0 {
		fmt.Fprintf(&b, ": %s adds %s (%.0f%%) to the step", op[worst].phrase, FormatSeconds(worstD), 100*worstD/best.StepTimeS)
		if worst == 5 && other.Layout.Zero >= 1 {
			fmt.Fprintf(&b, " (%s)", other.Sharding)
		}
	}
	if d := best.MemoryPerGPUBytes - other.MemoryPerGPUBytes; d > 1e9 {
		fmt.Fprintf(&b, "; it needs %s less memory per GPU", gbString(d))
	}
	return b.String() + "."
}

func gbString(bytes float64) string { return fmt.Sprintf("%.1f GB", bytes/1e9) }

// FormatSeconds writes a duration in seconds with the unit that reads best
// (s, ms or µs).
func FormatSeconds(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.1f ms", s*1e3)
	}
	return fmt.Sprintf("%.0f µs", s*1e6)
}

func humanRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e4:
		return fmt.Sprintf("%.0fk", r/1e3)
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.1f", r)
}
