package lease

import (
	"fmt"
	"strings"
	"time"

	"kiln.dev/kiln/api"
)

// applySnapshot rebuilds a node's devices from its new snapshot, keeping
// what leases hold and what admins drained, and drains the devices named
// by critical doctor findings.
func (s *Core) applySnapshot(n *Node, req api.RegisterRequest, b *Changes) string {
	old := n.byID
	stored := map[string]DeviceState{}
	for id, u := range old {
		if u.dev.Drained {
			stored[id] = DeviceState{Drained: true, Reason: u.dev.DrainReason}
		}
	}
	rec := n.rec
	rec.Snapshot = req.Snapshot
	fresh := s.newNode(rec, stored)
	critical := map[string]string{}
	for _, f := range req.Findings {
		if f.Severity != "critical" {
			continue
		}
		for _, d := range f.Devices {
			if _, ok := critical[d]; !ok {
				critical[d] = "doctor: " + f.ID + ": " + f.Title
			}
		}
	}
	var drained []string
	for _, u := range fresh.units {
		if prev, ok := old[u.dev.ID]; ok {
			u.holders, u.usedMilli, u.usedMem = prev.holders, prev.usedMilli, prev.usedMem
			u.reservedFor, u.reservedTil, u.claimedBy = prev.reservedFor, prev.reservedTil, prev.claimedBy
		}
		reason, crit := critical[u.dev.PCIAddress]
		switch {
		case crit && !u.dev.Drained:
			u.dev.Drained, u.dev.DrainReason = true, reason
			b.Drains = append(b.Drains, Drain{n.rec.Node.ID, u.dev.ID, DeviceState{Drained: true, Reason: reason}})
			drained = append(drained, u.dev.ID)
			b.Event("device.drained", n.rec.Node.ID+"/"+u.dev.ID, "", "%s", reason)
		case !crit && u.dev.Drained && strings.HasPrefix(u.dev.DrainReason, "doctor: "):
			// The finding is gone: the doctor's drain ends with it.
			u.dev.Drained, u.dev.DrainReason = false, ""
			b.Drains = append(b.Drains, Drain{n.rec.Node.ID, u.dev.ID, DeviceState{}})
			b.Event("device.undrained", n.rec.Node.ID+"/"+u.dev.ID, "", "the doctor no longer reports a critical finding")
		}
	}
	// A device that disappeared while leased stays, drained, until its
	// leases end.
	for id, u := range old {
		if _, ok := fresh.byID[id]; !ok && len(u.holders) > 0 {
			u.dev.Drained, u.dev.DrainReason = true, "no longer found by the agent's discovery"
			fresh.units = append(fresh.units, u)
			fresh.byID[id] = u
		}
	}
	n.units, n.byID = fresh.units, fresh.byID
	s.redraw(n)
	n.rec.Snapshot = req.Snapshot
	nd := &n.rec.Node
	nd.Hostname = req.Snapshot.Host.Hostname
	nd.Recorded = req.Recorded
	nd.Executor = req.Executor
	nd.Sandbox = req.Sandbox
	nd.Containers, nd.NoContainers = req.Containers, ""
	if req.Containers == "" {
		nd.NoContainers = req.NoContainers
		if nd.NoContainers == "" {
			nd.NoContainers = "its agent runs no container executor"
		}
	}
	nd.Driver = req.Snapshot.Drivers.NVIDIAUser
	if nd.Driver == "" {
		nd.Driver = req.Snapshot.Drivers.AMDGPU
	}
	nd.CUDA = req.Snapshot.Drivers.CUDADriver
	nd.Findings = nil
	for _, f := range req.Findings {
		if f.Severity == "critical" || f.Severity == "warning" {
			nd.Findings = append(nd.Findings, f)
		}
	}
	if len(drained) > 0 {
		return "; drained " + strings.Join(drained, ", ") + " for critical findings"
	}
	return ""
}

