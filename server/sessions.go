package server

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/lease"
	"kiln.dev/kiln/textsafe"
)

// Sessions (kiln exec, kiln shell) are tunnels whose far end is a command
// the agent runs beside the job instead of a port: the user's stream
// starts with an open frame the server reads, checks and passes to the
// agent in its order; the rest are session frames the server carries as
// they are. Who opened a session on which lease, and when it closed, are
// events of the lease; what is typed is not kept.

// sessionOpenWait bounds how long the server waits for a session's open
// frame.
const sessionOpenWait = 10 * time.Second

// openSession is the user's half of a session:
// POST /v1/leases/{id}/sessions[?job=&rank=].
func (s *Server) openSession(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	rank, err := rankOf(r)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	req, rest, err := readSessionOpen(w, r)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	if !s.lockForChange(w) {
		return
	}
	job, node, l, err := s.sessionTarget(r, c, r.PathValue("id"), r.URL.Query().Get("job"), rank)
	if err != nil {
		s.mu.Unlock()
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	what := sessionWhat(req)
	// The session is on record before it opens.
	b := &lease.Changes{At: time.Now().UTC()}
	b.Event("session.opened", l.ID, l.Project, "%s opened a %s beside job %s on node %s", c.user.Name, what, job, node)
	seq, err := s.flush(b)
	s.mu.Unlock()
	if err == nil {
		err = s.durable(seq)
	}
	if err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return
	}
	user := httpHalf(rest, w)
	tap := &exitTap{}
	order := api.TunnelOrder{JobID: job, Session: &api.SessionOrder{SessionRequest: req, User: c.user.Name}}
	t, err := s.openTunnel(r.Context(), node, order, user, func(id string) error {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("X-Kiln-Tunnel", id)
		w.WriteHeader(http.StatusOK)
		return user.flush()
	}, tap.write)
	if err != nil {
		s.sessionClosed(l, c.user.Name, what, 0, err.Error())
		if r.Context().Err() == nil {
			writeErr(w, 0, err)
		}
		return
	}
	started := time.Now()
	s.log.Info("session open", "tunnel", t.id, "user", c.user.Name, "job", job, "node", node, "what", what)
	s.watchTunnel(r.Context(), t)
	user.writers.Wait()
	why := *t.why.Load()
	// The agent's side (done: its writer stopped) says how it ended.
	if tap.exit != nil {
		why = exitText(*tap.exit)
	} else if tap.err != "" {
		why = tap.err
	}
	s.log.Info("session closed", "tunnel", t.id, "why", why)
	s.sessionClosed(l, c.user.Name, what, time.Since(started), why)
}

// exitText says how a session's command ended, for the record.
func exitText(ex api.SessionExit) string {
	var b strings.Builder
	if ex.Signal != "" {
		fmt.Fprintf(&b, "killed by %s", textsafe.Printable(trunc(ex.Signal)))
	} else {
		fmt.Fprintf(&b, "exit code %d", ex.Code)
	}
	if ex.Reason != "" {
		fmt.Fprintf(&b, " (%s)", textsafe.Printable(trunc(ex.Reason)))
	}
	return b.String()
}

// exitTap follows the frames a session's node sends, as the tunnel
// carries them, and keeps how the session ended.
type exitTap struct {
	hdr     [5]byte
	nh      int // header bytes read of the current frame
	left    int // payload bytes still to come
	payload []byte
	broken  bool
	exit    *api.SessionExit
	err     string
}

func (t *exitTap) write(p []byte) {
	for len(p) > 0 && !t.broken {
		if t.nh < len(t.hdr) {
			n := copy(t.hdr[t.nh:], p)
			t.nh, p = t.nh+n, p[n:]
			if t.nh < len(t.hdr) {
				return
			}
			t.left, t.payload = int(binary.BigEndian.Uint32(t.hdr[1:])), t.payload[:0]
			if t.left > api.MaxFrame {
				t.broken = true
				return
			}
		}
		n := min(len(p), t.left)
		if k := t.hdr[0]; k == api.FrameExit || k == api.FrameError {
			t.payload = append(t.payload, p[:n]...)
		}
		t.left, p = t.left-n, p[n:]
		if t.left == 0 {
			t.frame()
		}
	}
}

func (t *exitTap) frame() {
	switch t.hdr[0] {
	case api.FrameExit:
		var ex api.SessionExit
		if json.Unmarshal(t.payload, &ex) == nil {
			t.exit = &ex
		}
	case api.FrameError:
		t.err = textsafe.Printable(truncTo(string(t.payload), 300))
	}
	t.nh = 0
}

