package lease

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"kiln.dev/kiln/api"
)

// A deployment's engine (a serving lease's job) is started again when it
// ends while its lease is granted, after a backoff that doubles with each
// quick failure in a row, as a restart policy does; an engine that keeps
// failing ends its lease with the reason.
const (
	// engineBackoff is the first wait; each quick failure in a row
	// doubles it, up to engineBackoffMax.
	engineBackoff    = time.Second
	engineBackoffMax = 5 * time.Minute
	// engineSettled is how long an engine must run for its next end to
	// count as the first failure again.
	engineSettled = 10 * time.Minute
	// engineMaxFailures quick failures in a row end the lease.
	engineMaxFailures = 10
)

// serveState is what the core keeps of a serving lease's engine, in
// memory: a server that starts again starts the count again.
type serveState struct {
	failures  int       // quick failures in a row
	restartAt time.Time // when the engine is started again; zero: not waiting
}

// isEngine says whether the job is the lease's engine (its request's job,
// or one started again from it).
func isEngine(ls *leaseState, js *jobState) bool {
	return ls.l.Request.Job != nil && sameSpec(js.j.Spec, *ls.l.Request.Job)
}

func sameSpec(a, b api.JobSpec) bool {
	return slices.Equal(a.Command, b.Command) && a.Image == b.Image && a.WorkDir == b.WorkDir &&
		slices.Equal(a.Ports, b.Ports) && maps.Equal(a.Env, b.Env)
}

// engineEnded is called when a granted serving lease's engine has ended:
// it is started again after the backoff, or the lease ends when it failed
// quickly too many times in a row.
func (s *Core) engineEnded(ls *leaseState, js *jobState, code int, reason string, now time.Time, b *Changes) {
	st := &ls.serve
	if js.j.Started != nil && now.Sub(*js.j.Started) >= engineSettled {
		st.failures = 0
	}
	st.failures++
	what := fmt.Sprintf("code %d", code)
	if reason != "" && reason != "exited" {
		what += " (" + reason + ")"
	}
	if st.failures >= engineMaxFailures {
		st.restartAt = time.Time{}
		s.stopLease(ls, api.LeaseDone, fmt.Sprintf("its engine ended %d times in a row, each within %s of its start; the last with %s (kiln logs %s)",
			st.failures, engineSettled, what, js.j.ID), s.cfg.PreemptGrace, now, b)
		return
	}
	delay := min(engineBackoff<<(st.failures-1), engineBackoffMax)
	st.restartAt = now.Add(delay)
	b.Event("deployment.restarting", ls.l.ID, ls.l.Project, "the engine of %s (job %s) ended with %s; it starts again in %s (failure %d in a row)",
		ls.l.Request.Serve.Model, js.j.ID, what, delay, st.failures)
}

// restartEngines starts again the engines whose backoff has passed, and
// those of granted serving leases that have none (the server started again
// while one waited).
func (s *Core) restartEngines(now time.Time, b *Changes) {
	for _, ls := range s.leases {
		l := ls.l
		if l.State != api.LeaseGranted || l.Request.Serve == nil || l.Request.Job == nil {
			continue
		}
		if ls.serve.restartAt.IsZero() {
			live := false
			for _, js := range ls.jobs {
				if isEngine(ls, js) && !api.JobFinal(js.j.State) {
					live = true
				}
			}
			if live {
				continue
			}
		} else if now.Before(ls.serve.restartAt) {
			continue
		}
		ls.serve.restartAt = time.Time{}
		spec := cloneSpec(*l.Request.Job)
		if err := s.jobRoom(l.Project, &spec, len(ls.jobs)); err != nil {
			s.stopLease(ls, api.LeaseDone, "its engine cannot be started again: "+err.Error(), s.cfg.PreemptGrace, now, b)
			continue
		}
		j := s.newJob(ls, spec, now, b)
		s.assign(j, b)
		b.Event("deployment.restarted", l.ID, l.Project, "the engine of %s starts again as job %s", l.Request.Serve.Model, j.j.ID)
	}
}

func cloneSpec(s api.JobSpec) api.JobSpec {
	s.Command, s.Ports, s.Env = slices.Clone(s.Command), slices.Clone(s.Ports), maps.Clone(s.Env)
	return s
}
