package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/textsafe"
)

// Tunnels carry a user's TCP connection to a port of one of their jobs:
// the user's request (POST /v1/leases/{id}/ports/{port}/connect) and the
// agent's (POST /v1/agent/nodes/{node}/tunnels/{tid}) are two full-duplex
// HTTP/2 streams the server splices. The agent opens its stream when told
// to on its order stream (GET /v1/agent/nodes/{node}/tunnels), over the
// TLS connection it keeps to the server with its node certificate, so
// nothing on the node listens for kiln and nodes reachable only from the
// server are reached.

// tunnelHub holds the agents' order streams and the tunnels.
type tunnelHub struct {
	mu      sync.Mutex
	links   map[string]*agentLink
	pending map[string]*pendingTunnel
	byJob   map[string]map[*tunnel]bool
}

// agentLink is an agent's order stream.
type agentLink struct {
	orders chan api.TunnelOrder
	gone   chan struct{} // closed when a newer stream of the node replaces it
}

// pendingTunnel waits for the agent's half. The user's handler closes
// decided once it made the tunnel (t) or gave up (t nil).
type pendingTunnel struct {
	node, job string
	arrived   chan *tunnelHalf
	decided   chan struct{}
	t         *tunnel
}

// tunnelHalf is one side of a tunnel: the request body that brings what
// that side sends, and the response that takes what it receives.
type tunnelHalf struct {
	body  io.ReadCloser
	w     io.Writer
	flush func() error
	cut   func() // unblocks a write that waits
	// writers counts the pumps that write to w: a handler returns only
	// once they stopped, as w is not to be used after.
	writers sync.WaitGroup
	// refused is the agent's reason when it could not connect.
	refused string
}

// tunnel is a live connection.
type tunnel struct {
	id, job     string
	user, agent *tunnelHalf
	last        atomic.Int64 // unix nanoseconds of the last byte
	once        sync.Once
	done        chan struct{}
	why         atomic.Pointer[string]
	// tap, when set, sees what the agent sends (a session's frames) in
	// the pump that carries it.
	tap func([]byte)
}

// Tunnel limits.
const (
	tunnelConnectWait = 10 * time.Second // for the agent to answer an order
	tunnelKeepAlive   = 30 * time.Second // a blank line on idle order streams
	maxTunnelRefusal  = 1024             // bytes of an agent's reason kept
	tunnelBuffer      = 64 << 10         // bytes copied at a time
	defaultTunnelIdle = 30 * time.Minute // Config.TunnelIdle
	maxTunnelsPerJob  = 256              // open at once
	maxPendingTunnels = 1024             // waiting for agents, server-wide
	tunnelOrderQueue  = 256              // orders waiting to be sent to one agent
)

func newTunnelHub() *tunnelHub {
	return &tunnelHub{links: map[string]*agentLink{}, pending: map[string]*pendingTunnel{}, byJob: map[string]map[*tunnel]bool{}}
}

// attach makes l the node's order stream, replacing an older one.
func (h *tunnelHub) attach(node string) *agentLink {
	l := &agentLink{orders: make(chan api.TunnelOrder, tunnelOrderQueue), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if old := h.links[node]; old != nil {
		close(old.gone)
	}
	h.links[node] = l
	return l
}

func (h *tunnelHub) detach(node string, l *agentLink) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.links[node] == l {
		delete(h.links, node)
	}
}

