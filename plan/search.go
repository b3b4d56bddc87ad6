package plan

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Result is the answer to a plan request: the best layouts that fit, or
// why none does.
type Result struct {
	Model    string     `json:"model"`
	Mode     string     `json:"mode"`
	Hardware string     `json:"hardware"`
	GPUs     int        `json:"gpus"`
	Job      Job        `json:"job"`
	Searched int        `json:"layouts_searched"`
	Feasible int        `json:"layouts_that_fit"`
	Best     []Estimate `json:"best"`
	// Explanation says in words why the best layout wins and what the
	// runner-up and the common alternatives would cost.
	Explanation []string `json:"explanation,omitempty"`
	// Infeasible is set when no layout fits: what it would take.
	Infeasible string   `json:"infeasible,omitempty"`
	Notes      []string `json:"notes,omitempty"`
}

// SearchOptions bound the search.
type SearchOptions struct {
	// Top is how many layouts to keep (default 5).
	Top int
}

// Candidates lists the layouts a search considers for the cluster: every
// DP x TP x PP that uses all GPUs (TP a power of two dividing the heads,
// PP no more than the layers), ZeRO stages 0-3 and FSDP hybrid sharding
// (stages 2 and 3 only without pipelining, as DeepSpeed allows),
// interleaved pipeline schedules of 1, 2 or 4 virtual stages,
// micro-batches of 1 to 16 and the three recomputation strategies.
// Serving layouts vary only DP x TP x PP.
func Candidates(j Job, c *Cluster) []Layout {
	n := c.GPUs()
	var out []Layout
	for tp := 1; tp <= n; tp *= 2 {
		if n%tp != 0 || j.Model.Heads%tp != 0 {
			continue
		}
		for pp := 1; pp <= n/tp; pp++ {
			if (n/tp)%pp != 0 || pp > j.Model.blocks() {
				continue
			}
			dp := n / (tp * pp)
			base := Layout{DP: dp, TP: tp, PP: pp, VP: 1, MicroBatch: 1, Recompute: RecomputeNone, SequenceParallel: true}
			if j.Mode == ModeInfer {
				out = append(out, base)
				continue
			}
			perRank := int(math.Ceil(float64(j.GlobalBatch) / float64(dp)))
			for _, vp := range vpChoices(j.Model.blocks(), pp) {
				for _, z := range zeroChoices(c, dp, pp, tp) {
					for mb := 1; mb <= 16 && mb <= perRank; mb *= 2 {
						for _, rc := range []string{RecomputeNone, RecomputeSelective, RecomputeFull} {
							l := base
							l.VP, l.Zero, l.Hybrid, l.MicroBatch, l.Recompute = vp, z.stage, z.hybrid, mb, rc
							out = append(out, l)
						}
					}
				}
			}
		}
	}
	return out
}

// vpChoices are the interleaving degrees tried: 1, and 2 and 4 when every
// virtual stage still gets at least two layers.
func vpChoices(blocks, pp int) []int {
	vs := []int{1}
	if pp == 1 {
		return vs
	}
	for _, v := range []int{2, 4} {
		if blocks >= 2*pp*v {
			vs = append(vs, v)
		}
	}
	return vs
}

type zeroChoice struct {
	stage  int
	hybrid bool
}

func zeroChoices(c *Cluster, dp, pp, tp int) []zeroChoice {
	if dp == 1 {
		return []zeroChoice{{0, false}}
	}
	zs := []zeroChoice{{0, false}, {1, false}}
	if pp == 1 {
		zs = append(zs, zeroChoice{2, false}, zeroChoice{3, false})
		if tp*dp > c.GPUsPerNode && c.GPUsPerNode/tp > 1 {
			zs = append(zs, zeroChoice{3, true})
		}
	}
	return zs
}

