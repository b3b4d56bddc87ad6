package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"text/tabwriter"
)

// ReplayResult is one policy's result in replay mode.
type ReplayResult struct {
	Trace  string `json:"trace"`
	Policy string `json:"policy"`
	// Tasks is the number of tasks replayed; Dropped those that fit on no
	// node even when the cluster is empty.
	Tasks   int `json:"tasks"`
	Dropped int `json:"dropped"`
	// AvgAlloc is the time-averaged GPU allocation rate (percent of the
	// cluster's milli-GPU) from the first arrival to the last one.
	AvgAlloc float64 `json:"avg_gpu_alloc"`
	// PeakAlloc is the highest allocation rate reached, percent.
	PeakAlloc float64 `json:"peak_gpu_alloc"`
	// Waited is the number of tasks that queued at all; the waits are in
	// seconds of trace time, over all tasks that ran.
	Waited   int     `json:"waited"`
	MeanWait float64 `json:"mean_wait_s"`
	P95Wait  float64 `json:"p95_wait_s"`
	MaxWait  float64 `json:"max_wait_s"`
	// GPUMeanWait is the mean wait of the tasks that ask for GPUs.
	GPUMeanWait float64 `json:"gpu_mean_wait_s"`
}

// running is a task that holds resources until end.
type running struct {
	end  int64
	task int
	node int
	gpus []int
}

