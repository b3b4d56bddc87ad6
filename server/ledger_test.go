package server_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"kiln.dev/kiln/executor"
)

// ledger is the test's own record of which process held which GPU when,
// kept by the executor on each node: a GPU granted twice shows up here as
// two processes on one device at once, whatever the server believes.
type ledger struct {
	mu         sync.Mutex
	held       map[string]map[string]int // node/device -> job -> milli
	violations []string
	intervals  []interval
}

type interval struct {
	project    string
	job        string
	gpus       float64
	start, end time.Time
}

func newLedger() *ledger { return &ledger{held: map[string]map[string]int{}} }

func (l *ledger) take(node string, job executor.Job) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range job.Devices {
		key := node + "/" + d.CDIName
		milli := 1000
		if d.Share != nil {
			milli = d.Share.MilliGPU
		}
		m := l.held[key]
		if m == nil {
			m = map[string]int{}
			l.held[key] = m
		}
		sum := milli
		whole := d.Share == nil
		for other, om := range m {
			sum += om
			if whole || om == 1000 {
				l.violations = append(l.violations, fmt.Sprintf("%s: job %s started while job %s holds it", key, job.ID, other))
			}
		}
		if sum > 1000 {
			l.violations = append(l.violations, fmt.Sprintf("%s: shares add up to %d‰ with job %s", key, sum, job.ID))
		}
		m[job.ID] = milli
	}
}

func (l *ledger) give(node string, job executor.Job, start time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	gpus := 0.0
	for _, d := range job.Devices {
		delete(l.held[node+"/"+d.CDIName], job.ID)
		if d.Share != nil {
			gpus += float64(d.Share.MilliGPU) / 1000
		} else {
			gpus++
		}
	}
	l.intervals = append(l.intervals, interval{project: job.Env["KILN_PROJECT"], job: job.ID, gpus: gpus, start: start, end: time.Now()})
}

// usage is GPU-seconds per project inside [from, to].
func (l *ledger) usage(from, to time.Time) map[string]float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]float64{}
	for _, iv := range l.intervals {
		s, e := iv.start, iv.end
		if s.Before(from) {
			s = from
		}
		if e.After(to) {
			e = to
		}
		if e.After(s) {
			out[iv.project] += iv.gpus * e.Sub(s).Seconds()
		}
	}
	return out
}

// recording wraps an executor and keeps the ledger.
type recording struct {
	node  string
	inner executor.Executor
	l     *ledger
}

func (r *recording) Name() string { return r.inner.Name() }

func (r *recording) Start(ctx context.Context, job executor.Job) (executor.Handle, error) {
	r.l.take(r.node, job)
	h, err := r.inner.Start(ctx, job)
	if err != nil {
		r.l.give(r.node, job, time.Now())
		return nil, err
	}
	return &recHandle{Handle: h, r: r, job: job, start: time.Now()}, nil
}

type recHandle struct {
	executor.Handle
	r     *recording
	job   executor.Job
	start time.Time
	once  sync.Once
}

func (h *recHandle) Wait(ctx context.Context) (executor.Exit, error) {
	ex, err := h.Handle.Wait(ctx)
	if err == nil {
		h.once.Do(func() { h.r.l.give(h.r.node, h.job, h.start) })
	}
	return ex, err
}
