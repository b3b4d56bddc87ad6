package sim

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"

	"kiln.dev/kiln/sched/frag"
)

// Options set up the experiment.
type Options struct {
	// Ratio is how far the workload is inflated: the total GPU request of
	// the submitted tasks, as a multiple of the cluster's GPU capacity
	// (the paper: 1.3).
	Ratio float64
	// Coverage is the share of tasks the target workload's shapes cover
	// (the paper: 0.95).
	Coverage float64
	// Workers runs that many simulations at once (0: one per CPU).
	Workers int
	// Speedup, in replay mode, makes arrivals come this many times faster
	// while tasks run as long as in the trace (<= 1: the trace's pace).
	Speedup float64
}

// DefaultOptions are the paper's settings.
func DefaultOptions() Options { return Options{Ratio: 1.3, Coverage: 0.95} }

// Point is one point of a run's curve at an arrived workload.
type Point struct {
	// Arrived is the GPU request of the tasks submitted so far, in
	// percent of the cluster's GPU capacity.
	Arrived int `json:"arrived"`
	// Alloc is the allocated share of the cluster's GPU capacity, percent.
	Alloc float64 `json:"alloc"`
	// Frag is the fragment share of the free GPU capacity, percent.
	Frag float64 `json:"frag"`
	// Unallocated is the free GPU capacity in GPUs.
	Unallocated float64 `json:"unallocated_gpus"`
	// Samples is the number of task events the point averages (0: none).
	Samples int `json:"-"`
}

// Run is one simulation: one policy, one seed.
type Run struct {
	Policy   string  `json:"policy"`
	Seed     int64   `json:"seed"`
	Tasks    int     `json:"tasks"`
	Failed   int     `json:"failed"`
	Alloc100 float64 `json:"alloc_100"`
	Alloc130 float64 `json:"alloc_130"`
	Curve    []Point `json:"curve,omitempty"`
}

// prepared is a trace ready to simulate: tasks with shape ids and model
// masks, and the paper's target workload.
type prepared struct {
	trace     *Trace
	tasks     []task
	shapes    int
	memShapes int
	target    *frag.Workload
	capacity  int64
}

func prepare(tr *Trace, coverage float64) *prepared {
	p := &prepared{trace: tr, tasks: make([]task, len(tr.Pods))}
	p.target = frag.TargetWorkload(Tasks(tr.Pods), coverage, frag.ByCount)
	c := newCluster(tr.Nodes, p.target)
	p.capacity = c.capacity
	ids, memIDs := map[string]int{}, map[string]int{}
	for i, pod := range tr.Pods {
		key := fmt.Sprintf("%d/%d/%d/%s", pod.CPU, pod.GPUs, pod.GPUMilli, strings.Join(pod.Models, "|"))
		id, ok := ids[key]
		if !ok {
			id = len(ids)
			ids[key] = id
		}
		key += fmt.Sprintf("/%d", pod.Memory)
		mid, ok := memIDs[key]
		if !ok {
			mid = len(memIDs)
			memIDs[key] = mid
		}
		p.tasks[i] = task{Task: pod.Task, shape: id, models: c.modelMask(pod.Task), memShape: mid}
	}
	p.shapes, p.memShapes = len(ids), len(memIDs)
	return p
}

// simulate runs one policy over the tasks in order.
func (p *prepared) simulate(ctx context.Context, name string, seed int64, order, rank []int, memo *frag.Memo, pctMax int) (Run, error) {
	c := newClusterMemo(p.trace.Nodes, memo)
	e := &env{c: c, rng: rand.New(rand.NewPCG(uint64(seed), policySalt(name))), shapes: p.shapes, memShapes: p.memShapes, target: p.target, tasks: Tasks(p.trace.Pods)}
	pol := newPolicy(name, e)
	run := Run{Policy: name, Seed: seed, Tasks: len(order)}
	acc := newCurve(pctMax)
	var arrived int64
	for k, idx := range order {
		if k%512 == 0 && ctx.Err() != nil {
			return run, ctx.Err()
		}
		t := &p.tasks[idx]
		arrived += t.GPUTotal()
		chosen := place(c, pol, rank, t)
		if chosen < 0 {
			run.Failed++
		}
		acc.add(arrived, c)
	}
	run.Curve = acc.points()
	run.Alloc100 = acc.at(100)
	run.Alloc130 = acc.at(130)
	return run, nil
}

// place schedules t: filter, score, pick the best (the node of lowest rank
// among equal scores, as the authors' scheduler does), choose GPUs, bind.
// It returns the node, or -1 when t fits nowhere.
func place(c *cluster, pol policy, rank []int, t *task) int {
	best := math.Inf(-1)
	chosen := -1
	for i := range c.nodes {
		if !c.fits(i, t) {
			continue
		}
		s := pol.score(i, t)
		if s > best || (s == best && rank[i] < rank[chosen]) {
			best, chosen = s, i
		}
	}
	if chosen < 0 {
		return -1
	}
	c.place(chosen, t, pol.gpus(chosen, t))
	return chosen
}

