package server

import (
	"sync"
	"time"

	"kiln.dev/kiln/api"
)

// history keeps, per node and GPU, the readings agents send with their
// heartbeats: the last one, and an hour of points, one per historyStep,
// for the web page. It has a lock of its own: an idle agent's heartbeat
// records its samples without the server's lock.
type history struct {
	mu     sync.Mutex
	nodes  map[string]map[int]*gpuHistory
	notify chan struct{} // closed and replaced when new readings came, at most once a second
	last   time.Time
}

const (
	historyStep   = 15 * time.Second
	historyPoints = int(time.Hour / historyStep)
)

// point is one reading; a value the GPU did not give is NaN-free absent
// (has says which are set).
type point struct {
	at                       int64 // Unix seconds
	util, power, temp        float32
	mem                      uint64
	procs                    int32
	hasUtil, hasPower, hasTp bool
	hasMem, hasProcs         bool
}

type gpuHistory struct {
	ring [historyPoints]point
	n    int // points held
	next int // where the next goes
	last point
	// since is when the point being gathered began, in Unix nanoseconds:
	// a time.Time holds a pointer, which would make the collector scan
	// every GPU's hour of points (9.6 KB) at each cycle; without one the
	// object is not scanned at all.
	since int64
}

func newHistory() *history {
	return &history{nodes: map[string]map[int]*gpuHistory{}, notify: make(chan struct{})}
}

func pointOf(s api.GPUSample, now time.Time) point {
	p := point{at: now.Unix()}
	if s.Utilization != nil {
		p.util, p.hasUtil = float32(*s.Utilization), true
	}
	if s.PowerW != nil {
		p.power, p.hasPower = float32(*s.PowerW), true
	}
	if s.TemperatureC != nil {
		p.temp, p.hasTp = float32(*s.TemperatureC), true
	}
	if s.MemoryUsedBytes != nil {
		p.mem, p.hasMem = *s.MemoryUsedBytes, true
	}
	if s.Processes != nil {
		p.procs, p.hasProcs = int32(*s.Processes), true
	}
	return p
}

// record keeps a node's readings; a new point enters the hour's ring once
// per historyStep (the last reading of the step).
func (h *history) record(node string, ss []api.GPUSample, now time.Time) {
	if len(ss) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	gs := h.nodes[node]
	if gs == nil {
		gs = map[int]*gpuHistory{}
		h.nodes[node] = gs
	}
	for _, s := range ss {
		g := gs[s.GPU]
		if g == nil {
			g = &gpuHistory{since: now.UnixNano()}
			gs[s.GPU] = g
		}
		g.last = pointOf(s, now)
		if now.Sub(time.Unix(0, g.since)) >= historyStep || g.n == 0 {
			g.ring[g.next] = g.last
			g.next = (g.next + 1) % historyPoints
			g.n = min(g.n+1, historyPoints)
			g.since = now.UnixNano()
		}
	}
	if now.Sub(h.last) >= time.Second {
		h.last = now
		close(h.notify)
		h.notify = make(chan struct{})
	}
}

// changed is closed when readings come.
func (h *history) changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.notify
}

// latest is a node's last reading per GPU index.
func (h *history) latest(node string) map[int]point {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int]point{}
	for i, g := range h.nodes[node] {
		out[i] = g.last
	}
	return out
}

// series is a GPU's hour of points, oldest first.
func (h *history) series(node string, gpu int) []point {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.nodes[node][gpu]
	if g == nil {
		return nil
	}
	out := make([]point, 0, g.n)
	for k := 0; k < g.n; k++ {
		out = append(out, g.ring[(g.next-g.n+k+historyPoints)%historyPoints])
	}
	return out
}

// forget drops a node's readings (it was forgotten).
func (h *history) forget(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.nodes, node)
}
