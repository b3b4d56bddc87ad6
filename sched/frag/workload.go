package frag

import (
	"cmp"
	"slices"
	"strings"
)

// Shape is one task shape of a target workload and its popularity.
type Shape struct {
	Task
	// Weight is the shape's share of the workload; the weights of a
	// Workload add up to 1.
	Weight float64
}

// Workload is the target workload M the fragmentation is measured against.
type Workload struct {
	Shapes []Shape
}

// NewWorkload returns a workload of the given shapes with their weights
// normalised to add up to 1. Shapes with a weight <= 0 are left out.
func NewWorkload(shapes []Shape) *Workload {
	var sum float64
	out := make([]Shape, 0, len(shapes))
	for _, s := range shapes {
		if s.Weight > 0 {
			sum += s.Weight
			out = append(out, s)
		}
	}
	for i := range out {
		out[i].Weight /= sum
	}
	return &Workload{Shapes: out}
}

// Weighting says how much each task counts when the popularity of shapes
// is measured.
type Weighting int

const (
	// ByCount counts every task once (the paper's choice).
	ByCount Weighting = iota
	// ByGPU counts every task by its GPU request in whole GPUs, with
	// GPU-less tasks counted as one GPU-less task each.
	ByGPU
)

// shapeKey is what makes two tasks the same shape: memory does not count,
// as in the paper.
type shapeKey struct {
	cpu    int64
	gpus   int
	milli  int32
	models string
}

// TargetWorkload builds the paper's target workload from the tasks seen:
// the most popular shapes (CPU, GPU count, GPU share, accepted models) that
// together cover at least coverage (e.g. 0.95) of the tasks, with their
// popularity renormalised over the shapes kept. Ties in popularity are
// broken by the larger shape first, so the result does not depend on the
// order of tasks.
func TargetWorkload(tasks []Task, coverage float64, weigh Weighting) *Workload {
	count := map[shapeKey]float64{}
	first := map[shapeKey]Task{}
	var total float64
	for _, t := range tasks {
		k := keyOf(t)
		w := 1.0
		if weigh == ByGPU && t.WantsGPU() {
			w = float64(t.GPUTotal()) / MilliPerGPU
		}
		if _, ok := first[k]; !ok {
			first[k] = Task{CPU: t.CPU, GPUs: t.GPUs, GPUMilli: t.GPUMilli, Models: t.Models}
		}
		count[k] += w
		total += w
	}
	keys := make([]shapeKey, 0, len(count))
	for k := range count {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b shapeKey) int {
		if c := cmp.Compare(count[b], count[a]); c != 0 {
			return c
		}
		// Larger shape first on ties.
		if c := cmp.Compare(b.cpu, a.cpu); c != 0 {
			return c
		}
		if c := cmp.Compare(b.milli, a.milli); c != 0 {
			return c
		}
		if c := cmp.Compare(b.gpus, a.gpus); c != 0 {
			return c
		}
		return cmp.Compare(b.models, a.models)
	})
	var cum float64
	var shapes []Shape
	for _, k := range keys {
		if cum >= coverage*total && len(shapes) > 0 {
			break
		}
		cum += count[k]
		shapes = append(shapes, Shape{Task: first[k], Weight: count[k]})
	}
	return NewWorkload(shapes)
}

func keyOf(t Task) shapeKey {
	k := shapeKey{cpu: t.CPU, gpus: t.GPUs, milli: t.GPUMilli}
	if !t.WantsGPU() {
		k.gpus, k.milli = 0, 0
	}
	if len(t.Models) > 0 {
		k.models = strings.Join(t.Models, "|")
	}
	return k
}

// Amount is the fragmentation F_n(M) of node n against workload w, in
// milli-GPU: the expected free GPU capacity of n that a task drawn from w
// cannot use.
func (w *Workload) Amount(n Node) float64 {
	total := n.FreeGPU()
	if total == 0 {
		return 0
	}
	var f float64
	for i := range w.Shapes {
		s := &w.Shapes[i]
		if !s.WantsGPU() || n.CPU < s.CPU || n.Memory < s.Memory || !s.Accepts(n.Model) {
			f += s.Weight * float64(total)
			continue
		}
		fit := 0
		var below int64
		for _, g := range n.Free {
			if g >= s.GPUMilli {
				fit++
			} else {
				below += int64(g)
			}
		}
		if fit < s.GPUs {
			f += s.Weight * float64(total)
			continue
		}
		f += s.Weight * float64(below)
	}
	return f
}

// Ratio is the cluster's fragmentation rate: the fragment share of the free
// GPU capacity of the nodes, in [0, 1] (0 when nothing is free).
func (w *Workload) Ratio(nodes []Node) float64 {
	var frag, free float64
	for _, n := range nodes {
		frag += w.Amount(n)
		free += float64(n.FreeGPU())
	}
	if free == 0 {
		return 0
	}
	return frag / free
}

// Waste is kiln's finer measure of node n against w, in milli-GPU: for each
// shape, the free GPU capacity that would stay unused if the node were
// filled with tasks of that shape only, as many as its free GPUs and free
// CPU allow; weighted by popularity. Where Amount calls a GPU with 940
// milli free fully usable by a 470-milli task, Waste counts the 60 milli
// that two such tasks leave, and it counts the GPUs that run out of CPU
// before they run out of tasks.
func (w *Workload) Waste(n Node) float64 {
	total := n.FreeGPU()
	if total == 0 {
		return 0
	}
	var f float64
	for i := range w.Shapes {
		s := &w.Shapes[i]
		if !s.WantsGPU() || !s.Accepts(n.Model) || n.CPU < s.CPU || n.Memory < s.Memory {
			f += s.Weight * float64(total)
			continue
		}
		var slots int64
		if s.Sharing() {
			for _, g := range n.Free {
				slots += int64(g / s.GPUMilli)
			}
		} else {
			slots = int64(gpusWith(n.Free, s.GPUMilli) / s.GPUs)
		}
		if s.CPU > 0 {
			slots = min(slots, n.CPU/s.CPU)
		}
		f += s.Weight * float64(total-slots*s.GPUTotal())
	}
	return f
}
