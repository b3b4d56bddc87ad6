// Package frag measures GPU fragmentation and scores placements by it.
//
// The measure is the one of Weng et al., "Beware of Fragmentation:
// Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"
// (USENIX ATC '23). A node's free GPU capacity is fragmented with respect to
// a target workload M, a set of task shapes m with popularity p_m:
//
//	F_n(M) = sum over m of p_m * F_n(m)
//
// where F_n(m) is the free milli-GPU of node n that task m cannot use. If m
// cannot run on n at all (too little CPU or host memory, when the shape
// states its memory; too few GPUs with enough free
// capacity, a GPU model it does not accept, or m asks for no GPU), all free
// GPU capacity of n is fragment for m. If m can run, only the GPUs whose free
// capacity is below m's per-GPU request are fragment for it.
//
// Fragmentation Gradient Descent (FGD) places each task on the node, and for
// a fractional task on the GPU, whose fragmentation grows least (or shrinks
// most) by the placement. kiln's default policy (see Kiln) builds on the same
// measure.
//
// The package is pure: no I/O, no global state. Everything is in milli units:
// CPU in milli-cores, GPU in milli-GPU (1000 = one whole GPU), memory in MiB.
//
// # Function API for a placement engine
//
// A placement engine calls, per candidate node and request:
//
//	frag.Fits(node Node, req Task) bool                       // filter
//	frag.Score(node Node, req Task, target *Workload) float64 // FGD: higher is better, -Inf: no fit
//	frag.ChooseGPUs(node Node, req Task, target *Workload) []int
//	k.Score(node Node, cpuCapacity int64, req Task) float64  // kiln's policy, k := frag.NewKilnFor(...)
//	k.GPUs(node Node, req Task) []int
//
// It builds the target workload once from the requests it has seen with
// TargetWorkload (or NewWorkload for explicit shapes), and kiln's policy
// with NewKilnFor(target, requests, emptyNodes), which extends the target
// (KilnTarget: memory per shape, scarce shapes) and computes the model
// pressure, or NewKiln(target, pressure) for a target as it is. A Memo
// makes repeated scoring of the same node states a map look-up
// (Memo.FGD, Kiln.ScoreMemo; a memo of kiln's own target for the latter).
package frag