// task returns a job's task on a node.
func (js *jobState) task(node string) *api.Task {
	for i := range js.j.Tasks {
		if js.j.Tasks[i].Node == node {
			return &js.j.Tasks[i]
		}
	}
	return nil
}

// reconcile compares what an agent runs with what the server expects.
func (s *Core) reconcile(n *Node, running []string, now time.Time, b *Changes) {
	node := n.rec.Node.ID
	run := make(map[string]bool, len(running))
	for _, id := range running {
		run[id] = true
	}
	for id := range run {
		js := s.jobs[id]
		var t *api.Task
		if js != nil {
			t = js.task(node)
		}
		if t == nil || api.JobFinal(t.State) {
			if _, ok := n.stops[id]; !ok {
				n.addStop(id, api.StopOrder{JobID: id, Reason: "kiln has no live task of this job on this node"})
			}
			continue
		}
		if t.State == api.JobAssigned {
			t.State = api.JobRunning
			if js.j.State != api.JobRunning {
				js.j.State = api.JobRunning
				tt := now.UTC()
				js.j.Started = &tt
			}
			b.job(js.j)
		}
	}
	for id, js := range n.tasks {
		if run[id] {
			continue
		}
		t := js.task(node)
		if t == nil || api.JobFinal(t.State) {
			delete(n.tasks, id)
			continue
		}
		if t.State == api.JobRunning {
			s.taskEnded(js, node, api.ExitReport{Code: -1, Reason: "lost: the agent no longer runs it"}, api.JobLost, now, b)
		} else if _, stopping := n.stops[id]; stopping {
			s.taskEnded(js, node, api.ExitReport{Code: -1, Reason: "stopped before it started"}, api.JobStopped, now, b)
		}
	}
	for id := range n.stops {
		if run[id] {
			continue
		}
		if js := s.jobs[id]; js == nil {
			delete(n.stops, id)
		} else if t := js.task(node); t == nil || api.JobFinal(t.State) {
			delete(n.stops, id)
		}
	}
	for _, ls := range s.holding {
		if !ls.heldNodes[node] {
			continue
		}
		still := false
		for _, js := range ls.jobs {
			if run[js.j.ID] {
				still = true
				if _, ok := n.stops[js.j.ID]; !ok {
					n.addStop(js.j.ID, api.StopOrder{JobID: js.j.ID, Reason: ls.l.Reason})
				}
			}
		}
		if !still {
			s.releaseHold(ls, node, b)
		}
	}
}

// releaseHold frees what a lost lease holds on a node.
func (s *Core) releaseHold(ls *leaseState, node string, b *Changes) {
	s.freeDevices(ls, node)
	delete(ls.heldNodes, node)
	if len(ls.heldNodes) == 0 {
		ls.l.Holding = false
		delete(s.holding, ls.l.ID)
		delete(s.leases, ls.l.ID)
		for _, js := range ls.jobs {
			delete(s.jobs, js.j.ID)
			for _, t := range js.j.Tasks {
				if n := s.nodes[t.Node]; n != nil {
					delete(n.tasks, js.j.ID)
				}
			}
		}
		b.lease(ls.l)
		b.Event("lease.released", ls.l.ID, ls.l.Project, "the devices of lost lease %s are free again", ls.l.ID)
	}
}

