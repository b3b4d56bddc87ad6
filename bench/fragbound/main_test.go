package main

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"kiln.dev/kiln/sched/frag"
	"kiln.dev/kiln/sim"
)

// Beale's example cycles under the most-negative-cost rule without an
// anti-cycling rule; its optimum is -1/20.
func TestSimplexBeale(t *testing.T) {
	A := [][]float64{
		{1, 0, 0, 0.25, -60, -1.0 / 25, 9},
		{0, 1, 0, 0.5, -90, -1.0 / 50, 3},
		{0, 0, 1, 0, 0, 1, 0},
	}
	b := []float64{0, 0, 1}
	c := []float64{0, 0, 0, -0.75, 150, -1.0 / 50, 6}
	v, err := simplex(A, b, c)
	if err != nil || math.Abs(v+0.05) > 1e-9 {
		t.Fatalf("Beale's program: %v, %v; want -0.05", v, err)
	}
}

func TestSimplexSmall(t *testing.T) {
	// min -x - 2y s.t. x + y + s1 = 4, x + 3y + s2 = 6: optimum at x=3, y=1.
	v, err := simplex([][]float64{{1, 1, 1, 0}, {1, 3, 0, 1}}, []float64{4, 6}, []float64{-1, -2, 0, 0})
	if err != nil || math.Abs(v+5) > 1e-9 {
		t.Fatalf("got %v, %v; want -5", v, err)
	}
	// x + y = 1 and x + y = 2 cannot both hold.
	if _, err := simplex([][]float64{{1, 1}, {1, 1}}, []float64{1, 2}, []float64{1, 1}); !errors.Is(err, errInfeasible) {
		t.Fatalf("contradictory program: %v, want infeasible", err)
	}
}

func TestMaximalPatterns(t *testing.T) {
	got := maximalPatterns([]int{300, 700}, 1000)
	// 300x3 (100 left), 300+700 (0 left); 700 alone leaves 300 and is not maximal.
	want := [][]int{{3, 0}, {1, 1}}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(p []int) bool { return slices.Equal(p, w) }) {
			t.Errorf("patterns %v lack %v", got, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("patterns %v, want %v", got, want)
	}
}

// Toy clusters: the bound is the linear relaxation's value, at most what
// the best placement leaves (the integer packings: 760, 0 and 190 milli).
func TestBoundToy(t *testing.T) {
	share := func(m int32) sim.Pod { return sim.Pod{Task: frag.Task{GPUs: 1, GPUMilli: m}} }
	whole := sim.Pod{Task: frag.Task{GPUs: 1, GPUMilli: 1000}}
	cases := []struct {
		name string
		pods []sim.Pod
		want float64 // milli-GPU
	}{
		// Four 810s open the four GPUs; nothing fits beside them later.
		// The relaxation may treat the last 810 as optional (the last idle
		// GPU going before it arrives) and mix patterns: 700.
		{"810s then 300s", []sim.Pod{share(810), share(810), share(810), share(810), share(300), share(300)}, 700},
		// Four 700s open the GPUs; four later 300s fill them.
		{"700s then 300s", []sim.Pod{share(700), share(700), share(700), share(700), share(300), share(300), share(300), share(300)}, 0},
		// Three whole GPUs and an 810 (it leaves 190); mixing an 810
		// pattern with three 300s at 2/3 and 1/3 gives 160.
		{"whole and 810", []sim.Pod{whole, whole, whole, share(810), share(300)}, 160},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			order := make([]int, len(tc.pods))
			for i := range order {
				order[i] = i
			}
			sizes := fractionalShares(tc.pods)
			got, _, err := leastUnallocated(tc.pods, order, sizes, maximalPatterns(sizes, 1000), 4, 1, nil)
			if err != nil || math.Abs(got-tc.want) > 1e-6 {
				t.Errorf("least unallocated %v milli-GPU (%v), want %v", got, err, tc.want)
			}
		})
	}
}

// The GPU count bounds of an interval: two forced 810s need two GPUs, so
// with one GPU left by whole-GPU tasks there is no packing, and with two
// GPUs that must hold shares the two 810s leave 380 milli.
func TestBoundGPUCount(t *testing.T) {
	sizes := []int{810}
	patterns := maximalPatterns(sizes, 1000)
	iv := interval{forced: []float64{2}, optional: []float64{0}, binsMin: 0, binsMax: 1}
	if _, err := bound(iv, sizes, patterns); !errors.Is(err, errInfeasible) {
		t.Errorf("two 810s on at most one GPU: %v, want infeasible", err)
	}
	iv.binsMax = 2
	if w, err := bound(iv, sizes, patterns); err != nil || math.Abs(w-380) > 1e-6 {
		t.Errorf("two 810s on two GPUs: %v, %v; want 380", w, err)
	}
	// Three GPUs must be taken but only two 810s exist: the relaxation
	// counts the third as wholly unallocated (it never says less).
	iv.binsMin, iv.binsMax = 3, 3
	if w, err := bound(iv, sizes, patterns); err != nil || math.Abs(w-1380) > 1e-6 {
		t.Errorf("two 810s on three GPUs: %v, %v; want 1380", w, err)
	}
}

// On the Alibaba trace the bound is below what the simulator's policies
// leave (it holds for any policy) and well above nothing.
func TestBoundBelowPolicies(t *testing.T) {
	const dir = "../../../shared/traces/alibaba-gpu-2023"
	tr, err := sim.LoadTrace(dir, "default")
	if err != nil {
		t.Skipf("the Alibaba GPU trace is not at %s (research-use data, kept outside the repository): %v", dir, err)
	}
	var capGPUs int64
	for _, n := range tr.Nodes {
		capGPUs += int64(n.GPUs)
	}
	const seed = 42
	order, _ := sim.Arrivals(tr.Pods, tr.Nodes, seed, 1.3)
	sizes := fractionalShares(tr.Pods)
	w, _, err := leastUnallocated(tr.Pods, order, sizes, maximalPatterns(sizes, 1000), capGPUs, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	bestAlloc := 100 * (1 - w/float64(capGPUs*1000))
	if w < 150_000 {
		t.Errorf("bound %.1f GPUs unallocated: implausibly low (810-milli tasks alone leave about 185)", w/1000)
	}
	ex, err := sim.Simulate(context.Background(), tr, []string{"fgd", "kiln"}, []int64{seed}, sim.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ex.Runs {
		if r.Alloc130 > bestAlloc+0.005 {
			t.Errorf("%s allocates %.2f%% at 130%%, above the bound %.2f%%", r.Policy, r.Alloc130, bestAlloc)
		}
	}
}
