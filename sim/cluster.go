package sim

import (
	"kiln.dev/kiln/sched/frag"
)

// task is a pod as the simulator schedules it: the request, its shape id
// (tasks with the same CPU, GPU count, GPU share and accepted models share
// one) and the set of node models it accepts.
type task struct {
	frag.Task
	shape  int
	models uint64 // bit i: accepts model i of the cluster; all ones: any
	// memShape tells apart tasks of one shape with different memory, for
	// policies whose score depends on memory.
	memShape int
}

// cluster is the state of the simulated nodes.
type cluster struct {
	nodes   []frag.Node // free resources now
	caps    []Node      // capacities
	modelID []int       // model index of each node
	models  []string    // model names by index
	// Per-node aggregates kept up to date for a constant-time filter.
	maxFree []int32 // largest free share of one GPU
	idle    []int   // GPUs with all 1000 milli free
	version []uint32
	// affinity counts, per node, the GPU tasks by kind: [0] fractional,
	// [k] k whole GPUs (the GPU-clustering policy reads it).
	affinity [][maxNodeGPUs + 1]int32
	kinds    []int // distinct kinds on the node

	capacity  int64 // milli-GPU
	allocated int64 // milli-GPU

	// Fragmentation against the paper's target workload, per node and in
	// all, kept incrementally.
	memo     *frag.Memo
	fragNode []float64
	fragSum  float64

	// lastGPUs are the GPUs of the latest placement.
	lastGPUs []int
}

func newCluster(nodes []Node, target *frag.Workload) *cluster {
	return newClusterMemo(nodes, frag.NewMemo(target))
}

// newClusterMemo is newCluster measuring with an existing memo.
func newClusterMemo(nodes []Node, memo *frag.Memo) *cluster {
	c := &cluster{
		nodes:    make([]frag.Node, len(nodes)),
		caps:     nodes,
		modelID:  make([]int, len(nodes)),
		maxFree:  make([]int32, len(nodes)),
		idle:     make([]int, len(nodes)),
		version:  make([]uint32, len(nodes)),
		affinity: make([][maxNodeGPUs + 1]int32, len(nodes)),
		kinds:    make([]int, len(nodes)),
		fragNode: make([]float64, len(nodes)),
		memo:     memo,
	}
	ids := map[string]int{}
	for i, n := range nodes {
		free := make([]int32, n.GPUs)
		for g := range free {
			free[g] = frag.MilliPerGPU
		}
		c.nodes[i] = frag.Node{Model: n.Model, CPU: n.CPU, Memory: n.Memory, Free: free}
		id, ok := ids[n.Model]
		if !ok {
			id = len(c.models)
			ids[n.Model] = id
			c.models = append(c.models, n.Model)
		}
		c.modelID[i] = id
		c.capacity += int64(n.GPUs) * frag.MilliPerGPU
		c.refresh(i)
	}
	return c
}

// modelMask is the set of this cluster's models that t accepts.
func (c *cluster) modelMask(t frag.Task) uint64 {
	if !t.WantsGPU() || len(t.Models) == 0 {
		return ^uint64(0)
	}
	var m uint64
	for i, name := range c.models {
		if i < 64 && t.Accepts(name) {
			m |= 1 << i
		}
	}
	return m
}

// fits is frag.Fits in constant time.
func (c *cluster) fits(i int, t *task) bool {
	n := &c.nodes[i]
	if n.CPU < t.CPU || n.Memory < t.Memory {
		return false
	}
	if !t.WantsGPU() {
		return true
	}
	if t.models&(1<<c.modelID[i]) == 0 {
		return false
	}
	if t.GPUs == 1 {
		return c.maxFree[i] >= t.GPUMilli
	}
	if t.GPUMilli == frag.MilliPerGPU {
		return c.idle[i] >= t.GPUs
	}
	return frag.Fits(*n, t.Task)
}

// kind is the affinity slot of a GPU task.
func kind(t *task) int {
	if t.Sharing() {
		return 0
	}
	return min(t.GPUs, maxNodeGPUs)
}

// place puts t on node i using gpus.
func (c *cluster) place(i int, t *task, gpus []int) {
	c.lastGPUs = gpus
	n := &c.nodes[i]
	n.CPU -= t.CPU
	n.Memory -= t.Memory
	if t.WantsGPU() {
		for _, g := range gpus {
			n.Free[g] -= t.GPUMilli
		}
		c.allocated += t.GPUTotal()
		k := kind(t)
		if c.affinity[i][k] == 0 {
			c.kinds[i]++
		}
		c.affinity[i][k]++
	}
	c.refresh(i)
}

// remove takes t off node i, giving back gpus.
func (c *cluster) remove(i int, t *task, gpus []int) {
	n := &c.nodes[i]
	n.CPU += t.CPU
	n.Memory += t.Memory
	if t.WantsGPU() {
		for _, g := range gpus {
			n.Free[g] += t.GPUMilli
		}
		c.allocated -= t.GPUTotal()
		k := kind(t)
		c.affinity[i][k]--
		if c.affinity[i][k] == 0 {
			c.kinds[i]--
		}
	}
	c.refresh(i)
}

func (c *cluster) refresh(i int) {
	n := &c.nodes[i]
	var mx int32
	idle := 0
	for _, f := range n.Free {
		mx = max(mx, f)
		if f >= frag.MilliPerGPU {
			idle++
		}
	}
	c.maxFree[i], c.idle[i] = mx, idle
	c.version[i]++
	old := c.fragNode[i]
	c.fragNode[i] = c.memo.Amount(*n)
	c.fragSum += c.fragNode[i] - old
}

// fragRatio is the share of free GPU capacity that is fragment, in [0, 1].
func (c *cluster) fragRatio() float64 {
	free := c.capacity - c.allocated
	if free <= 0 {
		return 0
	}
	return c.fragSum / float64(free)
}
