package frag

import (
	"math"
	"slices"
)

// Kiln is kiln's default placement policy. It ranks nodes by FGD's coarse
// integer score (PaperScore) of a fragmentation reduction, as the paper's
// scheduler does, and breaks the many ties by keys FGD does not have.
// Measured on the Alibaba trace, ranking by the exact reduction does worse
// (about 94.4% of GPUs allocated instead of 95.4%): it scatters tasks over
// many nearly equal nodes, while the coarse score leaves ties that a
// consistent tie-break packs onto the same nodes.
//
// What kiln changes, each measured on the trace and its variants:
//
//   - The target workload (KilnTarget) carries each shape's host memory, so
//     GPUs on nodes whose memory is spent count as fragment, and it adds
//     the shapes that fit on only a small part of the cluster (an 8-GPU
//     task with 120 cores fits only the 128-core nodes), so that other
//     tasks leave those nodes whole.
//   - A fractional task whose tightest GPU on the node would keep less
//     than CloseBelow free closes that GPU: such placements come first,
//     tightest first, because the remainder is lost to every request.
//   - The fragmentation reduction of a fractional placement is lowered by
//     DeadWeight times the GPU capacity it leaves that no popular share can
//     fill (a 230 on a GPU with 350 free leaves 120 that only rare small
//     tasks use; a 320 there leaves 30).
//   - The reduction of a placement is lowered by StrandWeight times the
//     free GPU capacity it strands: capacity on GPUs that some share of
//     the target fits by size but that the node's CPU or memory left no
//     longer lets any such share use (a 650 with 12 cores on a 16-core
//     node with two GPUs leaves the other GPU's 350 milli with too little
//     CPU for a 320).
//   - Among nodes of equal score: a task with GPUs avoids nodes it would
//     leave with less CPU than their free GPUs need (CPUReserve), and
//     otherwise prefers nodes whose CPU per GPU matches its own, less the
//     pressure of model-constrained tasks on the node's GPU model
//     (Pressure) when it accepts any model; a task without GPUs prefers
//     nodes with the most CPU per GPU; then the exact reduction decides.
//
// The remaining ties are left to the caller (the simulator, like the
// authors', takes the node that comes first in a fixed random order).
type Kiln struct {
	Target *Workload
	// Pressure is, per GPU model, the GPU demand of the tasks that accept
	// only some models, spread over the models each accepts by capacity,
	// divided by the model's capacity (see ModelPressure).
	Pressure map[string]float64
	// CloseBelow is the free share (milli-GPU) under which a GPU counts as
	// closed: no request fits what is left. NewKilnFor sets it to the
	// smallest share among the tasks seen; 0 turns closing off.
	CloseBelow int32
	// DeadWeight weighs the capacity a fractional placement leaves that no
	// popular share can fill against FGD's reduction; 0 turns it off.
	DeadWeight float64
	// CPUReserve is the CPU, in milli-cores per milli-GPU, that a node
	// should keep for each milli-GPU it has free: what the GPU tasks ask
	// for on average. A task with GPUs that would leave a node below it
	// (its reserve capped at the node's own CPU per GPU) ranks below the
	// nodes it leaves enough CPU, so that GPUs are not stranded on nodes
	// whose CPU ran out. 0 turns it off; NewKilnFor turns it off when CPU,
	// not GPU, is what the workload runs out of.
	CPUReserve float64
	// StrandWeight weighs the free GPU capacity a placement strands (see
	// Stranded) against FGD's reduction; 0 turns it off.
	StrandWeight float64

	// dead[r] is the part of r free milli-GPU that sums of the target's
	// popular one-GPU shares do not fill (see deadTable).
	dead []int32
	// fitMilli are the distinct GPU shares of the target's one-GPU shapes,
	// increasing; fitters[i] are the (CPU, memory, models) needs of the
	// shapes whose share is at most fitMilli[i], those a shape accepting
	// any model needs no less than left out.
	fitMilli []int32
	fitters  [][]Task
}

