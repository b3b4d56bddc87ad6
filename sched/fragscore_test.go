package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"kiln.dev/kiln/sched/frag"
)

// twoGPU is a node with two T4s, 32 cores and 128 GiB, without link data.
func twoGPU(name string) *Node {
	return &Node{Name: name, CPUMilli: 32000, MemoryBytes: 128 << 30, Devices: []Device{
		{Index: 0, Vendor: "nvidia", Model: "T4", MemoryBytes: 16 << 30, NUMA: -1},
		{Index: 1, Vendor: "nvidia", Model: "T4", MemoryBytes: 16 << 30, NUMA: -1},
	}}
}

// hold commits shares of the given milli-GPU on node i, one per device.
func hold(t *testing.T, st *State, i int, milli ...int) {
	t.Helper()
	for k, m := range milli {
		if m == 0 {
			continue
		}
		a := Allocation{RequestID: fmt.Sprintf("held-%d-%d", i, k), Node: st.c.nodes[i].Name, NodeIndex: i,
			Devices: []Share{{Device: k, Milli: m}}}
		if err := st.CommitOne(a); err != nil {
			t.Fatal(err)
		}
	}
}

// quarterTarget: quarters of a GPU and whole GPUs, half and half.
func quarterTarget() *frag.Workload {
	return frag.NewWorkload([]frag.Shape{
		{Task: frag.Task{GPUs: 1, GPUMilli: 250}, Weight: 1},
		{Task: frag.Task{GPUs: 1, GPUMilli: 1000}, Weight: 1},
	})
}

// withTarget is Default with FragScore measuring against w.
func withTarget(seed uint64, w *frag.Workload) *Scheduler {
	s := Default(seed)
	for i := range s.Scores {
		if _, ok := s.Scores[i].Plugin.(FragScore); ok {
			s.Scores[i].Plugin = FragScore{Target: w}
		}
	}
	return s
}

// TestFragScorePicksFGDsNodeAndGPU: node c has GPUs free [250, 1000], node
// d [400, 400]. For a quarter-GPU request against quarters and whole GPUs,
// FGD fills c's 250 sliver (fragment drops by 125 milli: the sliver was
// fragment for whole GPUs) rather than cutting one of d's 400s to 150
// (drops by 50). Packing alone prefers d, the fuller node.
func TestFragScorePicksFGDsNodeAndGPU(t *testing.T) {
	_, st := cluster(t, twoGPU("c"), twoGPU("d"))
	hold(t, st, 0, 750, 0)
	hold(t, st, 1, 600, 600)
	w := quarterTarget()
	req := Request{ID: "q", GPUMilli: 250}

	// What FGD itself says, node by node.
	task := frag.Task{GPUs: 1, GPUMilli: 250}
	nc, nd := fragNode(st.Node(0)), fragNode(st.Node(1))
	if !slices.Equal(nc.Free, []int32{250, 1000}) || !slices.Equal(nd.Free, []int32{400, 400}) {
		t.Fatalf("free shares %v and %v, want [250 1000] and [400 400]", nc.Free, nd.Free)
	}
	sc, sd := frag.Score(nc, task, w), frag.Score(nd, task, w)
	if sc != 125 || sd != 50 {
		t.Fatalf("FGD scores c %v, d %v; want 125 and 50", sc, sd)
	}
	if g := frag.ChooseGPUs(nc, task, w); !slices.Equal(g, []int{0}) {
		t.Fatalf("FGD's GPU on c: %v, want [0]", g)
	}

	a, err := withTarget(1, w).Place(st, req)
	if err != nil {
		t.Fatal(err)
	}
	if a.Node != "c" || !slices.Equal(devsOf(a), []int{0}) {
		t.Errorf("placed on %s GPU %v, want FGD's choice c GPU [0]", a.Node, devsOf(a))
	}

	// Without the fragmentation score the fuller node wins.
	old := Default(1)
	old.Scores = slices.DeleteFunc(old.Scores, func(w Weighted) bool { return w.Plugin.Name() == "frag" })
	b, err := old.Place(st, req)
	if err != nil {
		t.Fatal(err)
	}
	if b.Node != "d" {
		t.Errorf("without FragScore placed on %s, want d (packing)", b.Node)
	}
}

func TestFragScoreValues(t *testing.T) {
	_, st := cluster(t, twoGPU("c"))
	hold(t, st, 0, 750, 0)
	c := &Candidate{NodeInfo: st.Node(0), Alloc: &Allocation{Devices: []Share{{Device: 0, Milli: 250}}}}
	s := FragScore{Target: quarterTarget()}
	if got := s.Score(&Request{ID: "q", GPUMilli: 250}, c); got != 0.625 {
		t.Errorf("filling the 250 sliver scores %v, want 0.5 + 125/1000", got)
	}
	// Cutting the idle GPU to 750 makes 750 milli fragment for whole GPUs
	// (375) and leaves the 250 sliver usable: 0.5 - 375/1000.
	c.Alloc.Devices[0].Device = 1
	if got := s.Score(&Request{ID: "q", GPUMilli: 250}, c); got != 0.125 {
		t.Errorf("cutting the idle GPU scores %v, want 0.125", got)
	}
	if got := s.Score(&Request{ID: "w", GPUs: 1}, c); got != 0.5 {
		t.Errorf("whole-GPU request scores %v, want neutral 0.5", got)
	}
	// The default target is used when none is set.
	if got := (FragScore{}).Score(&Request{ID: "q", GPUMilli: 250}, c); got >= 0.5 {
		t.Errorf("default target: cutting an idle GPU scores %v, want below 0.5", got)
	}
	found := false
	for _, w := range Default(1).Scores {
		if _, ok := w.Plugin.(FragScore); ok && w.Weight == FragScoreWeight {
			found = true
		}
	}
	if !found {
		t.Error("Default has no FragScore")
	}
}

// TestFragScoreAloneFollowsFGD: with FragScore as the only score and every
// node scored, the chosen node is one where FGD's measure drops the most
// for the GPU the engine picks, on random small clusters.
func TestFragScoreAloneFollowsFGD(t *testing.T) {
	w := quarterTarget()
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 200; trial++ {
		nodes := make([]*Node, 4)
		for i := range nodes {
			nodes[i] = twoGPU(fmt.Sprintf("n%d", i))
		}
		_, st := cluster(t, nodes...)
		for i := range nodes {
			hold(t, st, i, rng.IntN(5)*200, rng.IntN(5)*200)
		}
		s := Default(uint64(trial))
		s.Scores = []Weighted{{FragScore{Target: w}, 1}}
		s.MaxScored = 0
		milli := []int{250, 400, 600}[rng.IntN(3)]
		a, err := s.Place(st, Request{ID: "r", GPUMilli: milli})
		if err != nil {
			continue // every GPU too full
		}
		delta := func(i, k int) float64 {
			n := fragNode(st.Node(i))
			task := frag.Task{GPUs: 1, GPUMilli: int32(milli)}
			return w.Amount(n) - w.Amount(frag.Apply(n, task, []int{k}))
		}
		got := delta(a.NodeIndex, a.Devices[0].Device)
		for i := range nodes {
			c, why := s.fit(&Request{ID: "r", GPUMilli: milli}, st.Node(i), 3, nil)
			if c == nil {
				_ = why
				continue
			}
			if d := delta(i, c.Alloc.Devices[0].Device); d > got+1e-9 {
				t.Fatalf("trial %d: chose %s (Δ %v) but node %d has Δ %v", trial, a.Node, got, i, d)
			}
		}
	}
}
