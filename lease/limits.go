package lease

import (
	"cmp"
	"fmt"

	"kiln.dev/kiln/api"
)

// limitsOf is a project's limits, the server's defaults where it sets
// none; s.mu is held.
func (s *Core) limitsOf(project string) api.Limits {
	d := s.cfg.Limits
	var p api.Limits
	if ps := s.projects[project]; ps != nil {
		p = ps.p.Limits
	}
	return api.Limits{
		MaxQueued:         cmp.Or(p.MaxQueued, d.MaxQueued),
		MaxQueuedPerUser:  cmp.Or(p.MaxQueuedPerUser, d.MaxQueuedPerUser),
		MaxJobsPerLease:   cmp.Or(p.MaxJobsPerLease, d.MaxJobsPerLease),
		MaxEnvBytes:       cmp.Or(p.MaxEnvBytes, d.MaxEnvBytes),
		MaxLogBytesPerJob: cmp.Or(p.MaxLogBytesPerJob, d.MaxLogBytesPerJob),
		MaxLogBytes:       cmp.Or(p.MaxLogBytes, d.MaxLogBytes),
	}
}

// Raise says how an admin raises a project's limit.
func Raise(project, flag string) string {
	return fmt.Sprintf("an admin raises it with 'kiln token project %s --%s N'", project, flag)
}

// queueRoom refuses a new lease when the project, or the user in it, has
// as many queued leases as its limit (429: they leave the queue with
// time); s.mu is held.
func (s *Core) queueRoom(project, user string) error {
	lim := s.limitsOf(project)
	inProject, mine := 0, 0
	for _, ls := range s.queued {
		if ls.l.Project == project {
			inProject++
			if ls.l.User == user {
				mine++
			}
		}
	}
	if mine >= lim.MaxQueuedPerUser {
		return Errorf(Busy, "%s has %d queued leases in project %s, the most one member may queue (max_queued_per_user %d): wait for some to start or cancel them; %s",
			user, mine, project, lim.MaxQueuedPerUser, Raise(project, "max-queued-per-user"))
	}
	if inProject >= lim.MaxQueued {
		return Errorf(Busy, "project %s has %d queued leases, the most it may queue (max_queued %d): wait for some to start; %s",
			project, inProject, lim.MaxQueued, Raise(project, "max-queued"))
	}
	return nil
}

// jobRoom refuses a job the project's limits do not allow (403: waiting
// does not help); s.mu is held.
func (s *Core) jobRoom(project string, spec *api.JobSpec, jobs int) error {
	lim := s.limitsOf(project)
	if jobs >= lim.MaxJobsPerLease {
		return Errorf(Forbidden, "the lease ran %d jobs, the most a lease of project %s may run (max_jobs_per_lease %d): run the next in a new lease; %s",
			jobs, project, lim.MaxJobsPerLease, Raise(project, "max-jobs-per-lease"))
	}
	if n := envBytes(spec.Env); n > lim.MaxEnvBytes {
		return Errorf(Forbidden, "job.env holds %d bytes, more than a job of project %s may have (max_env_bytes %d); %s",
			n, project, lim.MaxEnvBytes, Raise(project, "max-env-bytes"))
	}
	return nil
}

// envBytes is the size of an environment as the job gets it: NAME=value
// and a NUL for each variable.
func envBytes(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + len(v) + 2
	}
	return n
}
