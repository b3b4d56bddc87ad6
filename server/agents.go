package server

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/store"
)

// NodeJoining is the state of a node that joined but sent no snapshot yet.
const NodeJoining = "joining"

// join gives an agent a certificate for its node. A join token joins as
// many nodes as it has uses; a node name is bound to the key that first
// joined it: another key is refused (409) until an admin replaces the node
// ('kiln node replace') or forgets it ('kiln node forget'), so nobody
// holding a join token takes the name of a node that went silent while
// its jobs may still run there.
func (s *Server) join(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r, maxBody, parseJoin)
	if !ok {
		return
	}
	csr, err := parseCSR([]byte(req.CSRPEM))
	if err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	keyFP, err := keyFingerprint(csr.PublicKey)
	if err != nil {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("csr_pem: %w", err))
		return
	}
	s.answer(w, http.StatusOK, func() (any, uint64, error) {
		if err := s.down(); err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		now := time.Now()
		n := s.nodes[req.Node]
		if n != nil && !n.rec.Replacing && n.rec.KeySHA256 != keyFP {
			alive := n.rec.Node.State == api.NodeReady && now.Sub(n.lastSeen()) < s.cfg.HeartbeatTimeout
			state := "alive"
			if !alive {
				state = "not answering; its GPUs stay fenced, since its jobs may still run there"
			}
			return nil, 0, errStatus(http.StatusConflict, "node %s is taken: the name is bound to the key that first joined it, and the node is %s. If it is the same machine with a new key, or another machine now, an admin runs 'kiln node replace %s' (the new agent takes the name; the GPUs stay fenced until it registers) or 'kiln node forget %s'", req.Node, state, req.Node, req.Node)
		}
		if err := s.useJoinToken(r.Context(), req.Token, now); err != nil {
			return nil, 0, withStatus(http.StatusUnauthorized, err)
		}
		certPEM, err := s.ca.signAgent(csr, req.Node)
		if err != nil {
			return nil, 0, err
		}
		fp, err := pemFingerprint(certPEM)
		if err != nil {
			return nil, 0, err
		}
		b := newBatch()
		verb := "joined"
		if n == nil {
			n = s.newNode(store.NodeRecord{Node: api.Node{ID: req.Node, State: NodeJoining, Joined: now.UTC()}}, nil)
			s.nodes[req.Node] = n
			s.nodeCache = nil
		} else if n.rec.Replacing {
			verb = "joined in place of its previous agent"
		}
		n.rec.CertSHA256, n.rec.KeySHA256, n.rec.Replacing = fp, keyFP, false
		n.touch(now)
		s.addAgent(n)
		b.node(n)
		b.event("node.joined", req.Node, "", "node %s %s", req.Node, verb)
		seq, err := s.flush(b)
		if err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		return api.JoinResponse{Node: req.Node, CertPEM: string(certPEM), CAPEM: string(s.ca.pem)}, seq, nil
	})
}

// forgetNode removes a node that is not answering (or never registered):
// what its lost leases held is freed, its jobs there are marked lost, and
// its name is free for any agent with a join token.
func (s *Server) forgetNode(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.down(); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	n := s.nodes[id]
	if n == nil {
		writeErr(w, http.StatusNotFound, fmt.Errorf("node %s not found", id))
		return
	}
	if n.rec.Node.State == api.NodeReady {
		writeErr(w, http.StatusConflict, fmt.Errorf("node %s is ready: stop its agent first (it is lost after the heartbeat timeout, %s), then forget it", id, s.cfg.HeartbeatTimeout))
		return
	}
	now := time.Now()
	b := newBatch()
	s.clearLost(n, "node "+id+" forgotten by "+c.user.Name, b)
	for jid, js := range n.tasks {
		if t := js.task(id); t != nil && !api.JobFinal(t.State) {
			s.taskEnded(js, id, api.ExitReport{Code: -1, Reason: "its node was forgotten"}, api.JobLost, now, b)
		}
		delete(n.tasks, jid)
	}
	b.event("node.forgotten", id, "", "%s forgot node %s", c.user.Name, id)
	s.schedule(now, b)
	if err := s.flushWait(b); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	if err := s.st.Update(r.Context(), func(tx *store.Tx) error { return tx.DeleteNode(id) }); err != nil {
		writeErr(w, 0, storeErr(err))
		return
	}
	delete(s.nodes, id)
	s.nodeCache, s.viewList, s.empty = nil, nil, nil
	s.amu.Lock()
	delete(s.agents, id)
	s.amu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"forgotten": id})
}

