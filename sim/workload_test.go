package sim

import (
	"fmt"
	"slices"
	"testing"

	"kiln.dev/kiln/sched/frag"
)

func smallTrace() ([]Pod, []Node) {
	var pods []Pod
	for i := 0; i < 50; i++ {
		pods = append(pods, Pod{Name: fmt.Sprintf("p%03d", i), Task: frag.Task{CPU: 1000, GPUs: 1, GPUMilli: int32(100 * (1 + i%10))}})
	}
	pods = append(pods, Pod{Name: "cpu", Task: frag.Task{CPU: 500}})
	var nodes []Node
	for _, n := range []string{"d", "b", "a", "c"} {
		nodes = append(nodes, Node{Name: n, CPU: 64000, Memory: 1 << 20, GPUs: 8, Model: "X"})
	}
	return pods, nodes
}

func TestArrivalsDeterministicAndInflated(t *testing.T) {
	pods, nodes := smallTrace()
	o1, r1 := Arrivals(pods, nodes, 42, 1.3)
	o2, r2 := Arrivals(pods, nodes, 42, 1.3)
	if !slices.Equal(o1, o2) || !slices.Equal(r1, r2) {
		t.Fatal("the same seed gave different arrivals")
	}
	o3, _ := Arrivals(pods, nodes, 43, 1.3)
	if slices.Equal(o1, o3) {
		t.Error("seeds 42 and 43 gave the same order")
	}
	// The first len(pods) arrivals are a permutation of the trace.
	first := slices.Clone(o1[:len(pods)])
	slices.Sort(first)
	for i, v := range first {
		if v != i {
			t.Fatalf("first arrivals are not a permutation: %v", first)
		}
	}
	var total int64
	for _, i := range o1 {
		total += pods[i].GPUTotal()
	}
	target := int64(1.3 * 32000)
	if total > target || total < target-1000 {
		t.Errorf("inflated request %d milli, want just under %d", total, target)
	}
	// Ranks are a permutation of the nodes.
	if !slices.Equal(slices.Sorted(slices.Values(r1)), []int{0, 1, 2, 3}) {
		t.Errorf("ranks %v", r1)
	}
	// Deflation: a ratio below the trace's request removes tasks.
	od, _ := Arrivals(pods, nodes, 42, 0.5)
	var dt int64
	for _, i := range od {
		dt += pods[i].GPUTotal()
	}
	if dt > 16000 || len(od) >= len(pods) {
		t.Errorf("deflated to %d milli with %d tasks", dt, len(od))
	}
}

func TestCurveBuckets(t *testing.T) {
	c := newCluster([]Node{{Name: "n", CPU: 1000, Memory: 1000, GPUs: 10, Model: "X"}}, frag.NewWorkload([]frag.Shape{{Task: frag.Task{GPUs: 1, GPUMilli: 1000}, Weight: 1}}))
	a := newCurve(130)
	c.allocated = 5000
	a.add(5000, c) // 50%
	a.add(5040, c) // 50.4% rounds to 50
	c.allocated = 6000
	a.add(5200, c) // 52%
	if got := a.at(50); got != 50 {
		t.Errorf("at 50 = %v", got)
	}
	// 51 has no event: the neighbours' mean.
	if got := a.at(51); got != (50+50+60)/3.0 {
		t.Errorf("at 51 = %v", got)
	}
}
