package frag

// memoGPUs is the largest GPU count whose node states a Memo caches; larger
// nodes are measured directly.
const memoGPUs = 8

// stateKey is a node state as the measure sees it: model, free CPU and the
// free milli-GPU of its GPUs sorted in decreasing order (the measure does
// not depend on GPU order, so nodes that differ only in which GPU holds what
// share one entry).
type stateKey struct {
	cpu   int64
	mem   int64
	model int32
	n     uint8
	free  [memoGPUs]uint16
}

// Memo caches Workload.Amount by node state. Scheduling visits the same
// states again and again (every idle node of a shape is one state), so most
// measurements become a map look-up. A Memo is not safe for concurrent use:
// give each goroutine its own.
type Memo struct {
	w       *Workload
	measure func(*Workload, Node) float64
	models  map[string]int32
	m       map[stateKey]float64
	// memory is set when a shape of w asks for host memory: the measure
	// then depends on the node's free memory, which joins the key.
	memory bool
	// Hits and Misses count look-ups, for benchmarks.
	Hits, Misses int
}

// NewMemo returns an empty memo for workload w.
func NewMemo(w *Workload) *Memo {
	return NewMemoOf(w, (*Workload).Amount)
}

// NewMemoOf returns an empty memo of another measure of node states against
// w, such as (*Workload).Waste.
func NewMemoOf(w *Workload, measure func(*Workload, Node) float64) *Memo {
	mm := &Memo{w: w, measure: measure, models: map[string]int32{}, m: make(map[stateKey]float64, 1<<12)}
	for _, s := range w.Shapes {
		if s.Memory > 0 {
			mm.memory = true
		}
	}
	return mm
}

// Workload is the workload the memo measures against.
func (m *Memo) Workload() *Workload { return m.w }

// Amount is w.Amount(n), cached.
func (m *Memo) Amount(n Node) float64 {
	if len(n.Free) > memoGPUs {
		return m.measure(m.w, n)
	}
	var free [memoGPUs]int32
	copy(free[:], n.Free)
	return m.lookup(n.Model, n.CPU, n.Memory, free, len(n.Free))
}

// AmountAfter is the fragmentation of node n after task t is placed on the
// given GPUs (n itself is not changed).
func (m *Memo) AmountAfter(n Node, t Task, gpus []int) float64 {
	if len(n.Free) > memoGPUs {
		return m.measure(m.w, Apply(n, t, gpus))
	}
	var free [memoGPUs]int32
	copy(free[:], n.Free)
	if t.WantsGPU() {
		for _, g := range gpus {
			free[g] -= t.GPUMilli
		}
	}
	return m.lookup(n.Model, n.CPU-t.CPU, n.Memory-t.Memory, free, len(n.Free))
}

// amountAfterOne is AmountAfter for a task that takes milli from GPU g.
func (m *Memo) amountAfterOne(n Node, cpu, mem int64, g int, milli int32) float64 {
	if len(n.Free) > memoGPUs {
		return m.measure(m.w, Apply(n, Task{CPU: cpu, Memory: mem, GPUs: 1, GPUMilli: milli}, []int{g}))
	}
	var free [memoGPUs]int32
	copy(free[:], n.Free)
	free[g] -= milli
	return m.lookup(n.Model, n.CPU-cpu, n.Memory-mem, free, len(n.Free))
}

func (m *Memo) lookup(model string, cpu, mem int64, free [memoGPUs]int32, k int) float64 {
	id, ok := m.models[model]
	if !ok {
		id = int32(len(m.models))
		m.models[model] = id
	}
	key := stateKey{cpu: cpu, model: id, n: uint8(k)}
	if m.memory {
		key.mem = mem
	} else {
		mem = 0
	}
	// Insertion sort, decreasing: at most eight values.
	s := free[:k]
	for i := 1; i < k; i++ {
		v := s[i]
		j := i
		for j > 0 && s[j-1] < v {
			s[j] = s[j-1]
			j--
		}
		s[j] = v
	}
	for i := 0; i < k; i++ {
		v := s[i]
		if v < 0 {
			v = 0
		}
		key.free[i] = uint16(v)
	}
	if v, ok := m.m[key]; ok {
		m.Hits++
		return v
	}
	m.Misses++
	sorted := make([]int32, k)
	copy(sorted, s)
	v := m.measure(m.w, Node{Model: model, CPU: cpu, Memory: mem, Free: sorted})
	m.m[key] = v
	return v
}