func policySalt(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// curve accumulates per-event measurements into whole-percent buckets of
// arrived workload, the way the authors' analysis does: an event belongs
// to the bucket its arrived percentage rounds to (half to even), and a
// bucket with no event borrows the events of its neighbours.
type curve struct {
	n           []int
	alloc, frag []float64
	unalloc     []float64
}

func newCurve(pctMax int) *curve {
	return &curve{n: make([]int, pctMax+1), alloc: make([]float64, pctMax+1), frag: make([]float64, pctMax+1), unalloc: make([]float64, pctMax+1)}
}

func (a *curve) add(arrived int64, c *cluster) {
	gpus := float64(c.capacity / frag.MilliPerGPU)
	pct := math.RoundToEven(float64(arrived) / gpus / 10)
	if pct < 0 || int(pct) >= len(a.n) {
		return
	}
	b := int(pct)
	a.n[b]++
	a.alloc[b] += math.Round(float64(c.allocated)/gpus/10*100) / 100
	a.frag[b] += 100 * c.fragRatio()
	a.unalloc[b] += float64(c.capacity-c.allocated) / frag.MilliPerGPU
}

func (a *curve) points() []Point {
	var out []Point
	for x := range a.n {
		n, al, fr, un := a.n[x], a.alloc[x], a.frag[x], a.unalloc[x]
		if n == 0 {
			for _, y := range []int{x - 1, x + 1} {
				if y >= 0 && y < len(a.n) {
					n += a.n[y]
					al += a.alloc[y]
					fr += a.frag[y]
					un += a.unalloc[y]
				}
			}
		}
		if n == 0 {
			continue
		}
		f := float64(n)
		out = append(out, Point{Arrived: x, Alloc: al / f, Frag: fr / f, Unallocated: un / f, Samples: n})
	}
	return out
}

// at is the allocation at arrived workload x percent (NaN if no event).
func (a *curve) at(x int) float64 {
	for _, p := range a.points() {
		if p.Arrived == x {
			return p.Alloc
		}
	}
	return math.NaN()
}

// Experiment is the result of Simulate: every run and a summary per policy.
type Experiment struct {
	Trace   string    `json:"trace"`
	Nodes   int       `json:"nodes"`
	GPUs    int64     `json:"gpus"`
	Tasks   int       `json:"trace_tasks"`
	Target  int       `json:"target_shapes"`
	Seeds   []int64   `json:"seeds"`
	Summary []Summary `json:"summary"`
	Runs    []Run     `json:"runs"`
}

// Simulate runs every policy with every seed on the trace, in parallel.
func Simulate(ctx context.Context, tr *Trace, policies []string, seeds []int64, opt Options) (*Experiment, error) {
	if opt.Coverage <= 0 || opt.Coverage > 1 {
		return nil, fmt.Errorf("coverage %g: want a share in (0, 1]", opt.Coverage)
	}
	p := prepare(tr, opt.Coverage)
	pctMax := int(math.Round(opt.Ratio * 100))
	if pctMax < 100 {
		pctMax = 100
	}
	orders := make([][]int, len(seeds))
	ranks := make([][]int, len(seeds))
	for i, s := range seeds {
		orders[i], ranks[i] = Arrivals(tr.Pods, tr.Nodes, s, opt.Ratio)
	}
	type job struct{ pol, seed int }
	jobs := make(chan job)
	runs := make([]Run, len(policies)*len(seeds))
	workers := workers(opt)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			memo := frag.NewMemo(p.target)
			for j := range jobs {
				r, err := p.simulate(ctx, policies[j.pol], seeds[j.seed], orders[j.seed], ranks[j.seed], memo, pctMax)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				runs[j.pol*len(seeds)+j.seed] = r
			}
		}()
	}
	// Slow policies first so the pool drains evenly.
	var all []job
	for pi := range policies {
		for si := range seeds {
			all = append(all, job{pi, si})
		}
	}
	slices.SortStableFunc(all, func(a, b job) int { return cost(policies[b.pol]) - cost(policies[a.pol]) })
	for _, j := range all {
		if ctx.Err() != nil {
			break
		}
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	ex := &Experiment{Trace: tr.Name, Nodes: len(tr.Nodes), GPUs: p.capacity / frag.MilliPerGPU, Tasks: len(tr.Pods), Target: len(p.target.Shapes), Seeds: seeds, Runs: runs}
	for pi, name := range policies {
		ex.Summary = append(ex.Summary, summarize(name, runs[pi*len(seeds):(pi+1)*len(seeds)]))
	}
	return ex, nil
}

func cost(policy string) int {
	switch policy {
	case "kiln":
		return 3
	case "fgd":
		return 2
	}
	return 1
}

func defaultWorkers() int { return runtime.GOMAXPROCS(0) }
