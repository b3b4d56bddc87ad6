package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/executor"
)

// PortDialer is a job handle whose ports are not on the node's loopback
// (a container with a network namespace of its own, a Pod): it connects
// to them itself.
type PortDialer interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// PortOwner is a job handle that can tell whether the process listening
// on a port of the node is the job's (jobs that share the node's network
// namespace): the agent connects only then.
type PortOwner interface {
	CheckPort(port int) error
}

// maxOrderLine bounds one line of the server's order stream (a session's
// order carries its command).
const maxOrderLine = 64 << 10

// runTunnels keeps the order stream open: the server asks on it for
// connections to the ports of this node's jobs, and each is carried on a
// stream of its own over the agent's connection to the server.
func (a *Agent) runTunnels(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		started := time.Now()
		err := a.tunnelOrders(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			backoff = 100 * time.Millisecond
		}
		a.log.Debug("tunnel order stream ended; opening it again", "err", err, "in", backoff)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (a *Agent) tunnelOrders(ctx context.Context) error {
	body, err := a.client.TunnelOrders(ctx, a.node)
	if err != nil {
		return err
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 512), maxOrderLine)
	var wg sync.WaitGroup
	defer wg.Wait()
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var o api.TunnelOrder
		if err := json.Unmarshal(line, &o); err != nil || o.ID == "" {
			a.log.Warn("unreadable tunnel order", "err", err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.serveTunnel(ctx, o)
		}()
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF
}

// serveTunnel connects to the job's port and carries the connection.
func (a *Agent) serveTunnel(ctx context.Context, o api.TunnelOrder) {
	if o.Session != nil {
		a.serveSession(ctx, o)
		return
	}
	conn, err := a.dialJob(ctx, o.JobID, o.Port)
	if err != nil {
		if rerr := a.client.RefuseTunnel(ctx, a.node, o.ID, err.Error()); rerr != nil {
			a.log.Debug("refusing a tunnel", "tunnel", o.ID, "err", rerr)
		}
		return
	}
	defer conn.Close()
	st, err := a.client.AcceptTunnel(ctx, a.node, o.ID)
	if err != nil {
		a.log.Debug("opening a tunnel", "tunnel", o.ID, "err", err)
		return
	}
	defer st.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(st, conn) // the job's bytes to the user
		// The job closed its side: the server passes on what is in
		// flight, then ends the stream, which ends the copy below.
		_ = st.CloseWrite()
	}()
	_, _ = io.Copy(conn, st) // the user's bytes to the job
	conn.Close()
	<-done
}

// runningJob is the handle of a job running here.
func (a *Agent) runningJob(jobID string) (*job, executor.Handle, error) {
	a.mu.Lock()
	j := a.jobs[jobID]
	var h executor.Handle
	if j != nil {
		h = j.h
	}
	a.mu.Unlock()
	if j == nil || h == nil {
		return nil, nil, fmt.Errorf("job %s does not run on this node", jobID)
	}
	return j, h, nil
}

// dialJob connects to port of a job running here that declared it.
func (a *Agent) dialJob(ctx context.Context, jobID string, port int) (net.Conn, error) {
	j, h, err := a.runningJob(jobID)
	switch {
	case err != nil:
		return nil, err
	case !slices.Contains(j.a.Spec.Ports, port):
		return nil, fmt.Errorf("job %s does not declare port %d", jobID, port)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d, ok := h.(PortDialer); ok {
		return d.DialPort(dctx, port)
	}
	// On the node's loopback, which jobs share, the port must be the
	// job's; a job whose executor cannot tell (a Pod, elsewhere) is not
	// reached there at all.
	o, ok := h.(PortOwner)
	if !ok {
		return nil, fmt.Errorf("the jobs of this node's executor cannot be reached through kiln yet")
	}
	if err := o.CheckPort(port); err != nil {
		return nil, fmt.Errorf("port %d: %w", port, err)
	}
	var dl net.Dialer
	conn, err := dl.DialContext(dctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		if c6, err6 := dl.DialContext(dctx, "tcp", net.JoinHostPort("::1", strconv.Itoa(port))); err6 == nil {
			return c6, nil
		}
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Err != nil {
			err = oe.Err
		}
		return nil, fmt.Errorf("nothing accepts connections on port %d (%v): is the job listening yet?", port, err)
	}
	return conn, nil
}

// openPorts finds which declared ports of the running jobs accept
// connections. Where the executor can tell (PortOwner), a listener of the
// job's on the port is enough, and the job's server gets no connection;
// otherwise a connection is opened and closed at once.
func (a *Agent) openPorts(ctx context.Context) map[string][]int {
	type target struct {
		id    string
		h     executor.Handle
		ports []int
	}
	var jobs []target
	a.mu.Lock()
	for id, j := range a.jobs {
		if len(j.a.Spec.Ports) > 0 && j.h != nil {
			jobs = append(jobs, target{id, j.h, j.a.Spec.Ports})
		}
	}
	a.mu.Unlock()
	var out map[string][]int
	for _, t := range jobs {
		for _, p := range t.ports {
			if !a.listens(ctx, t.id, t.h, p) {
				continue
			}
			if out == nil {
				out = map[string][]int{}
			}
			out[t.id] = append(out[t.id], p)
		}
	}
	return out
}

func (a *Agent) listens(ctx context.Context, job string, h executor.Handle, port int) bool {
	if o, ok := h.(PortOwner); ok {
		if _, dials := h.(PortDialer); !dials {
			return o.CheckPort(port) == nil
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	c, err := a.dialJob(pctx, job, port)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