// order asks node's agent for a connection to a port of a job, or a
// session beside it (o without its id); the order waits for room in the
// agent's queue up to tunnelConnectWait.
func (h *tunnelHub) order(node string, o api.TunnelOrder) (string, *pendingTunnel, error) {
	job := o.JobID
	h.mu.Lock()
	l := h.links[node]
	if l == nil {
		h.mu.Unlock()
		return "", nil, errStatus(http.StatusServiceUnavailable, "the agent of node %s has no tunnel stream open (it is restarting, or older than the server): try again shortly", node)
	}
	if len(h.pending) >= maxPendingTunnels {
		h.mu.Unlock()
		return "", nil, errStatus(http.StatusTooManyRequests, "too many connections are being opened: try again shortly")
	}
	if len(h.byJob[job]) >= maxTunnelsPerJob {
		h.mu.Unlock()
		return "", nil, errStatus(http.StatusTooManyRequests, "job %s has %d connections open, the most it may", job, maxTunnelsPerJob)
	}
	id := "t-" + randHex(8)
	p := &pendingTunnel{node: node, job: job, arrived: make(chan *tunnelHalf, 1), decided: make(chan struct{})}
	h.pending[id] = p
	h.mu.Unlock()
	timer := time.NewTimer(tunnelConnectWait)
	defer timer.Stop()
	select {
	case l.orders <- withID(o, id):
		return id, p, nil
	case <-l.gone:
	case <-timer.C:
	}
	h.forget(id)
	return "", nil, errStatus(http.StatusServiceUnavailable, "the agent of node %s is not taking connections fast enough: try again shortly", node)
}

func withID(o api.TunnelOrder, id string) api.TunnelOrder {
	o.ID = id
	return o
}

// take hands the pending tunnel id to the agent of node.
func (h *tunnelHub) take(id, node string) *pendingTunnel {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.pending[id]
	if p == nil || p.node != node {
		return nil
	}
	delete(h.pending, id)
	return p
}

func (h *tunnelHub) forget(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.pending, id)
}

func (h *tunnelHub) add(t *tunnel) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.byJob[t.job]
	if m == nil {
		m = map[*tunnel]bool{}
		h.byJob[t.job] = m
	}
	m[t] = true
}

func (h *tunnelHub) remove(t *tunnel) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.byJob[t.job]; m != nil {
		delete(m, t)
		if len(m) == 0 {
			delete(h.byJob, t.job)
		}
	}
}

// endJob closes the tunnels of a job that ended.
func (h *tunnelHub) endJob(job string) {
	h.mu.Lock()
	ts := make([]*tunnel, 0, len(h.byJob[job]))
	for t := range h.byJob[job] {
		ts = append(ts, t)
	}
	h.mu.Unlock()
	for _, t := range ts {
		go t.close("the job ended")
	}
}

// close ends the tunnel: both bodies are closed and blocked writes cut,
// so that both handlers return.
func (t *tunnel) close(why string) { t.closeSparing(why, nil) }

// closeSparing is close, but spare's writer, which no pump uses any more
// (what it carried ended cleanly), is not cut: its answer ends whole
// rather than reset.
func (t *tunnel) closeSparing(why string, spare *tunnelHalf) {
	t.once.Do(func() {
		t.why.Store(&why)
		for _, h := range []*tunnelHalf{t.user, t.agent} {
			_ = h.body.Close()
			if h != spare {
				h.cut()
			}
		}
		close(t.done)
	})
}

// pump copies what one side sends to the other until either ends; its
// to.writers was counted.
func (t *tunnel) pump(from, to *tunnelHalf) {
	defer to.writers.Done()
	buf := make([]byte, tunnelBuffer)
	for {
		n, err := from.body.Read(buf)
		if n > 0 {
			t.last.Store(time.Now().UnixNano())
			if t.tap != nil && from == t.agent {
				t.tap(buf[:n])
			}
			if _, werr := to.w.Write(buf[:n]); werr != nil {
				t.close("the connection was cut")
				return
			}
			if ferr := to.flush(); ferr != nil {
				t.close("the connection was cut")
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				t.closeSparing("the connection was closed", to)
			} else {
				t.close("the connection was closed")
			}
			return
		}
	}
}

