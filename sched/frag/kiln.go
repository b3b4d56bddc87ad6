package frag

import "math"

// Kiln is kiln's default placement policy. It keeps FGD's measure and its
// coarse integer score (PaperScore of the fragmentation reduction) as the
// first key: measured on the Alibaba trace, ranking nodes by the exact
// reduction does worse (about 94.4% of GPUs allocated instead of 95.4%)
// because it scatters tasks over many nearly equal nodes, while the coarse
// score leaves ties that a consistent tie-break packs onto the same nodes.
//
// Among nodes of equal integer score kiln prefers, in this order of weight:
//
//  1. nodes whose CPU per GPU matches the task's, so that CPU-heavy tasks
//     go to CPU-rich nodes and GPU-dense nodes keep CPU for their GPUs
//     (fewer GPUs stranded without CPU); tasks without GPUs prefer the
//     nodes with the most CPU per GPU; multi-GPU tasks skip this key;
//  2. for tasks that accept any GPU model, models that model-constrained
//     tasks need less (Pressure), so constrained tasks still find room.
//
// The remaining ties are left to the caller (the simulator, like the
// authors', takes the node that comes first in a fixed random order).
type Kiln struct {
	Target *Workload
	// Pressure is, per GPU model, the GPU demand of the tasks that accept
	// only some models, spread over the models each accepts by capacity,
	// divided by the model's capacity (see ModelPressure).
	Pressure map[string]float64
}

// NewKiln returns kiln's policy for a target workload and model pressure.
func NewKiln(target *Workload, pressure map[string]float64) *Kiln {
	return &Kiln{Target: target, Pressure: pressure}
}

// ModelPressure computes Kiln.Pressure from the tasks seen and the GPU
// capacity (milli-GPU) of each model.
func ModelPressure(tasks []Task, capacity map[string]int64) map[string]float64 {
	dem := map[string]float64{}
	for _, t := range tasks {
		if !t.WantsGPU() || len(t.Models) == 0 {
			continue
		}
		var acc float64
		for m, c := range capacity {
			if t.Accepts(m) {
				acc += float64(c)
			}
		}
		if acc == 0 {
			continue
		}
		for m, c := range capacity {
			if t.Accepts(m) {
				dem[m] += float64(t.GPUTotal()) * float64(c) / acc
			}
		}
	}
	out := map[string]float64{}
	for m, d := range dem {
		if c := capacity[m]; c > 0 {
			out[m] = d / float64(c)
		}
	}
	return out
}

// Score is kiln's score of node n for task t (higher is better), or -Inf
// when t does not fit. cpuCapacity is the node's CPU capacity in
// milli-cores (used for its CPU per GPU); 0 when unknown.
func (k *Kiln) Score(n Node, cpuCapacity int64, t Task) float64 {
	if !Fits(n, t) {
		return math.Inf(-1)
	}
	return k.score(n, cpuCapacity, t, Score(n, t, k.Target))
}

// GPUs is kiln's GPU choice on node n: FGD's (see ChooseGPUs).
func (k *Kiln) GPUs(n Node, t Task) []int { return ChooseGPUs(n, t, k.Target) }

// ScoreMemo is Score measured with a memo of k.Target: before is
// m.Amount(n). It returns the score and, for a fractional task, the GPU
// to use (-1 otherwise). t must fit on n.
func (k *Kiln) ScoreMemo(m *Memo, n Node, cpuCapacity int64, t Task, before float64) (float64, int) {
	gpu, delta := m.FGD(n, t, before, true)
	return k.score(n, cpuCapacity, t, delta), gpu
}

func (k *Kiln) score(n Node, cpuCapacity int64, t Task, delta float64) float64 {
	primary := float64(PaperScore(delta))
	var second float64
	if g := len(n.Free); g > 0 && cpuCapacity > 0 && t.GPUs <= 1 {
		nodeRatio := float64(cpuCapacity) / float64(g) / 1000 // cores per GPU
		if t.WantsGPU() {
			taskRatio := float64(t.CPU) / float64(t.GPUTotal()) // cores per GPU
			if taskRatio > 0 {
				second = 1 - math.Abs(math.Log(taskRatio/nodeRatio))/5
			} else {
				second = 0.5
			}
		} else {
			second = nodeRatio / 100
		}
	}
	if t.WantsGPU() && len(t.Models) == 0 {
		second -= k.Pressure[n.Model]
	}
	second = math.Min(math.Max(second, 0), 1)
	return primary + 0.999*second
}