// replaceNode lets the next agent that joins with a valid token take the
// node's name with a new key. The previous agent's certificate is refused
// from now on; the devices lost leases hold stay fenced until the new agent
// registers and says what runs.
func (s *Server) replaceNode(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.down(); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	n := s.nodes[id]
	if n == nil {
		writeErr(w, http.StatusNotFound, fmt.Errorf("node %s not found", id))
		return
	}
	now := time.Now()
	b := newBatch()
	if n.rec.Node.State == api.NodeReady {
		// Its agent may not act any more: the node is lost now.
		s.nodeLost(n, now, b)
	}
	n.rec.Replacing, n.rec.CertSHA256 = true, ""
	s.addAgent(n)
	b.node(n)
	b.event("node.replacing", id, "", "%s lets a new agent take node %s; its previous agent's certificate is refused", c.user.Name, id)
	s.schedule(now, b)
	if err := s.flushWait(b); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, s.nodeAPI(n))
}

func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	req, ok := readRequest(w, r, maxSnapshotBody, parseRegister)
	if !ok {
		return
	}
	s.answer(w, http.StatusOK, func() (any, uint64, error) {
		if err := s.down(); err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		now := time.Now()
		n := s.nodes[node]
		b := newBatch()
		if n.rec.KeySHA256 == "" && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			// A node that joined before names were bound to keys: bound
			// now, to the key its agent proves it holds.
			if fp, err := keyFingerprint(r.TLS.PeerCertificates[0].PublicKey); err == nil {
				n.rec.KeySHA256 = fp
			}
		}
		drains := s.applySnapshot(n, req, b)
		n.touch(now)
		wasLost := n.rec.Node.State != api.NodeReady
		n.rec.Node.State = api.NodeReady
		n.rec.Node.LastSeen = now.UTC()
		b.node(n)
		s.empty = nil
		if wasLost {
			b.event("node.ready", node, "", "node %s registered with %d GPUs%s", node, len(req.Snapshot.GPUs), drains)
		}
		s.reconcile(n, req.Running, now, b)
		s.schedule(now, b)
		seq, err := s.flush(b)
		if err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		return s.nodeAPI(n), seq, nil
	})
}

// applySnapshot rebuilds a node's devices from its new snapshot, keeping
// what leases hold and what admins drained, and drains the devices named
// by critical doctor findings.
func (s *Server) applySnapshot(n *nodeState, req api.RegisterRequest, b *batch) string {
	old := n.byID
	stored := map[string]store.DeviceState{}
	for id, u := range old {
		if u.dev.Drained {
			stored[id] = store.DeviceState{Drained: true, Reason: u.dev.DrainReason}
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
			u.holders, u.mem, u.usedMilli, u.usedMem = prev.holders, prev.mem, prev.usedMilli, prev.usedMem
			u.reservedFor, u.reservedTil, u.claimedBy = prev.reservedFor, prev.reservedTil, prev.claimedBy
		}
		reason, crit := critical[u.dev.PCIAddress]
		switch {
		case crit && !u.dev.Drained:
			u.dev.Drained, u.dev.DrainReason = true, reason
			b.drains = append(b.drains, drainRow{n.rec.Node.ID, u.dev.ID, store.DeviceState{Drained: true, Reason: reason}})
			drained = append(drained, u.dev.ID)
			b.event("device.drained", n.rec.Node.ID+"/"+u.dev.ID, "", "%s", reason)
		case !crit && u.dev.Drained && strings.HasPrefix(u.dev.DrainReason, "doctor: "):
			// The finding is gone: the doctor's drain ends with it.
			u.dev.Drained, u.dev.DrainReason = false, ""
			b.drains = append(b.drains, drainRow{n.rec.Node.ID, u.dev.ID, store.DeviceState{}})
			b.event("device.undrained", n.rec.Node.ID+"/"+u.dev.ID, "", "the doctor no longer reports a critical finding")
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
func (s *Server) reconcile(n *nodeState, running []string, now time.Time, b *batch) {
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
				n.stops[id] = api.StopOrder{JobID: id, Reason: "kiln has no live task of this job on this node"}
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
					n.stops[js.j.ID] = api.StopOrder{JobID: js.j.ID, Reason: ls.l.Reason}
				}
			}
		}
		if !still {
			s.releaseHold(ls, node, b)
		}
	}
}

