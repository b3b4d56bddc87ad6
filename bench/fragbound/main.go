// Command fragbound computes a lower bound on the GPU capacity that any
// placement policy leaves unallocated at the end of kiln sim's experiment
// (tasks in the seeded order of sim.Arrivals, inflated to 130% of the
// cluster's GPU capacity, no departures, a task that fits nowhere dropped),
// and prints it beside the allocation rate it allows.
//
//	go run ./bench/fragbound [--trace DIR] [--pods default] [--seeds 42-51]
//
// The bound ignores CPU, host memory and GPU models (every task fits any
// GPU by its share alone), so it says what the GPU shares of the trace
// allow, whatever the policy. It rests on one event: the moment T at which
// the last idle GPU is taken. Before T every task that asks for one GPU or
// less fits (an idle GPU is there), so every fractional task that arrives
// before T is placed; after T no GPU is opened, so the GPUs that hold
// fractional tasks at the end are those that held them at T, and only
// fractional tasks arriving after T can still join them. For each
// candidate T the program solves, as a linear program, the best packing:
// the cutting-stock relaxation over every way of filling one GPU with the
// trace's shares (Gilmore and Gomory), with all fractional tasks before T
// placed, any number of the later ones added, and as many GPUs as the
// whole-GPU tasks arrived before T leave (at least the one-GPU tasks must
// have had their own). The least unallocated capacity over all T is the
// bound.
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"

	"kiln.dev/kiln/sim"
)

func main() {
	trace := flag.String("trace", "../shared/traces/alibaba-gpu-2023", "folder of the Alibaba trace's CSV files")
	pods := flag.String("pods", "default", "pod list name (openb_pod_list_NAME.csv)")
	seeds := flag.String("seeds", "42-51", "seeds: a range a-b or a comma list")
	ratio := flag.Float64("ratio", 1.3, "arrived workload at the end, share of GPU capacity")
	step := flag.Float64("step", 0.1, "width of the arrival intervals the moment T is looked for in, percent of capacity")
	verbose := flag.Bool("v", false, "print each interval's bound")
	flag.Parse()
	ss, err := sim.ParseSeeds(*seeds)
	if err != nil {
		fail(err)
	}
	tr, err := sim.LoadTrace(*trace, *pods)
	if err != nil {
		fail(err)
	}
	var capGPUs int64
	for _, n := range tr.Nodes {
		capGPUs += int64(n.GPUs)
	}
	sizes := fractionalShares(tr.Pods)
	if len(sizes) == 0 {
		fail(fmt.Errorf("pod list %s has no fractional tasks: every GPU task takes whole GPUs, which leave nothing unallocated", *pods))
	}
	patterns := maximalPatterns(sizes, 1000)
	fmt.Printf("%s: %d GPUs, %d fractional shares, %d ways to fill a GPU\n", *pods, capGPUs, len(sizes), len(patterns))
	fmt.Printf("%6s %8s %14s %12s\n", "seed", "best T%", "unallocated", "alloc max %")
	var sum float64
	for _, seed := range ss {
		order, _ := sim.Arrivals(tr.Pods, tr.Nodes, seed, *ratio)
		var log func(interval, float64, error)
		if *verbose {
			log = func(iv interval, w float64, err error) {
				fmt.Fprintf(os.Stderr, "seed %d, last idle GPU at %.2f-%.2f%%: GPUs with shares %.0f-%.0f, unallocated >= %.1f GPUs (%v)\n",
					seed, iv.lo, iv.hi, iv.binsMin, iv.binsMax, w/1000, err)
			}
		}
		best, bestT, err := leastUnallocated(tr.Pods, order, sizes, patterns, capGPUs, *step, log)
		if err != nil {
			fail(fmt.Errorf("seed %d: %w", seed, err))
		}
		alloc := 100 * (1 - best/float64(capGPUs*1000))
		sum += alloc
		fmt.Printf("%6d %8.1f %10.1f GPUs %12.2f\n", seed, bestT, best/1000, alloc)
	}
	fmt.Printf("mean allocation at %.0f%% can be at most %.2f%%\n", *ratio*100, sum/float64(len(ss)))
}

// fractionalShares are the distinct shares of the fractional tasks among
// pods, increasing.
func fractionalShares(pods []sim.Pod) []int {
	var sizes []int
	for _, p := range pods {
		if p.Sharing() && !slices.Contains(sizes, int(p.GPUMilli)) {
			sizes = append(sizes, int(p.GPUMilli))
		}
	}
	slices.Sort(sizes)
	return sizes
}

// leastUnallocated is the bound for one arrival order: the least
// unallocated milli-GPU over every interval the last idle GPU can go in,
// and where that interval starts (percent arrived). An interval whose
// program cannot be solved is an error, not skipped: the bound must cover
// every interval. log, when not nil, sees each interval solved.
func leastUnallocated(pods []sim.Pod, order []int, sizes []int, patterns [][]int, capGPUs int64, step float64, log func(interval, float64, error)) (float64, float64, error) {
	best, bestT := math.Inf(1), 0.0
	// Cheap bound first (the GPUs that must hold fractional tasks less all
	// the fractional work there is); the linear program only where that
	// bound leaves room below the best so far.
	ivs := intervals(pods, order, sizes, capGPUs, step)
	for i := range ivs {
		var all float64
		for k, z := range sizes {
			all += (ivs[i].forced[k] + ivs[i].optional[k]) * float64(z)
		}
		ivs[i].cheap = 1000*ivs[i].binsMin - all
	}
	slices.SortFunc(ivs, func(a, b interval) int { return cmp.Compare(a.cheap, b.cheap) })
	for _, iv := range ivs {
		if iv.cheap >= best {
			break
		}
		w, err := bound(iv, sizes, patterns)
		if log != nil {
			log(iv, w, err)
		}
		switch {
		case errors.Is(err, errInfeasible):
			continue
		case err != nil:
			return 0, 0, fmt.Errorf("arrivals %.2f-%.2f%%: %w", iv.lo, iv.hi, err)
		}
		if w < best {
			best, bestT = w, iv.lo
		}
	}
	if math.IsInf(best, 1) {
		return 0, 0, errors.New("no interval admits a packing")
	}
	return best, bestT, nil
}