// connectPort is the user's half: POST /v1/leases/{id}/ports/{port}/connect.
func (s *Server) connectPort(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("port %q: want a TCP port, 1 to 65535", textsafe.Printable(trunc(r.PathValue("port")))))
		return
	}
	rank, err := rankOf(r)
	if err != nil {
		writeErr(w, http.StatusBadRequest, err)
		return
	}
	s.mu.Lock()
	job, node, err := s.portTarget(r, c, r.PathValue("id"), r.URL.Query().Get("job"), port, rank)
	s.mu.Unlock()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	user := httpHalf(r.Body, w)
	t, err := s.openTunnel(r.Context(), node, api.TunnelOrder{JobID: job, Port: port}, user, func(id string) error {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("X-Kiln-Tunnel", id)
		w.WriteHeader(http.StatusOK)
		return user.flush()
	}, nil)
	if err != nil {
		if r.Context().Err() == nil {
			writeErr(w, 0, err)
		}
		return
	}
	s.log.Info("tunnel open", "tunnel", t.id, "user", c.user.Name, "job", job, "node", node, "port", port)
	s.watchTunnel(r.Context(), t)
	user.writers.Wait()
	s.log.Info("tunnel closed", "tunnel", t.id, "why", *t.why.Load())
}

// httpHalf is the side of a tunnel that a request's body and its answer
// carry.
func httpHalf(body io.ReadCloser, w http.ResponseWriter) *tunnelHalf {
	rc := http.NewResponseController(w)
	return &tunnelHalf{body: body, w: w, flush: rc.Flush, cut: func() { _ = rc.SetWriteDeadline(time.Now()) }}
}

// openTunnel orders node's agent to connect to a port of a job, or to
// open a session beside it, and joins its answer to user; ready runs,
// with the tunnel's id, once the agent connected and before any byte of
// the job's reaches user.
func (s *Server) openTunnel(ctx context.Context, node string, o api.TunnelOrder, user *tunnelHalf, ready func(id string) error, tap func([]byte)) (*tunnel, error) {
	job := o.JobID
	id, p, err := s.tunnels.order(node, o)
	if err != nil {
		return nil, err
	}
	// The agent's handler waits for the decision: the tunnel, or none.
	defer close(p.decided)
	var agent *tunnelHalf
	select {
	case agent = <-p.arrived:
	case <-time.After(tunnelConnectWait):
		s.tunnels.forget(id)
		return nil, errStatus(http.StatusGatewayTimeout, "the agent of node %s did not answer within %s", node, tunnelConnectWait)
	case <-ctx.Done():
		s.tunnels.forget(id)
		return nil, ctx.Err()
	}
	if agent.refused != "" {
		if o.Session != nil {
			return nil, errStatus(http.StatusBadGateway, "a session beside job %s on node %s: %s", job, node, agent.refused)
		}
		return nil, errStatus(http.StatusBadGateway, "port %d of job %s on node %s: %s", o.Port, job, node, agent.refused)
	}
	if err := ready(id); err != nil {
		return nil, err
	}
	t := &tunnel{id: id, job: job, user: user, agent: agent, done: make(chan struct{}), tap: tap}
	t.last.Store(time.Now().UnixNano())
	s.tunnels.add(t)
	// Both pumps are counted before either handler may wait for them.
	user.writers.Add(1)
	agent.writers.Add(1)
	p.t = t // the agent's handler pumps the other way
	go t.pump(user, agent)
	return t, nil
}

// watchTunnel returns once t is closed: by either side, the job's end,
// the server stopping, ctx ending or the idle time passing.
func (s *Server) watchTunnel(ctx context.Context, t *tunnel) {
	defer s.tunnels.remove(t)
	idle := s.cfg.TunnelIdle
	tick := time.NewTicker(min(idle/4+time.Millisecond, time.Minute))
	defer tick.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-ctx.Done():
			t.close("the user went away")
		case <-s.closing:
			t.close("the server is stopping")
		case <-tick.C:
			if time.Since(time.Unix(0, t.last.Load())) > idle {
				t.close(fmt.Sprintf("idle for %s", idle))
			}
		}
	}
}