// releaseHold frees what a lost lease holds on a node.
func (s *Server) releaseHold(ls *leaseState, node string, b *batch) {
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
		b.event("lease.released", ls.l.ID, ls.l.Project, "the devices of lost lease %s are free again", ls.l.ID)
	}
}

// taskEnded records the end of a job's task on a node.
func (s *Server) taskEnded(js *jobState, node string, e api.ExitReport, state string, now time.Time, b *batch) {
	t := js.task(node)
	if t == nil || api.JobFinal(t.State) {
		return
	}
	code := e.Code
	t.State, t.ExitCode, t.Reason = state, &code, e.Reason
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
	s.logs.done(js.j.ID)
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

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	hb, ok := readRequest(w, r, maxBody, parseHeartbeat)
	if !ok {
		return
	}
	wait := min(time.Duration(hb.WaitMS)*time.Millisecond, s.cfg.HeartbeatTimeout/3)
	s.amu.RLock()
	n := s.agents[node]
	s.amu.RUnlock()
	if n != nil && len(hb.Running) == 0 && n.idle.Load() {
		// The agent runs nothing and the server has nothing for it: no
		// lock, no store, until something comes up for the node.
		n.touch(time.Now())
		if wait > 0 && !waitWake(r, n, wait) {
			return
		}
		if n.idle.Load() {
			writeJSON(w, http.StatusOK, api.HeartbeatReply{})
			return
		}
		wait = 0
	}
	s.mu.Lock()
	if err := s.down(); err != nil {
		s.mu.Unlock()
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	n = s.nodes[node]
	now := time.Now()
	n.touch(now)
	if n.rec.Node.State != api.NodeReady {
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, api.HeartbeatReply{Register: true})
		return
	}
	b := newBatch()
	s.reconcile(n, hb.Running, now, b)
	if !b.empty() {
		s.schedule(now, b)
	}
	seq, err := s.flush(b)
	if err != nil {
		s.mu.Unlock()
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	run := make(map[string]bool, len(hb.Running))
	for _, id := range hb.Running {
		run[id] = true
	}
	reply := s.orders(n, run)
	n.idle.Store(len(n.tasks) == 0 && len(n.stops) == 0 && !s.holdsOn(node))
	s.mu.Unlock()
	if len(reply.Start) == 0 && len(reply.Stop) == 0 && wait > 0 {
		if !waitWake(r, n, wait) {
			return
		}
		s.mu.Lock()
		n.touch(time.Now())
		reply = s.orders(n, run)
		seq = s.wseq
		s.mu.Unlock()
	}
	// Orders go out only once what they come from is durable: an agent
	// never runs a job a restarted server would not know.
	if err := s.durable(seq); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, reply)
}

// waitWake waits up to d for something for the node; false when the
// caller went away.
func waitWake(r *http.Request, n *nodeState, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-n.wake:
	case <-t.C:
	case <-r.Context().Done():
		return false
	}
	return true
}

// holdsOn reports whether a lost lease still holds devices of the node.
func (s *Server) holdsOn(node string) bool {
	for _, ls := range s.holding {
		if ls.heldNodes[node] {
			return true
		}
	}
	return false
}

// orders are the tasks to start (assigned, not yet running on the agent)
// and the stop orders pending for a node.
func (s *Server) orders(n *nodeState, run map[string]bool) api.HeartbeatReply {
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
				a.Devices = al.Devices
			}
		}
		reply.Start = append(reply.Start, a)
	}
	for _, o := range n.stops {
		reply.Stop = append(reply.Stop, o)
	}
	return reply
}

func (s *Server) jobExit(w http.ResponseWriter, r *http.Request) {
	node, id := r.PathValue("node"), r.PathValue("job")
	e, ok := readRequest(w, r, maxBody, parseExit)
	if !ok {
		return
	}
	s.answer(w, http.StatusOK, func() (any, uint64, error) {
		if err := s.down(); err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		js := s.jobs[id]
		if js == nil || js.task(node) == nil {
			// Unknown here, or already over: nothing to change.
			delete(s.nodes[node].stops, id)
			return map[string]string{"status": "ignored"}, s.wseq, nil
		}
		now := time.Now()
		b := newBatch()
		state := api.JobExited
		if e.Reason == "failed to start" {
			state = api.JobFailed
		}
		s.taskEnded(js, node, e, state, now, b)
		s.schedule(now, b)
		seq, err := s.flush(b)
		if err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		return map[string]string{"status": "recorded"}, seq, nil
	})
}