// Defaults of NewKiln.
const (
	DefaultDeadWeight = 2.5
	// DefaultStrandWeight: measured on the default trace, weights from 5
	// to 50 gave the same allocation (2.5: a little less).
	DefaultStrandWeight = 10
	// minPopular and minCommon are the shares of tasks a one-GPU shape
	// must have to count as a filler in the two dead-capacity tables.
	minPopular = 0.01
	minCommon  = 0.05
	// scarceShare: a shape that fits, on an empty cluster, on less than
	// this share of the GPU capacity is scarce; scarceWeight scales its
	// popularity by how scarce it is.
	scarceShare  = 0.25
	scarceWeight = 0.6
	// cpuBound: when the tasks ask for a share of the cluster's CPU above
	// cpuBound times the share of its GPU capacity they ask for, CPU is the
	// scarce resource and NewKilnFor leaves CPUReserve off.
	cpuBound = 0.97
	// reserveSlope maps a CPU shortfall (milli-cores below the reserve)
	// into the resource-fit key: 128 cores below is the bottom.
	reserveSlope = 128000
)

// NewKiln returns kiln's policy for a target workload and model pressure,
// with DefaultDeadWeight and CloseBelow set to the smallest share of the
// target's shapes.
func NewKiln(target *Workload, pressure map[string]float64) *Kiln {
	k := &Kiln{Target: target, Pressure: pressure, DeadWeight: DefaultDeadWeight, StrandWeight: DefaultStrandWeight}
	for _, s := range target.Shapes {
		if s.Sharing() && (k.CloseBelow == 0 || s.GPUMilli < k.CloseBelow) {
			k.CloseBelow = s.GPUMilli
		}
	}
	k.dead = deadTable(target)
	k.fitMilli, k.fitters = fitterTable(target)
	return k
}

// fitterTable is Kiln.fitMilli and Kiln.fitters for a target.
func fitterTable(w *Workload) ([]int32, [][]Task) {
	var ms []int32
	for _, s := range w.Shapes {
		if s.WantsGPU() && s.GPUs == 1 && !slices.Contains(ms, s.GPUMilli) {
			ms = append(ms, s.GPUMilli)
		}
	}
	slices.Sort(ms)
	fitters := make([][]Task, len(ms))
	for i, m := range ms {
		var all []Task
		for _, s := range w.Shapes {
			if s.WantsGPU() && s.GPUs == 1 && s.GPUMilli <= m {
				all = append(all, Task{CPU: s.CPU, Memory: s.Memory, Models: s.Models})
			}
		}
		for j, a := range all {
			covered := false
			for l, b := range all {
				// b, accepting any model, makes a redundant when it needs
				// no more (the first of equal needs stays).
				if l != j && len(b.Models) == 0 && b.CPU <= a.CPU && b.Memory <= a.Memory &&
					(b.CPU < a.CPU || b.Memory < a.Memory || len(a.Models) > 0 || l < j) {
					covered = true
					break
				}
			}
			if !covered {
				fitters[i] = append(fitters[i], a)
			}
		}
	}
	return ms, fitters
}

// Stranded is the free milli-GPU of node n that some one-GPU shape of the
// target fits by share and GPU model but that none of those shapes can use
// with the CPU and memory the node has left.
func (k *Kiln) Stranded(n Node) int64 {
	return k.strandedAfter(n, 0, 0, nil, 0)
}

// strandedAfter is Stranded of n after a task of cpu and mem took milli
// from each of gpus.
func (k *Kiln) strandedAfter(n Node, cpu, mem int64, gpus []int, milli int32) int64 {
	cpu, mem = n.CPU-cpu, n.Memory-mem
	var out int64
	for g, f := range n.Free {
		if slices.Contains(gpus, g) {
			f -= milli
		}
		if f <= 0 {
			continue
		}
		i := -1
		for i+1 < len(k.fitMilli) && k.fitMilli[i+1] <= f {
			i++
		}
		if i < 0 {
			continue
		}
		fits, usable := false, false
		for _, s := range k.fitters[i] {
			if len(s.Models) > 0 && !slices.Contains(s.Models, n.Model) {
				continue
			}
			fits = true
			if s.CPU <= cpu && s.Memory <= mem {
				usable = true
				break
			}
		}
		if fits && !usable {
			out += int64(f)
		}
	}
	return out
}

