package server

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/lease"
	"kiln.dev/kiln/store"
)

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
	s.change(w, http.StatusOK, func() (any, uint64, error) {
		now := time.Now()
		if err := s.core.CheckJoin(now, req.Node, keyFP); err != nil {
			return nil, 0, err
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
		n, b := s.core.Join(now, req.Node, fp, keyFP)
		s.addAgent(n)
		return s.commit(b, api.JoinResponse{Node: req.Node, CertPEM: string(certPEM), CAPEM: string(s.ca.pem)})
	})
}

// forgetNode removes a node that is not answering (or never registered):
// what its lost leases held is freed, its jobs there are marked lost, and
// its name is free for any agent with a join token.
func (s *Server) forgetNode(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	if !s.lockForChange(w) {
		return
	}
	defer s.mu.Unlock()
	b, err := s.core.Forget(time.Now(), id, c.user.Name)
	if !s.written(w, b, err) {
		return
	}
	if err := s.st.Update(r.Context(), func(tx *store.Tx) error { return tx.DeleteNode(id) }); err != nil {
		writeErr(w, 0, storeErr(err))
		return
	}
	s.core.Remove(id)
	s.amu.Lock()
	delete(s.agents, id)
	s.amu.Unlock()
	s.history.forget(id)
	writeJSON(w, http.StatusOK, map[string]string{"forgotten": id})
}

// replaceNode lets the next agent that joins with a valid token take the
// node's name with a new key. The previous agent's certificate is refused
// from now on; the devices lost leases hold stay fenced until the new agent
// registers and says what runs.
func (s *Server) replaceNode(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	id := r.PathValue("id")
	if !s.lockForChange(w) {
		return
	}
	defer s.mu.Unlock()
	n, b, err := s.core.Replace(time.Now(), id, c.user.Name)
	if err != nil {
		writeErr(w, 0, err)
		return
	}
	s.addAgent(n)
	if err := s.flushWait(b); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	nd, _ := s.core.NodeInfo(id)
	writeJSON(w, http.StatusOK, nd)
}

func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	req, ok := readRequest(w, r, maxSnapshotBody, parseRegister)
	if !ok {
		return
	}
	keyFP := ""
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		// A node that joined before names were bound to keys is bound
		// now, to the key its agent proves it holds.
		if fp, err := keyFingerprint(r.TLS.PeerCertificates[0].PublicKey); err == nil {
			keyFP = fp
		}
	}
	s.change(w, http.StatusOK, func() (any, uint64, error) {
		nd, b, err := s.core.Register(time.Now(), node, req, keyFP)
		if err != nil {
			return nil, 0, err
		}
		return s.commit(b, nd)
	})
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	hb, ok := readRequest(w, r, maxBody, parseHeartbeat)
	if !ok {
		return
	}
	wait := min(time.Duration(hb.WaitMS)*time.Millisecond, s.cfg.HeartbeatTimeout/3)
	s.amu.RLock()
	a := s.agents[node]
	s.amu.RUnlock()
	if a != nil {
		s.history.record(node, hb.Samples, time.Now())
	}
	if a != nil && len(hb.Running) == 0 && a.node.Idle() {
		// The agent runs nothing and the server has nothing for it: no
		// lock, no store, until something comes up for the node.
		a.node.Touch(time.Now())
		if wait > 0 && !waitFor(r.Context(), a.wake, wait) {
			return
		}
		if a.node.Idle() {
			writeJSON(w, http.StatusOK, api.HeartbeatReply{})
			return
		}
		wait = 0
	}
	if !s.lockForChange(w) {
		return
	}
	reply, register, b := s.core.Heartbeat(time.Now(), node, hb)
	if register {
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, api.HeartbeatReply{Register: true})
		return
	}
	seq, err := s.flush(b)
	if err != nil {
		s.mu.Unlock()
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	s.mu.Unlock()
	if a == nil { // joined since: authentication knows it now
		s.amu.RLock()
		a = s.agents[node]
		s.amu.RUnlock()
	}
	if len(reply.Start) == 0 && len(reply.Stop) == 0 && wait > 0 && a != nil {
		if !waitFor(r.Context(), a.wake, wait) {
			return
		}
		s.mu.Lock()
		a.node.Touch(time.Now())
		reply = s.core.Orders(node, hb.Running)
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

func (s *Server) jobExit(w http.ResponseWriter, r *http.Request) {
	node, id := r.PathValue("node"), r.PathValue("job")
	e, ok := readRequest(w, r, maxBody, parseExit)
	if !ok {
		return
	}
	s.change(w, http.StatusOK, func() (any, uint64, error) {
		recorded, b := s.core.JobExit(time.Now(), node, id, e)
		if !recorded {
			return map[string]string{"status": "ignored"}, s.wseq, nil
		}
		return s.commit(b, map[string]string{"status": "recorded"})
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
	project, ok := s.core.LiveTask(node, id)
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
	lim := s.core.LimitsOf(project)
	s.mu.Unlock()
	if err := s.logs.append(id, project, body, lim.MaxLogBytesPerJob, lim.MaxLogBytes); err != nil {
		switch {
		case errors.Is(err, errLogLimit):
			writeErr(w, http.StatusForbidden, fmt.Errorf("job %s: output dropped: %w; %s", id, err, lease.Raise(project, "max-log-bytes")))
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
	_, _ = s.flush(s.core.Tick(now))
}

func pemFingerprint(certPEM []byte) (string, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return "", fmt.Errorf("certificate: no PEM block")
	}
	return api.Fingerprint(block.Bytes), nil
}

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
