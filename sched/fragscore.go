package sched

import (
	"math"

	"kiln.dev/kiln/sched/frag"
)

// FragScore rates a fractional (milli-GPU) placement by how it changes the
// fragmentation of the node's free GPU capacity against a target workload:
// the measure of Fragmentation Gradient Descent (Weng et al., USENIX ATC
// '23; see package frag). A placement that fills a sliver no common request
// could use scores high; one that cuts an idle GPU into a share that common
// requests no longer fit scores low. Whole-GPU, MIG and CPU-only requests
// get a neutral 0.5, so topology and packing decide for them.
//
// The score is 0.5 + Δ/1000, clamped to [0, 1], where Δ is the drop in the
// node's fragmented milli-GPU (FGD's score before its sigmoid): a placement
// that turns 250 milli of fragment into use scores 0.75.
type FragScore struct {
	// Target is the workload fragmentation is measured against; nil means
	// the default target: whole GPUs (40%), halves (30%), quarters (20%)
	// and eighths (10%) of a GPU, the splits that time-slicing and MPS
	// setups commonly use, without CPU or memory demands.
	Target *frag.Workload
}

// FragScoreWeight is FragScore's weight in Default: a 100 milli-GPU
// difference in fragmentation (0.8 points) outweighs a 40% difference in
// how full two nodes would be (PackScore, weight 2).
const FragScoreWeight = 8

// defaultFragTarget is FragScore's target when it is given none; it is
// built once, and a Workload is read-only once built.
var defaultFragTarget = frag.NewWorkload([]frag.Shape{
	{Task: frag.Task{GPUs: 1, GPUMilli: 1000}, Weight: 4},
	{Task: frag.Task{GPUs: 1, GPUMilli: 500}, Weight: 3},
	{Task: frag.Task{GPUs: 1, GPUMilli: 250}, Weight: 2},
	{Task: frag.Task{GPUs: 1, GPUMilli: 125}, Weight: 1},
})

// Name implements Plugin.
func (FragScore) Name() string { return "frag" }

// Score implements ScorePlugin.
func (s FragScore) Score(r *Request, c *Candidate) float64 {
	if r.Kind() != KindFraction || c.Alloc == nil || len(c.Alloc.Devices) != 1 {
		return 0.5
	}
	target := s.Target
	if target == nil {
		target = defaultFragTarget
	}
	n := fragNode(c.NodeInfo)
	k := c.Alloc.Devices[0].Device
	if k < 0 || k >= len(n.Free) {
		return 0.5
	}
	before := target.Amount(n)
	t := frag.Task{CPU: r.CPUMilli, Memory: int64(r.MemoryBytes >> 20), GPUs: 1, GPUMilli: int32(r.GPUMilli)}
	after := target.Amount(frag.Apply(n, t, []int{k}))
	return clamp01(0.5 + (before-after)/1000)
}

// fragNode is the node's free resources as package frag sees them: free
// milli-GPU per device (0 for devices that cannot be shared: unhealthy or
// in MIG mode), free CPU and memory (unbounded where the capacity is
// unknown), and the model of its first shareable device.
func fragNode(ni *NodeInfo) frag.Node {
	n := ni.Node
	out := frag.Node{CPU: math.MaxInt64 / 2, Memory: math.MaxInt64 / 2, Free: make([]int32, len(n.Devices))}
	if n.CPUMilli > 0 {
		out.CPU = n.CPUMilli - ni.u.cpu
	}
	if n.MemoryBytes > 0 {
		out.Memory = int64((n.MemoryBytes - min(ni.u.mem, n.MemoryBytes)) >> 20)
	}
	for k := range n.Devices {
		d := &n.Devices[k]
		if !d.Healthy() || d.MIGEnabled {
			continue
		}
		if out.Model == "" {
			out.Model = d.Model
		}
		out.Free[k] = int32(max(0, 1000-ni.u.devs[k].milli))
	}
	return out
}