// NewKilnFor returns kiln's policy for a cluster of empty nodes (their
// capacities) and the tasks seen, starting from a target workload such as
// TargetWorkload's: the target becomes KilnTarget's, Pressure is
// ModelPressure's, CloseBelow the smallest share of any task seen and
// CPUReserve CPUReserveFor's.
func NewKilnFor(base *Workload, tasks []Task, capacities []Node) *Kiln {
	capBy := map[string]int64{}
	for _, n := range capacities {
		capBy[n.Model] += n.FreeGPU()
	}
	k := NewKiln(KilnTarget(base, tasks, capacities), ModelPressure(tasks, capBy))
	if m := SmallestShare(tasks); m > 0 {
		k.CloseBelow = m
	}
	k.CPUReserve = CPUReserveFor(tasks, capacities)
	return k
}

// CPUReserveFor is Kiln.CPUReserve for the tasks seen on a cluster of
// empty nodes: the CPU the tasks with GPUs ask for per milli-GPU, or 0
// when the tasks' share of the cluster's CPU (tasks without GPUs
// included) is above cpuBound times their share of its GPU capacity, or
// when no task asks for a GPU.
func CPUReserveFor(tasks []Task, capacities []Node) float64 {
	var gpuCPU, gpu, cpu float64
	for _, t := range tasks {
		cpu += float64(t.CPU)
		if t.WantsGPU() {
			gpuCPU += float64(t.CPU)
			gpu += float64(t.GPUTotal())
		}
	}
	var cpuCap, gpuCap float64
	for _, n := range capacities {
		cpuCap += float64(n.CPU)
		gpuCap += float64(n.FreeGPU())
	}
	if gpu == 0 || cpuCap == 0 || gpuCap == 0 || cpu/cpuCap > cpuBound*gpu/gpuCap {
		return 0
	}
	return gpuCPU / gpu
}

// SmallestShare is the smallest GPU share of a fractional task among
// tasks, 0 when there is none.
func SmallestShare(tasks []Task) int32 {
	var m int32
	for _, t := range tasks {
		if t.Sharing() && (m == 0 || t.GPUMilli < m) {
			m = t.GPUMilli
		}
	}
	return m
}

