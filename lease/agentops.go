package lease

import (
	"slices"
	"time"

	"kiln.dev/kiln/api"
)

// CheckJoin refuses a join under a node name bound to another key, unless
// an admin lets the node be replaced.
func (s *Core) CheckJoin(now time.Time, node, keyFP string) error {
	n := s.nodes[node]
	if n == nil || n.rec.Replacing || n.rec.KeySHA256 == keyFP {
		return nil
	}
	alive := n.rec.Node.State == api.NodeReady && now.Sub(n.LastSeen()) < s.cfg.HeartbeatTimeout
	state := "alive"
	if !alive {
		state = "not answering; its GPUs stay fenced, since its jobs may still run there"
	}
	return Errorf(Conflict, "node %s is taken: the name is bound to the key that first joined it, and the node is %s. If it is the same machine with a new key, or another machine now, an admin runs 'kiln node replace %s' (the new agent takes the name; the GPUs stay fenced until it registers) or 'kiln node forget %s'", node, state, node, node)
}

// Join records a node's agent with its new certificate and key (a new
// node, or a replacement the admin allowed).
func (s *Core) Join(now time.Time, node, certFP, keyFP string) (*Node, *Changes) {
	b := newChanges(now)
	n := s.nodes[node]
	verb := "joined"
	if n == nil {
		n = s.newNode(NodeRecord{Node: api.Node{ID: node, State: NodeJoining, Joined: now.UTC()}}, nil)
		s.nodes[node] = n
		s.nodeCache = nil
	} else if n.rec.Replacing {
		verb = "joined in place of its previous agent"
	}
	n.rec.CertSHA256, n.rec.KeySHA256, n.rec.Replacing = certFP, keyFP, false
	n.Touch(now)
	b.node(n)
	b.Event("node.joined", node, "", "node %s %s", node, verb)
	return n, b
}

// Forget prepares the removal of a node that is not answering (or never
// registered): what its lost leases held is freed and its jobs there are
// lost. Once the changes are kept, Remove takes the node out.
func (s *Core) Forget(now time.Time, id, by string) (*Changes, error) {
	n := s.nodes[id]
	if n == nil {
		return nil, Errorf(NotFound, "node %s not found", id)
	}
	if n.rec.Node.State == api.NodeReady {
		return nil, Errorf(Conflict, "node %s is ready: stop its agent first (it is lost after the heartbeat timeout, %s), then forget it", id, s.cfg.HeartbeatTimeout)
	}
	b := newChanges(now)
	s.clearLost(n, "node "+id+" forgotten by "+by, b)
	for jid, js := range n.tasks {
		if t := js.task(id); t != nil && !api.JobFinal(t.State) {
			s.taskEnded(js, id, api.ExitReport{Code: -1, Reason: "its node was forgotten"}, api.JobLost, now, b)
		}
		delete(n.tasks, jid)
	}
	b.Event("node.forgotten", id, "", "%s forgot node %s", by, id)
	s.schedule(now, b)
	return b, nil
}

// Remove takes a forgotten node out of the state.
func (s *Core) Remove(id string) {
	delete(s.nodes, id)
	s.nodeCache, s.viewList, s.empty = nil, nil, nil
}

// Replace lets the next agent that joins with a valid token take the
// node's name with a new key; a ready node is lost from now on.
func (s *Core) Replace(now time.Time, id, by string) (*Node, *Changes, error) {
	n := s.nodes[id]
	if n == nil {
		return nil, nil, Errorf(NotFound, "node %s not found", id)
	}
	b := newChanges(now)
	if n.rec.Node.State == api.NodeReady {
		// Its agent may not act any more: the node is lost now.
		s.nodeLost(n, now, b)
	}
	n.rec.Replacing, n.rec.CertSHA256 = true, ""
	b.node(n)
	b.Event("node.replacing", id, "", "%s lets a new agent take node %s; its previous agent's certificate is refused", by, id)
	s.schedule(now, b)
	return n, b, nil
}