// taskEnded records the end of a job's task on a node.
func (s *Core) taskEnded(js *jobState, node string, e api.ExitReport, state string, now time.Time, b *Changes) {
	t := js.task(node)
	if t == nil || api.JobFinal(t.State) {
		return
	}
	code := e.Code
	t.State, t.ExitCode, t.Reason = state, &code, e.Reason
	if e.GPU != nil {
		u := *e.GPU
		t.GPU = &u
	}
	if n := s.nodes[node]; n != nil {
		delete(n.stops, js.j.ID)
		delete(n.tasks, js.j.ID)
	}
	ls := js.lease
	b.job(js.j)
	if ls.l.State == api.LeaseLost {
		if ls.heldNodes[node] {
			s.releaseHold(ls, node, b)
		}
	}
	active := false
	for _, tt := range js.j.Tasks {
		if !api.JobFinal(tt.State) {
			active = true
		}
	}
	if active {
		if code != 0 && (ls.l.State == api.LeaseGranted || ls.l.State == api.LeaseStopping) {
			s.orderStop(js, s.cfg.PreemptGrace, fmt.Sprintf("rank %d on %s ended with code %d", t.Rank, node, code))
		}
		return
	}
	// The job is over.
	js.j.State, js.j.Reason = api.JobExited, e.Reason
	first := 0
	for _, tt := range js.j.Tasks {
		if tt.ExitCode != nil && *tt.ExitCode != 0 && first == 0 {
			first = *tt.ExitCode
		}
		switch tt.State {
		case api.JobFailed, api.JobLost, api.JobStopped:
			js.j.State = tt.State
		}
	}
	js.j.ExitCode = &first
	f := now.UTC()
	js.j.Finished = &f
	delete(s.jobs, js.j.ID)
	b.Ended = append(b.Ended, js.j.ID)
	if ls.l.State != api.LeaseGranted && ls.l.State != api.LeaseStopping {
		return
	}
	jobsLeft := false
	for _, o := range ls.jobs {
		if !api.JobFinal(o.j.State) {
			jobsLeft = true
		}
	}
	switch {
	case ls.l.State == api.LeaseStopping && !jobsLeft:
		s.finishLease(ls, ls.final, "", now, b)
	case ls.l.State == api.LeaseGranted && ls.l.Request.Serve != nil && isEngine(ls, js):
		s.engineEnded(ls, js, first, e.Reason, now, b)
	case ls.l.State == api.LeaseGranted && ls.l.Request.Job != nil && len(ls.jobs) > 0 && ls.jobs[0] == js:
		reason := fmt.Sprintf("its job ended with code %d", first)
		if e.Reason != "" && e.Reason != "exited" {
			reason += " (" + e.Reason + ")"
		}
		if jobsLeft {
			s.stopLease(ls, api.LeaseDone, reason, s.cfg.PreemptGrace, now, b)
		} else {
			s.finishLease(ls, api.LeaseDone, reason, now, b)
		}
	}
}

// holdsOn reports whether a lost lease still holds devices of the node.
func (s *Core) holdsOn(node string) bool {
	for _, ls := range s.holding {
		if ls.heldNodes[node] {
			return true
		}
	}
	return false
}

// orders are the tasks to start (assigned, not yet running on the agent)
// and the stop orders pending for a node.
func (s *Core) orders(n *Node, run map[string]bool) api.HeartbeatReply {
	var reply api.HeartbeatReply
	node := n.rec.Node.ID
	for id, js := range n.tasks {
		t := js.task(node)
		if t == nil || t.State != api.JobAssigned || run[id] {
			continue
		}
		if _, stopping := n.stops[id]; stopping {
			continue
		}
		l := js.lease.l
		a := api.Assignment{JobID: id, LeaseID: l.ID, Project: l.Project, Spec: js.j.Spec, Rank: t.Rank, Size: len(js.j.Tasks), EndsAt: l.EndsAt,
			User: l.User, Require: l.Request.Require, Resources: l.Request.Resources}
		for _, al := range l.Allocations {
			if al.Node == node {
				a.Devices, a.Choose = al.Devices, al.Choose
			}
		}
		reply.Start = append(reply.Start, a)
	}
	for _, o := range n.stops {
		reply.Stop = append(reply.Stop, o)
	}
	return reply
}

// Tick marks silent nodes lost, expires leases at their limit and runs
// the queue.
func (s *Core) Tick(now time.Time) *Changes {
	b := newChanges(now)
	for _, n := range s.nodeList() {
		if n.rec.Node.State == api.NodeReady && now.Sub(n.LastSeen()) > s.cfg.HeartbeatTimeout {
			s.nodeLost(n, now, b)
		}
	}
	for _, ls := range s.leases {
		if ls.l.State == api.LeaseGranted && ls.l.EndsAt != nil && !now.Before(*ls.l.EndsAt) {
			s.stopLease(ls, api.LeaseExpired, fmt.Sprintf("expired: its time limit of %s was reached", s.timeLimit(ls.l.Request)), s.cfg.PreemptGrace, now, b)
		}
	}
	s.restartEngines(now, b)
	s.schedule(now, b)
	return b
}