// Search evaluates every candidate layout and returns the fastest that fit.
func Search(j Job, c *Cluster, opt SearchOptions) (*Result, error) {
	j, err := j.Normalize()
	if err != nil {
		return nil, err
	}
	if c == nil || c.GPUs() <= 0 {
		return nil, errors.New("no GPUs to plan for")
	}
	if opt.Top <= 0 {
		opt.Top = 5
	}
	res := &Result{Model: j.Model.Name, Mode: j.Mode, Hardware: c.Source, GPUs: c.GPUs(), Job: j}
	res.Notes = append(res.Notes, c.Notes...)
	res.Notes = append(res.Notes, jobNotes(j, c)...)
	cands := Candidates(j, c)
	res.Searched = len(cands)
	fits := make([]Estimate, 0, 64)
	for _, l := range cands {
		var e Estimate
		if j.Mode == ModeInfer {
			e = evalInfer(j, c, l)
		} else {
			e = evalTrain(j, c, l)
		}
		if e.Fits {
			fits = append(fits, e)
		}
	}
	res.Feasible = len(fits)
	if len(fits) == 0 {
		res.Infeasible = infeasible(j, c)
		return res, nil
	}
	slices.SortStableFunc(fits, func(a, b Estimate) int {
		switch {
		case a.TokensPerS > b.TokensPerS*(1+1e-9):
			return -1
		case b.TokensPerS > a.TokensPerS*(1+1e-9):
			return 1
		}
		return cmpFloat(a.MemoryPerGPUBytes, b.MemoryPerGPUBytes)
	})
	res.Best = fits[:min(opt.Top, len(fits))]
	res.Explanation = explain(j, c, fits)
	return res, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func jobNotes(j Job, c *Cluster) []string {
	var notes []string
	if _, p := c.GPU.Peak(j.Precision); p != j.Precision {
		notes = append(notes, fmt.Sprintf("%s has no %s tensor path; timed at its %s rate", c.GPU.Name, j.Precision, p))
	}
	if j.Model.Experts > 1 {
		notes = append(notes, "mixture of experts: experts are split by tensor parallelism like a dense MLP; expert parallelism and its all-to-all are not modelled")
	}
	if j.Mode == ModeInfer && j.Model.MaxSeq > 0 && j.Seq+j.GenTokens > j.Model.MaxSeq {
		notes = append(notes, fmt.Sprintf("prompt and generation (%d tokens) exceed the model's context of %d", j.Seq+j.GenTokens, j.Model.MaxSeq))
	}
	return notes
}

// infeasible says how many GPUs of this kind the job needs at the least,
// and the fastest layout that fits on that many.
func infeasible(j Job, c *Cluster) string {
	gb := c.MemoryBytes / 1e9
	have := c.GPUs()
	for k := 1; k*c.GPUsPerNode <= 1<<16; {
		n := k * c.GPUsPerNode
		if n > have {
			trial := *c
			trial.Nodes = k
			if trial.NetworkGBps <= 0 {
				trial.NetworkGBps = 50 // memory does not depend on it
			}
			if l, ok := leanest(j, &trial); ok {
				return fmt.Sprintf("%s %s needs at least %d x %.0f GB GPUs (then with %s); you have %d",
					j.Model.Name, modeWord(j.Mode), n, gb, leanWords(j, l), have)
			}
		}
		if k < 256 {
			k++
		} else {
			k *= 2
		}
	}
	return fmt.Sprintf("%s %s does not fit on any number of %.0f GB GPUs kiln tried (up to 65536)", j.Model.Name, modeWord(j.Mode), gb)
}

func modeWord(mode string) string {
	if mode == ModeInfer {
		return "serving"
	}
	return "training"
}

func leanWords(j Job, l Layout) string {
	if j.Mode == ModeInfer {
		return fmt.Sprintf("tp=%d, pp=%d", l.TP, l.PP)
	}
	w := l.Sharding()
	if l.TP > 1 || l.PP > 1 {
		w += fmt.Sprintf(", tp=%d, pp=%d", l.TP, l.PP)
	}
	return w + fmt.Sprintf(", %s recomputation, micro-batch %d", l.Recompute, l.MicroBatch)
}

// leanest finds the fastest layout that fits on c, if any does.
func leanest(j Job, c *Cluster) (Layout, bool) {
	var best Layout
	bestRate := -1.0
	for _, l := range Candidates(j, c) {
		var e Estimate
		if j.Mode == ModeInfer {
			e = evalInfer(j, c, l)
		} else {
			e = evalTrain(j, c, l)
		}
		if e.Fits && e.TokensPerS > bestRate {
			best, bestRate = l, e.TokensPerS
		}
	}
	return best, bestRate >= 0
}
