package sim

import (
	"fmt"
	"io"
	"runtime"
	"time"
)

// published are the allocation rates at 130% arrived workload on the
// default trace, mean of 10 seeds, as Weng et al. (USENIX ATC '23)
// published them.
var published = map[string]float64{
	"random": 87.47, "dotprod": 90.85, "clustering": 91.88, "packing": 92.00, "bestfit": 93.08, "fgd": 95.39,
}

// WriteMarkdown writes experiments as Markdown: a table per pod list with
// every policy (and the published rate where the paper has one), then,
// when several pod lists ran FGD and kiln, one table of kiln against FGD
// per pod list. elapsed, when positive, is reported with the number of
// simulations and the CPUs they ran on.
func WriteMarkdown(w io.Writer, exps []*Experiment, elapsed time.Duration) error {
	ew := &errWriter{w: w}
	sims := 0
	for _, ex := range exps {
		sims += len(ex.Summary) * len(ex.Seeds)
	}
	compare := len(exps) > 1 && hasPolicies(exps, "fgd", "kiln")
	for _, ex := range exps {
		if compare && len(ex.Summary) <= 2 {
			continue
		}
		ew.printf("### %s: %d nodes, %d GPUs, %d tasks, seeds %s\n\n", ex.Trace, ex.Nodes, ex.GPUs, ex.Tasks, seedList(ex.Seeds))
		paper := ex.Trace == "default"
		ew.printf("| policy | alloc@100%% (sd) | alloc@130%% (sd) |")
		if paper {
			ew.printf(" published@130%% |")
		}
		ew.printf(" unallocated@130%% | failed tasks |\n|---|---:|---:|")
		if paper {
			ew.printf("---:|")
		}
		ew.printf("---:|---:|\n")
		for _, s := range ex.Summary {
			ew.printf("| %s | %.2f (%.2f) | %.2f (%.2f) |", s.Policy, s.Alloc100Mean, s.Alloc100SD, s.Alloc130Mean, s.Alloc130SD)
			if paper {
				if p, ok := published[s.Policy]; ok {
					ew.printf(" %.2f |", p)
				} else {
					ew.printf(" |")
				}
			}
			ew.printf(" %.2f | %.0f |\n", 100-s.Alloc130Mean, s.FailedMean)
		}
		ew.printf("\n")
	}
	if compare {
		ew.printf("### kiln against FGD, seeds %s (mean (sd) of allocated GPU capacity, percent)\n\n", seedList(exps[0].Seeds))
		ew.printf("| pod list | FGD @100%% | kiln @100%% | Δ@100%% | FGD @130%% | kiln @130%% | Δ@130%% |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, ex := range exps {
			f, k := find(ex, "fgd"), find(ex, "kiln")
			ew.printf("| %s | %.2f (%.2f) | %.2f (%.2f) | %+.2f | %.2f (%.2f) | %.2f (%.2f) | %+.2f |\n", ex.Trace,
				f.Alloc100Mean, f.Alloc100SD, k.Alloc100Mean, k.Alloc100SD, k.Alloc100Mean-f.Alloc100Mean,
				f.Alloc130Mean, f.Alloc130SD, k.Alloc130Mean, k.Alloc130SD, k.Alloc130Mean-f.Alloc130Mean)
		}
		ew.printf("\n")
	}
	if elapsed > 0 {
		ew.printf("%d simulation(s) in %.1f s on %d CPU(s).\n", sims, elapsed.Seconds(), runtime.GOMAXPROCS(0))
	}
	return ew.err
}

func hasPolicies(exps []*Experiment, names ...string) bool {
	for _, ex := range exps {
		for _, n := range names {
			if find(ex, n) == nil {
				return false
			}
		}
	}
	return true
}

func find(ex *Experiment, policy string) *Summary {
	for i := range ex.Summary {
		if ex.Summary[i].Policy == policy {
			return &ex.Summary[i]
		}
	}
	return nil
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, a ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, a...)
	}
}