// interval is what holds when the last idle GPU goes with an arrival
// between two points: fractional tasks arrived before the first must have
// been placed (forced), those after it may have been (optional), and the
// GPUs holding fractional tasks lie between binsMin and binsMax.
type interval struct {
	lo, hi           float64 // percent of capacity arrived
	forced, optional []float64
	binsMin, binsMax float64
	cheap            float64 // a quick lower bound: see leastUnallocated
}

// intervals cuts the arrivals into pieces of step percent of capacity.
// For the last idle GPU going at arrival T in [a, b): every fractional
// task before a was placed (an idle GPU was there); tasks after a may be
// placed or not; at T no GPU is idle, so the GPUs with fractional tasks are
// the capacity less the whole GPUs placed, which are at most all whole-GPU
// requests up to b and at least the one-GPU requests before a.
func intervals(pods []sim.Pod, order []int, sizes []int, capGPUs int64, step float64) []interval {
	n := len(sizes)
	frac := func(p sim.Pod) int {
		if p.Sharing() {
			return slices.Index(sizes, int(p.GPUMilli))
		}
		return -1
	}
	total := make([]float64, n)
	for _, i := range order {
		if k := frac(pods[i]); k >= 0 {
			total[k]++
		}
	}
	var out []interval
	forced := make([]float64, n)
	var arrived, one, whole int64
	j := 0
	capMilli := float64(capGPUs * 1000)
	for j < len(order) {
		cur := interval{lo: float64(arrived) / capMilli * 100, forced: slices.Clone(forced), binsMax: float64(capGPUs - one)}
		cur.optional = make([]float64, n)
		for k := range n {
			cur.optional[k] = total[k] - forced[k]
		}
		limit := arrived + int64(step/100*capMilli)
		for j < len(order) && (arrived < limit || arrived == 0) {
			p := pods[order[j]]
			arrived += p.GPUTotal()
			if k := frac(p); k >= 0 {
				forced[k]++
			} else if p.GPUTotal() > 0 {
				whole += int64(p.GPUs)
				if p.GPUs == 1 {
					one++
				}
			}
			j++
		}
		cur.hi = float64(arrived) / capMilli * 100
		cur.binsMin = float64(max(capGPUs-whole, 0))
		out = append(out, cur)
	}
	return out
}

// bound is the least unallocated milli-GPU at the end over the packings
// iv allows (errInfeasible when none does).
func bound(iv interval, sizes []int, patterns [][]int) (float64, error) {
	n := len(sizes)
	// Shares with optional tasks get two variables (placed, left) and a
	// row; the others none (a row y + u = 0 makes the simplex cycle).
	var opt []int
	for k := range n {
		if iv.optional[k] > 0 {
			opt = append(opt, k)
		}
	}
	// Variables: x (patterns), y (optional tasks placed), s (cover
	// surplus), u (optional tasks left), v and w (GPU count slacks).
	np, no := len(patterns), len(opt)
	yAt, sAt, uAt, vAt := np, np+no, np+no+n, np+2*no+n
	nv := vAt + 2
	rows := n + no + 2
	binRow := n + no
	A := make([][]float64, rows)
	for r := range A {
		A[r] = make([]float64, nv)
	}
	b := make([]float64, rows)
	c := make([]float64, nv)
	for j, pat := range patterns {
		c[j] = 1000
		for k, cnt := range pat {
			A[k][j] = float64(cnt)
		}
		A[binRow][j] = 1
		A[binRow+1][j] = 1
	}
	var placed float64
	for k := range n {
		placed += iv.forced[k] * float64(sizes[k])
		A[k][sAt+k] = -1 // cover: sum a x - y - s = forced
		b[k] = iv.forced[k]
	}
	for i, k := range opt {
		c[yAt+i] = -float64(sizes[k])
		A[k][yAt+i] = -1
		A[n+i][yAt+i] = 1 // optional: y + u = optional
		A[n+i][uAt+i] = 1
		b[n+i] = iv.optional[k]
	}
	A[binRow][vAt] = 1 // sum x + v = binsMax
	b[binRow] = iv.binsMax
	A[binRow+1][vAt+1] = -1 // sum x - w = binsMin
	b[binRow+1] = iv.binsMin
	v, err := simplex(A, b, c)
	if err != nil {
		return 0, err
	}
	return v - placed, nil
}

// maximalPatterns lists the multisets of sizes (counts per size) that sum
// to at most capacity and leave less than the smallest size.
func maximalPatterns(sizes []int, capacity int) [][]int {
	var out [][]int
	cur := make([]int, len(sizes))
	var rec func(i, left int)
	rec = func(i, left int) {
		if i < 0 {
			if left < sizes[0] {
				out = append(out, slices.Clone(cur))
			}
			return
		}
		for k := left / sizes[i]; k >= 0; k-- {
			cur[i] = k
			rec(i-1, left-k*sizes[i])
		}
		cur[i] = 0
	}
	rec(len(sizes)-1, capacity)
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fragbound:", err)
	os.Exit(1)
}