// sessionClosed records a session's end (not waited for: the user is
// answered already).
func (s *Server) sessionClosed(l *api.Lease, user, what string, d time.Duration, why string) {
	b := &lease.Changes{At: time.Now().UTC()}
	if d > 0 {
		round := time.Second
		if d < time.Minute {
			round = 100 * time.Millisecond
		}
		b.Event("session.closed", l.ID, l.Project, "%s's %s ended after %s: %s", user, what, max(d.Round(round), round), why)
	} else {
		b.Event("session.closed", l.ID, l.Project, "%s's %s did not open: %s", user, what, textsafe.Printable(truncTo(why, 300)))
	}
	s.mu.Lock()
	_, _ = s.flush(b)
	s.mu.Unlock()
}

// sessionWhat names a session for the record: a shell, or the program an
// exec runs (its arguments may hold secrets and are not kept).
func sessionWhat(req api.SessionRequest) string {
	if len(req.Command) == 0 {
		return "shell"
	}
	prog := textsafe.Printable(trunc(req.Command[0]))
	if req.TTY {
		return "terminal running " + strconv.Quote(prog)
	}
	return "session running " + strconv.Quote(prog)
}

// readSessionOpen reads the open frame that starts a session's stream, and
// returns the request and the rest of the stream.
func readSessionOpen(w http.ResponseWriter, r *http.Request) (api.SessionRequest, io.ReadCloser, error) {
	var req api.SessionRequest
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(sessionOpenWait))
	br := bufio.NewReaderSize(r.Body, 4096)
	buf := make([]byte, api.MaxFrame)
	kind, p, err := api.ReadFrame(br, buf)
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		return req, nil, fmt.Errorf("reading the session's open frame (within %s): %w", sessionOpenWait, err)
	}
	if kind != api.FrameOpen {
		return req, nil, fmt.Errorf("a session starts with an open frame (%q); got %q", api.FrameOpen, kind)
	}
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, nil, fmt.Errorf("the session's open frame: %w", err)
	}
	if err := req.Check(); err != nil {
		return req, nil, fmt.Errorf("session: %w", err)
	}
	return req, struct {
		io.Reader
		io.Closer
	}{br, r.Body}, nil
}

// rankOf reads the ?rank= of a request to a task (0 when absent).
func rankOf(r *http.Request) (int, error) {
	v := r.URL.Query().Get("rank")
	if v == "" {
		return 0, nil
	}
	rank, err := strconv.Atoi(v)
	if err != nil || rank < 0 || rank > 1<<16 {
		return 0, fmt.Errorf("rank %q: want a task's rank, 0 or more", textsafe.Printable(trunc(v)))
	}
	return rank, nil
}

// sessionTarget finds the running job of lease id (the newest, or jobID)
// and the node its task of the given rank runs on. s.mu is held.
func (s *Server) sessionTarget(r *http.Request, c *caller, leaseID, jobID string, rank int) (string, string, *api.Lease, error) {
	l, jobs, err := s.reachable(r, c, leaseID, jobID, "opens sessions in")
	if err != nil {
		return "", "", nil, err
	}
	running := false
	for i := len(jobs) - 1; i >= 0; i-- { // the newest job first
		j := s.core.Job(jobs[i])
		if j == nil || j.State != api.JobRunning {
			continue
		}
		running = true
		for _, t := range j.Tasks {
			if t.Rank == rank && t.State == api.JobRunning {
				return j.ID, t.Node, l, nil
			}
		}
	}
	if running {
		return "", "", nil, errStatus(http.StatusConflict, "no running job of lease %s has a task of rank %d now", l.ID, rank)
	}
	return "", "", nil, errStatus(http.StatusConflict, "lease %s runs no job now: a session runs beside a running job (kiln run -d --lease %s -- sleep infinity, then kiln shell)", l.ID, l.ID)
}

// reachable checks that c may reach the jobs of lease leaseID (its owner,
// or an admin) and that it is granted; it returns the lease and its jobs
// (only jobID when given). s.mu is held.
func (s *Server) reachable(r *http.Request, c *caller, leaseID, jobID, verb string) (*api.Lease, []string, error) {
	l, live, err := s.leaseByID(r, leaseID)
	if err != nil {
		return nil, nil, err
	}
	if c.user == nil || (l.User != c.user.Name && !c.admin()) {
		return nil, nil, errStatus(http.StatusForbidden, "only the lease's owner (%s) or an admin %s lease %s", l.User, verb, l.ID)
	}
	if !live || l.State != api.LeaseGranted {
		return nil, nil, errStatus(http.StatusConflict, "lease %s is %s: only a granted lease's jobs are reached", l.ID, l.State)
	}
	jobs := l.Jobs
	if jobID != "" {
		if !slices.Contains(jobs, jobID) {
			return nil, nil, errStatus(http.StatusNotFound, "lease %s has no job %s", l.ID, textsafe.Printable(trunc(jobID)))
		}
		jobs = []string{jobID}
	}
	return l, jobs, nil
}

// truncTo cuts s to n bytes, on a character's boundary.
func truncTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