// dialJobPort is a connection to port of job for the server itself (the
// HTTP path): a tunnel whose user side is one end of an in-memory pipe.
func (s *Server) dialJobPort(ctx context.Context, node, job string, port int) (net.Conn, error) {
	mine, theirs := net.Pipe()
	user := &tunnelHalf{body: theirs, w: theirs, flush: func() error { return nil }, cut: func() { theirs.Close() }}
	t, err := s.openTunnel(ctx, node, api.TunnelOrder{JobID: job, Port: port}, user, func(string) error { return nil }, nil)
	if err != nil {
		mine.Close()
		theirs.Close()
		return nil, err
	}
	go s.watchTunnel(context.Background(), t)
	return &tunnelConn{Conn: mine, t: t}, nil
}

// tunnelConn closes its tunnel with it.
type tunnelConn struct {
	net.Conn
	t *tunnel
}

func (c *tunnelConn) Close() error {
	err := c.Conn.Close()
	c.t.close("the connection was closed")
	return err
}

// portTarget finds the job of lease id that declares port, and the node
// its task of the given rank runs on. Only the lease's owner and admins
// reach a lease's ports. s.mu is held.
func (s *Server) portTarget(r *http.Request, c *caller, leaseID, jobID string, port, rank int) (string, string, error) {
	l, jobs, err := s.reachable(r, c, leaseID, jobID, "reaches the ports of")
	if err != nil {
		return "", "", err
	}
	declared := false
	for i := len(jobs) - 1; i >= 0; i-- { // the newest job first
		j := s.core.Job(jobs[i])
		if j == nil || !slices.Contains(j.Spec.Ports, port) {
			continue
		}
		declared = true
		if j.State != api.JobRunning {
			continue
		}
		for _, t := range j.Tasks {
			if t.Rank == rank && t.State == api.JobRunning {
				return j.ID, t.Node, nil
			}
		}
	}
	if declared {
		return "", "", errStatus(http.StatusConflict, "no job of lease %s that declares port %d runs a task of rank %d now", l.ID, port, rank)
	}
	return "", "", errStatus(http.StatusNotFound, "no job of lease %s declares port %d (kiln run --port %d)", l.ID, port, port)
}

// tunnelOrders is the agent's order stream: one JSON order a line, and a
// blank line when idle so that a dead stream is noticed.
func (s *Server) tunnelOrders(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	l := s.tunnels.attach(node)
	defer s.tunnels.detach(node, l)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	enc := json.NewEncoder(w)
	keep := time.NewTicker(tunnelKeepAlive)
	defer keep.Stop()
	for {
		var err error
		select {
		case <-r.Context().Done():
			return
		case <-l.gone:
			return
		case <-s.closing:
			return
		case o := <-l.orders:
			err = enc.Encode(o)
		case <-keep.C:
			_, err = w.Write([]byte("\n"))
		}
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// tunnelAccept is the agent's half of tunnel tid, or its reason for
// refusing it (?refused=...).
func (s *Server) tunnelAccept(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	p := s.tunnels.take(r.PathValue("tid"), node)
	if p == nil {
		writeErr(w, http.StatusNotFound, fmt.Errorf("no connection %s waits for node %s", textsafe.Printable(trunc(r.PathValue("tid"))), node))
		return
	}
	half := httpHalf(r.Body, w)
	if why := r.URL.Query().Get("refused"); why != "" {
		if len(why) > maxTunnelRefusal {
			why = why[:maxTunnelRefusal]
		}
		half.refused = textsafe.Printable(why)
		p.arrived <- half
		<-p.decided
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	if err := half.flush(); err != nil {
		return
	}
	p.arrived <- half
	<-p.decided
	t := p.t
	if t == nil {
		return // the user gave up first
	}
	go t.pump(half, t.user)
	select {
	case <-t.done:
	case <-r.Context().Done():
		t.close("the agent went away")
	}
	half.writers.Wait()
}
