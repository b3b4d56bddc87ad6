package lease

import (
	"math"
	"time"
)

// Weighted fair share. A project's usage is GPU-seconds: those of its
// ended leases, decayed with a half-life of Config.FairShareWindow, plus
// what its running leases have used so far, plus what they are expected to
// use still (GPUs held times the typical lease length, learnt from the
// leases that ended). The queue serves the project with the least usage
// per unit of weight; so a project that just ran a large lease waits until
// the others caught up, and usage tracks the weights over the window, not
// only the GPUs held at one instant.

// heldSince records a granted lease in its project's running usage.
func (s *Core) heldSince(ps *projState, ls *leaseState, granted time.Time) {
	ps.held += ls.need
	ps.startSum += ls.need * s.rel(granted)
}

// released takes an ended lease out of its project's running usage and
// returns the GPU-seconds it used.
func (s *Core) released(ps *projState, ls *leaseState, granted, now time.Time) float64 {
	ps.held -= ls.need
	ps.startSum -= ls.need * s.rel(granted)
	if ps.held < 1e-9 {
		ps.held, ps.startSum = 0, 0
	}
	d := now.Sub(granted).Seconds()
	if d < 0 {
		d = 0
	}
	s.learnLength(d)
	return ls.need * d
}

// rel is t in seconds since the server started (small numbers keep the
// sums exact).
func (s *Core) rel(t time.Time) float64 { return t.Sub(s.started).Seconds() }

// learnLength folds an ended lease's length into the typical one: the mean
// of the first leases, then a moving average of the last few dozen.
func (s *Core) learnLength(d float64) {
	s.lengthN = min(s.lengthN+1, 32)
	s.length += (d - s.length) / float64(s.lengthN)
}

// typicalLength is how long a lease is expected to run, in seconds: learnt
// from ended leases; before any ended, a tenth of the fair-share window.
func (s *Core) typicalLength() float64 {
	if s.lengthN == 0 {
		return s.cfg.FairShareWindow.Seconds() / 10
	}
	return s.length
}

// usage is a project's GPU-seconds as the queue weighs them.
func (s *Core) usage(ps *projState, now time.Time) float64 {
	s.decay(ps, now)
	running := max(ps.held*s.rel(now)-ps.startSum, 0)
	return ps.recent + running + ps.held*s.typicalLength()
}

// fairKey orders projects: usage per unit of weight. The project furthest
// below its share goes first.
func (s *Core) fairKey(ps *projState, now time.Time) float64 {
	return s.usage(ps, now) / weightOf(ps)
}

// keyWith is the project's key if it were granted need more GPUs.
func (s *Core) keyWith(ps *projState, need float64, now time.Time) float64 {
	return s.fairKey(ps, now) + need*s.typicalLength()/weightOf(ps)
}

func weightOf(ps *projState) float64 {
	if ps.p.Weight <= 0 {
		return 1
	}
	return ps.p.Weight
}

// decay ages the usage of ended leases.
func (s *Core) decay(ps *projState, now time.Time) {
	dt := now.Sub(ps.recentAt).Seconds()
	if dt <= 0 {
		return
	}
	ps.recent *= math.Exp2(-dt / s.cfg.FairShareWindow.Seconds())
	ps.recentAt = now
}
