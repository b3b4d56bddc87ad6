package lease

import (
	"fmt"
	"strings"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// Submit is a new lease as asked by a user.
type Submit struct {
	Request api.LeaseRequest
	// User asks; Projects are the user's projects (the lease goes to the
	// only one when the request names none); Member says whether the user
	// may use a project.
	User     string
	Projects []string
	Member   func(project string) bool
	// Allowed are the nodes that may run the lease's image (nil: any).
	Allowed []string
}

// Submit queues a lease, grants it at once when it fits, and refuses it
// when it never could (quotas, images, sandbox, no node large enough).
func (s *Core) Submit(now time.Time, in Submit) (*api.Lease, *Changes, error) {
	req, allowed := in.Request, in.Allowed
	if req.Project == "" {
		if len(in.Projects) != 1 {
			return nil, nil, Errorf(Invalid, "give a project: you are in %s", listOr(in.Projects, "no project"))
		}
		req.Project = in.Projects[0]
	}
	if _, ok := s.projects[req.Project]; !ok {
		return nil, nil, Errorf(NotFound, "project %s does not exist", req.Project)
	}
	if max := s.cfg.MaxTimeLimit; time.Duration(req.TimeLimitSeconds)*time.Second > max {
		return nil, nil, Errorf(Invalid, "time_limit_s %d: this server allows at most %s (%d s)", req.TimeLimitSeconds, max, int64(max/time.Second))
	}
	if !in.Member(req.Project) {
		return nil, nil, Errorf(Forbidden, "you are not a member of project %s", req.Project)
	}
	if err := s.queueRoom(req.Project, in.User); err != nil {
		return nil, nil, err
	}
	if err := s.serveRoom(req, in.User); err != nil {
		return nil, nil, err
	}
	if req.Job != nil {
		if err := s.jobRoom(req.Project, req.Job, 0); err != nil {
			return nil, nil, err
		}
	}
	l := &api.Lease{ID: s.cfg.NewID("l-"), Project: req.Project, User: in.User, State: api.LeaseQueued, Request: req, CreatedAt: now.UTC()}
	ls := s.newLeaseState(l)
	l.GPUs = ls.need
	noContainers := ""
	if req.Job != nil && req.Job.Image != "" {
		// An image runs only where the agent has a container executor.
		var nodes []string
		nodes, noContainers = s.containerNodes()
		if allowed == nil {
			allowed = nodes
		} else {
			allowed = intersect(allowed, nodes)
		}
	}
	sandboxRefusal, sandboxKind := "", RefusedSandbox
	if req.Placement == api.PlacementScheduler {
		// Only Pods' devices can be picked by the kube-scheduler.
		var nodes []string
		for _, n := range s.nodeList() {
			if n.letsSchedulerPick() {
				nodes = append(nodes, n.rec.Node.ID)
			}
		}
		if len(nodes) == 0 {
			sandboxRefusal, sandboxKind = "placement scheduler: no node runs its jobs as Pods, so no kube-scheduler can pick devices (nodes of kiln server --backend kubernetes do); leave the placement to kiln", RefusedNoPods
		}
		if allowed == nil {
			allowed = nodes
		} else {
			allowed = intersect(allowed, nodes)
		}
	}
	if len(req.Require) > 0 {
		nodes, why := s.sandboxNodes(req.Require)
		if len(s.nodes) == 0 {
			why = "no node has joined yet"
		}
		if len(nodes) == 0 {
			// An empty list of nodes would mean any node.
			sandboxRefusal, sandboxKind = fmt.Sprintf("no node gives its jobs %s, and kiln never runs them with less: %s", strings.Join(req.Require, ", "), why), RefusedSandbox
		}
		if allowed == nil {
			allowed = nodes
		} else {
			allowed = intersect(allowed, nodes)
		}
	}
	if allowed != nil {
		ls.req.Constraints.Nodes = intersect(ls.req.Constraints.Nodes, allowed)
		if len(req.Require) > 0 && len(ls.req.Constraints.Nodes) == 0 && sandboxRefusal == "" {
			sandboxRefusal, sandboxKind = fmt.Sprintf("none of the nodes asked for gives its jobs %s", strings.Join(req.Require, ", ")), RefusedSandbox
		}
		if req.Placement == api.PlacementScheduler && len(ls.req.Constraints.Nodes) == 0 && sandboxRefusal == "" {
			sandboxRefusal, sandboxKind = "placement scheduler: none of the nodes that may run the image runs its jobs as Pods", RefusedNoPods
		}
	}
	b := newChanges(now)
	if req.Job != nil {
		s.newJob(ls, cloneSpec(*req.Job), now, b)
	}
	s.leases[l.ID] = ls
	s.queued[l.ID] = ls
	b.lease(l)
	b.Event("lease.created", l.ID, l.Project, "%s asks for %s", l.User, req.Size())
	if sandboxRefusal != "" {
		s.refuse(ls, sandboxKind, sandboxRefusal, now, b)
	} else if reason, kind := s.refusal(ls, allowed, noContainers, now); reason != "" {
		s.refuse(ls, kind, reason, now, b)
	} else {
		ls.checkFit = true
		s.schedule(now, b)
		if ls.l.State == api.LeaseQueued {
			s.refuseIfNeverFits(ls, now, b)
		}
	}
	return l, b, nil
}

// serveRoom refuses a deployment whose name another member of the project
// serves already: the endpoint would send that member's requests to it.
// The same user's deployments of one name are replicas.
func (s *Core) serveRoom(req api.LeaseRequest, user string) error {
	if req.Serve == nil {
		return nil
	}
	for _, ls := range s.leases {
		o := ls.l
		if o.Request.Serve != nil && o.Project == req.Project && o.Request.Serve.Model == req.Serve.Model && o.User != user {
			return Errorf(Conflict, "project %s already serves %s (lease %s of %s): give yours another name (kiln serve --name)", req.Project, req.Serve.Model, o.ID, o.User)
		}
	}
	return nil
}

// Lease is a live lease (queued, granted, stopping, or lost and holding
// devices); nil when the core does not hold it. The value is the core's:
// read it under the lock.
func (s *Core) Lease(id string) *api.Lease {
	if ls := s.leases[id]; ls != nil {
		return ls.l
	}
	return nil
}

// Decorate sets a lease's queue position and estimated start as of now
// (zero for a lease that is not queued).
func (s *Core) Decorate(l *api.Lease, now time.Time) { s.decorate(l, now) }

// Leases are copies of the live leases keep selects, decorated as of now.
func (s *Core) Leases(now time.Time, keep func(*api.Lease) bool) []api.Lease {
	var out []api.Lease
	for _, ls := range s.leases {
		if !keep(ls.l) {
			continue
		}
		s.decorate(ls.l, now)
		out = append(out, *ls.l)
	}
	return out
}

// Cancel ends a live lease for its user: a queued one is cancelled, a
// granted one released (its jobs get the grace); a lost one is refused to a
// member and left as it is for an admin, who clears it on its node.
func (s *Core) Cancel(now time.Time, id, by string, admin bool) (*api.Lease, *Changes, error) {
	ls := s.leases[id]
	if ls == nil {
		return nil, nil, Errorf(NotFound, "lease %s not found", id)
	}
	l := ls.l
	b := newChanges(now)
	switch l.State {
	case api.LeaseQueued:
		s.finishLease(ls, api.LeaseCancelled, "cancelled by "+by, now, b)
	case api.LeaseGranted:
		s.stopLease(ls, api.LeaseDone, "released by "+by, s.cfg.PreemptGrace, now, b)
	case api.LeaseLost:
		if admin {
			break
		}
		return nil, nil, Errorf(Conflict, "lease %s is lost with its node; an admin clears it with 'kiln drain --clear-lost %s'", id, l.Allocations[0].Node)
	}
	s.schedule(now, b)
	return l, b, nil
}

// AddJob adds a job to a live lease; it starts at once in a granted one.
func (s *Core) AddJob(now time.Time, leaseID string, spec api.JobSpec) (*api.Job, *Changes, error) {
	ls := s.leases[leaseID]
	if ls == nil {
		return nil, nil, Errorf(NotFound, "lease %s not found", leaseID)
	}
	l := ls.l
	if l.State != api.LeaseQueued && l.State != api.LeaseGranted {
		return nil, nil, Errorf(Conflict, "lease %s is %s: jobs run only in a queued or granted lease", leaseID, l.State)
	}
	if err := s.jobRoom(l.Project, &spec, len(ls.jobs)); err != nil {
		return nil, nil, err
	}
	b := newChanges(now)
	js := s.newJob(ls, spec, now, b)
	if l.State == api.LeaseGranted {
		s.assign(js, b)
	}
	return js.j, b, nil
}

// newJob adds a pending job to a lease.
func (s *Core) newJob(ls *leaseState, spec api.JobSpec, now time.Time, b *Changes) *jobState {
	l := ls.l
	j := &api.Job{ID: s.cfg.NewID("j-"), LeaseID: l.ID, Project: l.Project, State: api.JobPending, Spec: spec, Created: now.UTC()}
	js := &jobState{j: j, lease: ls}
	ls.jobs = append(ls.jobs, js)
	l.Jobs = append(l.Jobs, j.ID)
	s.jobs[j.ID] = js
	b.job(j)
	b.lease(l)
	return js
}

// Job is a live job, nil when the core does not hold it. The value is the
// core's: read it under the lock.
func (s *Core) Job(id string) *api.Job {
	if js := s.jobs[id]; js != nil {
		return js.j
	}
	return nil
}

// Snapshots are the nodes' last snapshots, by node id.
func (s *Core) Snapshots() map[string]*snapshot.Snapshot {
	out := make(map[string]*snapshot.Snapshot, len(s.nodes))
	for id, n := range s.nodes {
		out[id] = n.rec.Snapshot
	}
	return out
}