func (s *Server) jobLogChunk(w http.ResponseWriter, r *http.Request) {
	node, id := r.PathValue("node"), r.PathValue("job")
	body, err := readBody(r, maxLogChunk)
	if err != nil {
		writeErr(w, 0, badRequest(err))
		return
	}
	s.mu.Lock()
	js := s.jobs[id]
	ok := js != nil && js.task(node) != nil
	project := ""
	if ok {
		project = js.j.Project
	}
	s.mu.Unlock()
	if !ok {
		var j *api.Job
		err := s.st.View(r.Context(), func(tx *store.Tx) error {
			var err error
			j, err = tx.Job(id)
			return err
		})
		if err != nil || !hasTask(j, node) {
			writeErr(w, http.StatusNotFound, fmt.Errorf("job %s has no task on node %s", id, node))
			return
		}
		// The last output of a job comes just before or after its end;
		// later, nothing more is taken for it.
		if j.Finished != nil && time.Since(*j.Finished) > lateLogs {
			writeErr(w, http.StatusGone, fmt.Errorf("job %s ended at %s: no more output is taken for it", id, j.Finished.Format(time.RFC3339)))
			return
		}
		project = j.Project
	}
	s.mu.Lock()
	lim := s.limitsOf(project)
	s.mu.Unlock()
	if err := s.logs.append(id, project, body, lim.MaxLogBytesPerJob, lim.MaxLogBytes); err != nil {
		switch {
		case errors.Is(err, errLogLimit):
			writeErr(w, http.StatusForbidden, fmt.Errorf("job %s: output dropped: %w; %s", id, err, raise(project, "max-log-bytes")))
		case errors.Is(err, errDiskFull):
			writeErr(w, http.StatusServiceUnavailable, err)
		default:
			writeErr(w, http.StatusInternalServerError, err)
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// lateLogs is how long after its end a job's output is still taken.
const lateLogs = time.Minute

func hasTask(j *api.Job, node string) bool {
	if j == nil {
		return false
	}
	for _, t := range j.Tasks {
		if t.Node == node {
			return true
		}
	}
	return false
}

// ticker marks silent nodes lost, expires leases at their limit and runs
// the queue.
func (s *Server) ticker(ctx context.Context) {
	defer s.loopWG.Done()
	every := min(max(s.cfg.HeartbeatTimeout/6, 20*time.Millisecond), time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.tick(time.Now())
	}
}

func (s *Server) tick(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down() != nil {
		return
	}
	b := newBatch()
	for _, n := range s.nodeList() {
		if n.rec.Node.State == api.NodeReady && now.Sub(n.lastSeen()) > s.cfg.HeartbeatTimeout {
			s.nodeLost(n, now, b)
		}
	}
	for _, ls := range s.leases {
		if ls.l.State == api.LeaseGranted && ls.l.EndsAt != nil && !now.Before(*ls.l.EndsAt) {
			s.stopLease(ls, api.LeaseExpired, fmt.Sprintf("expired: its time limit of %s was reached", s.timeLimit(ls.l.Request)), s.cfg.PreemptGrace, now, b)
		}
	}
	s.schedule(now, b)
	_, _ = s.flush(b)
}

// nodeLost marks a silent node lost: its leases are lost and keep holding
// its devices until it registers again or an admin clears them.
func (s *Server) nodeLost(n *nodeState, now time.Time, b *batch) {
	node := n.rec.Node.ID
	n.rec.Node.State = api.NodeLost
	n.idle.Store(false)
	s.redraw(n)
	b.node(n)
	b.event("node.lost", node, "", "node %s sent no heartbeat for %s", node, s.cfg.HeartbeatTimeout)
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

func (s *Server) markLost(ls *leaseState, node string, now time.Time, b *batch) {
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
	b.event("lease.lost", l.ID, l.Project, "%s", l.Reason)
}

func (s *Server) nodeAPI(n *nodeState) api.Node {
	nd := n.rec.Node
	nd.LastSeen = n.lastSeen().UTC()
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

func pemFingerprint(certPEM []byte) (string, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return "", fmt.Errorf("certificate: no PEM block")
	}
	return api.Fingerprint(block.Bytes), nil
}