type endHeap []running

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(running)) }
func (h *endHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Replay runs the trace in its own time: each task arrives at its creation
// time (divided by opt.Speedup when it is above 1, to load the cluster)
// and runs for as long as it ran in the production cluster (deletion
// minus scheduling time; deletion minus creation for tasks that never got
// scheduled there). A task that fits nowhere waits in a queue; whenever
// resources free up or tasks arrive, the queue is scanned in arrival order
// and every task that fits starts (first come first served with backfill).
// seed sets the fixed node order that breaks ties between equal scores.
func Replay(ctx context.Context, tr *Trace, policies []string, seed int64, opt Options) ([]ReplayResult, error) {
	var idx []int
	for i, p := range tr.Pods {
		if p.Created >= 0 && p.Deleted >= 0 {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil, fmt.Errorf("pod list %s has no creation_time and deletion_time: replay needs them", tr.Name)
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		if c := tr.Pods[a].Created - tr.Pods[b].Created; c != 0 {
			if c < 0 {
				return -1
			}
			return 1
		}
		return strings.Compare(tr.Pods[a].Name, tr.Pods[b].Name)
	})
	p := prepare(tr, opt.Coverage)
	if opt.Speedup > 1 {
		tr = compress(tr, idx, opt.Speedup)
		p.trace = tr
	}
	_, rank := Arrivals(tr.Pods, tr.Nodes, seed, 0)
	out := make([]ReplayResult, len(policies))
	errs := make([]error, len(policies))
	sem := make(chan struct{}, max(1, workers(opt)))
	done := make(chan int)
	for k, name := range policies {
		go func() {
			sem <- struct{}{}
			out[k], errs[k] = p.replay(ctx, name, seed, idx, rank)
			<-sem
			done <- k
		}()
	}
	for range policies {
		<-done
	}
	return out, errors.Join(errs...)
}

func (p *prepared) replay(ctx context.Context, name string, seed int64, arrivals, rank []int) (ReplayResult, error) {
	res := ReplayResult{Trace: p.trace.Name, Policy: name, Tasks: len(arrivals)}
	c := newCluster(p.trace.Nodes, p.target)
	e := &env{c: c, rng: rand.New(rand.NewPCG(uint64(seed), policySalt(name))), shapes: p.shapes, memShapes: p.memShapes, target: p.target, tasks: Tasks(p.trace.Pods)}
	pol := newPolicy(name, e)
	empty := newCluster(p.trace.Nodes, p.target)
	everFits := map[int]bool{} // by task shape
	fitsEmpty := func(t *task) bool {
		if v, ok := everFits[t.shape]; ok && t.Memory == 0 {
			return v
		}
		for i := range empty.nodes {
			if empty.fits(i, t) {
				everFits[t.shape] = true
				return true
			}
		}
		return false
	}
	pods := p.trace.Pods
	var queue []int // task indices waiting, in arrival order
	var ends endHeap
	var waits, gpuWaits []float64
	t0, tLast := window(p.trace, arrivals)
	var area float64 // allocated milli-GPU x seconds
	now := pods[arrivals[0]].Created
	advance := func(to int64) {
		if to > now {
			lo, hi := max(now, t0), min(to, tLast)
			if hi > lo {
				area += float64(c.allocated) * float64(hi-lo)
			}
			now = to
		}
	}
	schedule := func() {
		failed := map[[2]int64]bool{}
		kept := queue[:0]
		for _, ti := range queue {
			t := &p.tasks[ti]
			key := [2]int64{int64(t.shape), t.Memory}
			if failed[key] {
				kept = append(kept, ti)
				continue
			}
			node := place(c, pol, rank, t)
			if node < 0 {
				failed[key] = true
				kept = append(kept, ti)
				continue
			}
			// place chose the GPUs; read them back from the node's change.
			w := float64(now - pods[ti].Created)
			waits = append(waits, w)
			if t.WantsGPU() {
				gpuWaits = append(gpuWaits, w)
			}
			if w > 0 {
				res.Waited++
			}
			heap.Push(&ends, running{end: now + duration(pods[ti]), task: ti, node: node, gpus: c.lastGPUs})
			res.PeakAlloc = max(res.PeakAlloc, 100*float64(c.allocated)/float64(c.capacity))
		}
		queue = kept
	}
	k := 0
	for k < len(arrivals) || len(ends) > 0 {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		next := int64(math.MaxInt64)
		if k < len(arrivals) {
			next = pods[arrivals[k]].Created
		}
		if len(ends) > 0 && ends[0].end < next {
			next = ends[0].end
		}
		advance(next)
		for len(ends) > 0 && ends[0].end <= now {
			r := heap.Pop(&ends).(running)
			c.remove(r.node, &p.tasks[r.task], r.gpus)
		}
		for k < len(arrivals) && pods[arrivals[k]].Created <= now {
			ti := arrivals[k]
			k++
			if !fitsEmpty(&p.tasks[ti]) {
				res.Dropped++
				continue
			}
			queue = append(queue, ti)
		}
		schedule()
		if k == len(arrivals) && len(ends) == 0 && len(queue) > 0 {
			return res, fmt.Errorf("replay %s: %d task(s) can never start", name, len(queue))
		}
	}
	if span := tLast - t0; span > 0 {
		res.AvgAlloc = 100 * area / float64(span) / float64(c.capacity)
	}
	res.MeanWait, _ = meanSD(waits)
	res.GPUMeanWait, _ = meanSD(gpuWaits)
	if len(waits) > 0 {
		slices.Sort(waits)
		res.P95Wait = waits[int(math.Ceil(0.95*float64(len(waits))))-1]
		res.MaxWait = waits[len(waits)-1]
	}
	return res, nil
}

// compress returns a copy of tr whose arrivals come f times faster;
// run times stay. idx are the tasks with times, in arrival order.
func compress(tr *Trace, idx []int, f float64) *Trace {
	if f <= 1 {
		return tr
	}
	out := *tr
	out.Pods = slices.Clone(tr.Pods)
	first := tr.Pods[idx[0]].Created
	for _, i := range idx {
		p := &out.Pods[i]
		d := duration(*p)
		p.Created = first + int64(float64(p.Created-first)/f)
		p.Scheduled = p.Created
		p.Deleted = p.Created + d
	}
	return &out
}

// window is the busy part of the trace that loads and averages are
// measured over: from the arrival of the fiftieth part of the tasks to
// the last arrival (a few tasks come months before the rest).
func window(tr *Trace, idx []int) (int64, int64) {
	return tr.Pods[idx[len(idx)/50]].Created, tr.Pods[idx[len(idx)-1]].Created
}

// duration is how long a task held its resources in the production cluster.
func duration(p Pod) int64 {
	start := p.Created
	if p.Scheduled >= start {
		start = p.Scheduled
	}
	return max(p.Deleted-start, 1)
}

func workers(opt Options) int {
	if opt.Workers > 0 {
		return opt.Workers
	}
	return defaultWorkers()
}

// WriteReplayTable writes replay results as a table.
func WriteReplayTable(w io.Writer, res []ReplayResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\tpolicy\tavg GPU alloc\tpeak\ttasks queued\tmean wait\tGPU tasks' mean wait\tp95 wait\tmax wait\tdropped\t")
	for _, r := range res {
		fmt.Fprintf(tw, "%s\t%s\t%.2f%%\t%.2f%%\t%d/%d\t%s\t%s\t%s\t%s\t%d\t\n", r.Trace, r.Policy, r.AvgAlloc, r.PeakAlloc, r.Waited, r.Tasks,
			human(r.MeanWait), human(r.GPUMeanWait), human(r.P95Wait), human(r.MaxWait), r.Dropped)
	}
	return tw.Flush()
}

// human writes seconds as s, min, h or d.
func human(s float64) string {
	switch {
	case s < 120:
		return fmt.Sprintf("%.0f s", s)
	case s < 7200:
		return fmt.Sprintf("%.1f min", s/60)
	case s < 172800:
		return fmt.Sprintf("%.1f h", s/3600)
	}
	return fmt.Sprintf("%.1f d", s/86400)
}