// Register takes a node's snapshot and findings and what its agent runs;
// keyFP binds a node that joined before names were bound to keys ("" to
// leave it).
func (s *Core) Register(now time.Time, node string, req api.RegisterRequest, keyFP string) (api.Node, *Changes, error) {
	n := s.nodes[node]
	if n == nil {
		return api.Node{}, nil, Errorf(NotFound, "node %s not found", node)
	}
	b := newChanges(now)
	if n.rec.KeySHA256 == "" && keyFP != "" {
		n.rec.KeySHA256 = keyFP
	}
	drains := s.applySnapshot(n, req, b)
	n.Touch(now)
	wasLost := n.rec.Node.State != api.NodeReady
	n.rec.Node.State = api.NodeReady
	n.rec.Node.LastSeen = now.UTC()
	b.node(n)
	s.empty = nil
	if wasLost {
		b.Event("node.ready", node, "", "node %s registered with %d GPUs%s", node, len(req.Snapshot.GPUs), drains)
	}
	s.reconcile(n, req.Running, now, b)
	s.schedule(now, b)
	return s.nodeAPI(n), b, nil
}

// Heartbeat takes what a node's agent runs now and answers its orders;
// register is set when the node must register first.
func (s *Core) Heartbeat(now time.Time, node string, hb api.Heartbeat) (reply api.HeartbeatReply, register bool, b *Changes) {
	running := hb.Running
	b = newChanges(now)
	n := s.nodes[node]
	if n == nil {
		return reply, true, b
	}
	n.Touch(now)
	if n.rec.Node.State != api.NodeReady {
		return reply, true, b
	}
	s.reconcile(n, running, now, b)
	s.notePorts(n, hb.Open, b)
	s.noteChosen(n, hb.Chosen, b)
	if !b.Empty() {
		s.schedule(now, b)
	}
	reply = s.Orders(node, running)
	n.idle.Store(len(n.tasks) == 0 && len(n.stops) == 0 && !s.holdsOn(node))
	return reply, false, b
}

// Orders are the tasks a node's agent is to start and the stop orders it
// has, given what it runs.
func (s *Core) Orders(node string, running []string) api.HeartbeatReply {
	n := s.nodes[node]
	if n == nil {
		return api.HeartbeatReply{}
	}
	run := make(map[string]bool, len(running))
	for _, id := range running {
		run[id] = true
	}
	return s.orders(n, run)
}

// JobExit records the end of a job's task on a node; recorded is false
// when the job or the task is unknown or over already.
func (s *Core) JobExit(now time.Time, node, job string, e api.ExitReport) (recorded bool, b *Changes) {
	b = newChanges(now)
	js := s.jobs[job]
	if js == nil || js.task(node) == nil {
		// Unknown here, or already over: nothing to change.
		if n := s.nodes[node]; n != nil {
			delete(n.stops, job)
		}
		return false, b
	}
	state := api.JobExited
	if e.Reason == "failed to start" {
		state = api.JobFailed
	}
	s.taskEnded(js, node, e, state, now, b)
	s.schedule(now, b)
	return true, b
}

// LiveTask says whether a live job has a task on the node, and the job's
// project.
func (s *Core) LiveTask(node, job string) (project string, ok bool) {
	js := s.jobs[job]
	if js == nil || js.task(node) == nil {
		return "", false
	}
	return js.j.Project, true
}

// LimitsOf is a project's limits, the defaults where it sets none.
func (s *Core) LimitsOf(project string) api.Limits { return s.limitsOf(project) }

// notePorts records which declared ports of the node's running tasks the
// agent found open; ports a job did not declare are ignored.
func (s *Core) notePorts(n *Node, open map[string][]int, b *Changes) {
	node := n.rec.Node.ID
	for id, js := range n.tasks {
		if len(js.j.Spec.Ports) == 0 {
			continue
		}
		t := js.task(node)
		if t == nil || t.State != api.JobRunning {
			continue
		}
		var got []int
		for _, p := range js.j.Spec.Ports {
			if slices.Contains(open[id], p) {
				got = append(got, p)
			}
		}
		if !slices.Equal(t.OpenPorts, got) {
			t.OpenPorts = got
			b.job(js.j)
		}
	}
}

// portStates are the declared ports of a lease's live jobs.
func (s *Core) portStates(l *api.Lease) []api.PortState {
	var out []api.PortState
	for _, id := range l.Jobs {
		js := s.jobs[id]
		if js == nil || api.JobFinal(js.j.State) {
			continue
		}
		for _, p := range js.j.Spec.Ports {
			st := api.PortWaiting
			for _, t := range js.j.Tasks {
				if t.State == api.JobRunning && slices.Contains(t.OpenPorts, p) {
					st = api.PortOpen
				}
			}
			out = append(out, api.PortState{Job: id, Port: p, State: st})
		}
	}
	return out
}