// KilnTarget extends a target workload for kiln: every shape gets the
// median host memory of the tasks of that shape, and the shapes that fit,
// on empty nodes, on less than a quarter of the cluster's GPU capacity are
// added with their popularity times 0.6 over that share (a shape that fits
// on 5% of the capacity counts twelve times its popularity), so that the
// nodes they need are kept for them.
func KilnTarget(base *Workload, tasks []Task, capacities []Node) *Workload {
	mem := map[shapeKey][]int64{}
	for _, t := range tasks {
		k := keyOf(t)
		mem[k] = append(mem[k], t.Memory)
	}
	median := func(t Task) int64 {
		v := mem[keyOf(t)]
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	shapes := slices.Clone(base.Shapes)
	for i := range shapes {
		shapes[i].Memory = median(shapes[i].Task)
	}
	var capTotal int64
	for _, n := range capacities {
		capTotal += n.FreeGPU()
	}
	if capTotal > 0 {
		for _, s := range TargetWorkload(tasks, 1, ByCount).Shapes {
			if !s.WantsGPU() {
				continue
			}
			var fits int64
			for _, n := range capacities {
				if Fits(n, s.Task) {
					fits += n.FreeGPU()
				}
			}
			share := float64(fits) / float64(capTotal)
			if fits > 0 && share < scarceShare {
				s.Memory = median(s.Task)
				s.Weight *= scarceWeight / share
				shapes = append(shapes, s)
			}
		}
	}
	return NewWorkload(shapes)
}

// deadTable is Kiln.dead for a target: r less what the popular shares
// fill, averaged over two notions of popular (shares of at least 1% and of
// at least 5% of the tasks), so that a remainder only rare shares fit
// counts as half lost.
func deadTable(w *Workload) []int32 {
	fine, coarse := fillTable(w, minPopular), fillTable(w, minCommon)
	dead := make([]int32, MilliPerGPU+1)
	for r := range dead {
		dead[r] = int32(r) - (fine[r]+coarse[r])/2
	}
	return dead
}

// fillTable: fill[r] is the largest sum of the target's one-GPU shares
// held by at least minShare of the tasks (each share any number of times)
// that is at most r milli-GPU.
func fillTable(w *Workload, minShare float64) []int32 {
	var sizes []int32
	for _, s := range w.Shapes {
		if s.WantsGPU() && s.GPUs == 1 && s.Weight >= minShare && !slices.Contains(sizes, s.GPUMilli) {
			sizes = append(sizes, s.GPUMilli)
		}
	}
	// fill[r]: the largest sum of sizes (each any number of times) <= r.
	fill := make([]int32, MilliPerGPU+1)
	for r := int32(1); r <= MilliPerGPU; r++ {
		fill[r] = fill[r-1]
		for _, z := range sizes {
			if z <= r && fill[r-z]+z > fill[r] {
				fill[r] = fill[r-z] + z
			}
		}
	}
	return fill
}

// Dead is the part of free milli-GPU f on one GPU that sums of the
// target's popular one-GPU shares do not fill (see deadTable); f itself
// outside 0..1000.
func (k *Kiln) Dead(f int32) int32 {
	if f < 0 || int(f) >= len(k.dead) {
		return max(f, 0)
	}
	return k.dead[f]
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
	s, _ := k.decide(n, cpuCapacity, t)
	return s
}

// GPUs is kiln's GPU choice on node n: the first idle GPUs for whole-GPU
// tasks; for a fractional task the tightest GPU when it closes a GPU,
// else FGD's choice by its integer score. nil when t asks for no GPU or
// does not fit.
func (k *Kiln) GPUs(n Node, t Task) []int {
	if !t.WantsGPU() || !Fits(n, t) {
		return nil
	}
	if !t.Sharing() {
		return FirstFree(n.Free, t.GPUMilli, t.GPUs)
	}
	_, g := k.decide(n, 0, t)
	return []int{g}
}

func (k *Kiln) decide(n Node, cpuCapacity int64, t Task) (float64, int) {
	if !Fits(n, t) {
		return math.Inf(-1), -1
	}
	before := k.Target.Amount(n)
	if !t.Sharing() {
		var gpus []int
		if t.WantsGPU() {
			gpus = FirstFree(n.Free, t.GPUMilli, t.GPUs)
		}
		return k.score(n, cpuCapacity, t, -1, before-k.Target.Amount(Apply(n, t, gpus)))
	}
	gpu, rank, delta := -1, 0.0, 0.0
	for i, f := range n.Free {
		if f < t.GPUMilli {
			continue
		}
		d := before - k.Target.Amount(Apply(n, t, []int{i}))
		if r := float64(PaperScore(d)); gpu < 0 || r > rank {
			gpu, rank, delta = i, r, d
		}
	}
	return k.score(n, cpuCapacity, t, gpu, delta)
}

// ScoreMemo is Score measured with a memo of k.Target: before is
// m.Amount(n). It returns the score and, for a fractional task, the GPU
// to use (-1 otherwise). t must fit on n.
func (k *Kiln) ScoreMemo(m *Memo, n Node, cpuCapacity int64, t Task, before float64) (float64, int) {
	gpu, delta := m.FGD(n, t, before, true)
	return k.score(n, cpuCapacity, t, gpu, delta)
}

// closeBase lifts a placement that closes a GPU above every PaperScore.
const closeBase = 1000

// score combines FGD's choice on n (the GPU for a fractional task and the
// fragmentation reduction delta) into kiln's score and GPU.
func (k *Kiln) score(n Node, cpuCapacity int64, t Task, gpu int, delta float64) (float64, int) {
	if k.StrandWeight != 0 && k.fitters != nil && t.WantsGPU() {
		var buf [memoGPUs]int
		gpus := buf[:0]
		if t.Sharing() {
			gpus = append(gpus, gpu)
		} else {
			gpus = firstFreeInto(gpus, n.Free, t.GPUMilli, t.GPUs)
		}
		after := k.strandedAfter(n, t.CPU, t.Memory, gpus, t.GPUMilli)
		delta -= k.StrandWeight * float64(after-k.Stranded(n))
	}
	if t.Sharing() && gpu >= 0 {
		if k.DeadWeight != 0 && k.dead != nil {
			f := n.Free[gpu]
			delta -= k.DeadWeight * float64(k.Dead(f-t.GPUMilli)-k.Dead(f))
		}
		if k.CloseBelow > 0 {
			if g := TightestGPU(n.Free, t.GPUMilli); g >= 0 {
				if left := n.Free[g] - t.GPUMilli; left < k.CloseBelow {
					return closeBase + float64(MilliPerGPU-left) + k.keys(n, cpuCapacity, t, delta)/closeBase, g
				}
			}
		}
	}
	return k.keys(n, cpuCapacity, t, delta), gpu
}

// keys is PaperScore(delta) followed by the tie-break keys, each in
// [0, 1] kept to three digits below the previous one.
func (k *Kiln) keys(n Node, cpuCapacity int64, t Task, delta float64) float64 {
	s := float64(PaperScore(delta))
	s += quant(k.resourceFit(n, cpuCapacity, t)) / 1e3
	s += quant(1/(1+math.Exp(-delta/1000))) / 1e6
	return s
}

func quant(v float64) float64 { return math.Round(math.Min(math.Max(v, 0), 1) * 998) }

// resourceFit is the first tie-break: whether the node keeps CPU for its
// free GPUs and how well its CPU per GPU suits the task (see Kiln).
func (k *Kiln) resourceFit(n Node, cpuCapacity int64, t Task) float64 {
	g := len(n.Free)
	if !t.WantsGPU() {
		switch {
		case cpuCapacity <= 0:
			return 0.5
		case g == 0:
			return 1
		}
		return float64(cpuCapacity) / float64(g) / 1000 / 100 // cores per GPU / 100
	}
	if short := k.cpuShort(n, cpuCapacity, t); short > 0 {
		return 0.5 - float64(short)/reserveSlope
	}
	v := 0.5
	if g > 0 && cpuCapacity > 0 {
		nodeRatio := float64(cpuCapacity) / float64(g) / 1000 // cores per GPU
		taskRatio := float64(t.CPU) / float64(t.GPUTotal())   // cores per GPU
		if taskRatio > 0 {
			v = 1 - math.Abs(math.Log(taskRatio/nodeRatio))/5
		}
	}
	if len(t.Models) == 0 {
		v -= k.Pressure[n.Model]
	}
	return v
}

// cpuShort is how far (milli-cores) placing t leaves node n below its CPU
// reserve for the GPUs still free, 0 when it does not or when the reserve
// is off. The reserve per milli-GPU is CPUReserve capped at the node's own
// CPU per milli-GPU, so that nodes with little CPU per GPU are not always
// short.
func (k *Kiln) cpuShort(n Node, cpuCapacity int64, t Task) int64 {
	g := len(n.Free)
	if k.CPUReserve <= 0 || !t.WantsGPU() || g == 0 || cpuCapacity <= 0 {
		return 0
	}
	per := math.Min(k.CPUReserve, float64(cpuCapacity)/float64(g*MilliPerGPU))
	need := per * float64(n.FreeGPU()-t.GPUTotal())
	left := float64(n.CPU - t.CPU)
	if left >= need {
		return 0
	}
	return int64(math.Ceil(need - left))
}
