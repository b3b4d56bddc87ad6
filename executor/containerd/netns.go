package containerd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// isolated is a job whose container has a network namespace of its own
// (Config.IsolateNetwork): its ports are not on the node's loopback, so
// the agent reaches them through DialPort (agent.PortDialer) instead of
// checking the node's listeners.
type isolated struct{ *handle }

// DialPort connects to port on the loopback of the job's network
// namespace: the socket is made on a thread that entered the namespace
// (/proc/PID/ns/net of the container's first process), and the thread
// goes back to the agent's namespace before it runs anything else.
func (h isolated) DialPort(ctx context.Context, port int) (net.Conn, error) {
	select {
	case <-h.done:
		return nil, errors.New("the job has ended")
	default:
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: want 1 to 65535", port)
	}
	return dialInNetns(ctx, fmt.Sprintf("/proc/%d/ns/net", h.task.Pid()), port)
}

// dialInNetns dials 127.0.0.1:port inside the network namespace at path.
func dialInNetns(ctx context.Context, path string, port int) (net.Conn, error) {
	target, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("the job's network namespace: %w", err)
	}
	defer target.Close()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("the agent's network namespace: %w", err)}
			return
		}
		defer own.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("entering the job's network namespace: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		// A thread that cannot go back stays locked: it ends with this
		// goroutine instead of running others in the job's namespace.
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("port %d in the job's network namespace: %w", port, r.err)
	}
	return r.c, nil
}