// nodeLost marks a silent node lost: its leases are lost and keep holding
// its devices until it registers again or an admin clears them.
func (s *Core) nodeLost(n *Node, now time.Time, b *Changes) {
	node := n.rec.Node.ID
	n.rec.Node.State = api.NodeLost
	n.idle.Store(false)
	s.redraw(n)
	b.node(n)
	b.Event("node.lost", node, "", "node %s sent no heartbeat for %s", node, s.cfg.HeartbeatTimeout)
	for _, ls := range s.leases {
		if ls.l.State != api.LeaseGranted && ls.l.State != api.LeaseStopping {
			continue
		}
		on := false
		for _, a := range ls.l.Allocations {
			if a.Node == node {
				on = true
			}
		}
		if on {
			s.markLost(ls, node, now, b)
		}
	}
}

func (s *Core) markLost(ls *leaseState, node string, now time.Time, b *Changes) {
	l := ls.l
	s.releaseClaims(ls)
	s.account(ls, now, b)
	t := now.UTC()
	l.State, l.Holding, l.EndedAt = api.LeaseLost, true, &t
	l.Reason = fmt.Sprintf("lost: node %s stopped answering at %s; its devices stay held until the node registers again or an admin clears them", node, now.UTC().Format(time.RFC3339))
	ls.heldNodes = map[string]bool{}
	for _, a := range l.Allocations {
		ls.heldNodes[a.Node] = true
	}
	s.holding[l.ID] = ls
	for _, js := range ls.jobs {
		if t := js.task(node); t != nil && !api.JobFinal(t.State) {
			t.State, t.Reason = api.JobLost, "its node stopped answering"
			delete(s.nodes[node].tasks, js.j.ID)
		}
		if js.j.State == api.JobPending {
			js.j.State = api.JobStopped
		}
		active := false
		for _, t := range js.j.Tasks {
			if !api.JobFinal(t.State) {
				active = true
			}
		}
		if active {
			s.orderStop(js, s.cfg.PreemptGrace, l.Reason)
		} else if !api.JobFinal(js.j.State) || js.j.State == api.JobStopped {
			js.j.State, js.j.Reason = api.JobLost, "its node stopped answering"
			f := now.UTC()
			js.j.Finished = &f
		}
		b.job(js.j)
	}
	// Parts on live nodes free themselves as their tasks end.
	for nodeID := range ls.heldNodes {
		if nodeID == node {
			continue
		}
		busy := false
		for _, js := range ls.jobs {
			if t := js.task(nodeID); t != nil && !api.JobFinal(t.State) {
				busy = true
			}
		}
		if !busy {
			s.releaseHold(ls, nodeID, b)
		}
	}
	b.lease(l)
	b.Event("lease.lost", l.ID, l.Project, "%s", l.Reason)
}

func (s *Core) nodeAPI(n *Node) api.Node {
	nd := n.rec.Node
	nd.LastSeen = n.LastSeen().UTC()
	nd.Devices = make([]api.Device, 0, len(n.units))
	nd.Total, nd.Free = 0, 0
	for _, u := range n.units {
		d := u.dev
		d.UsedMilli = u.usedMilli
		d.Held = s.heldByLost(u)
		for id := range u.holders {
			d.Leases = append(d.Leases, id)
		}
		nd.Devices = append(nd.Devices, d)
		if d.Parent == "" {
			nd.Total++
			if !d.Drained && !d.Held && !d.MIGMode && nd.State == api.NodeReady {
				nd.Free += float64(1000-u.usedMilli) / 1000
			}
		}
	}
	return nd
}
