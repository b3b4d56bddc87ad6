package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/process"
)

// handle is one running container job.
type handle struct {
	id      string
	logPath string
	logFile *os.File // the job's output is appended here until it ends
	poll    time.Duration
	task    client.Task
	ctr     client.Container // its container (sessions read its spec)
	fifoDir string           // where sessions' FIFOs are made
	done    chan struct{}
	owned   process.Owned // its listeners found so far (CheckPort)

	mu       sync.Mutex
	stopping bool
	exit     executor.Exit
	err      error

	cgOnce sync.Once
	cg     string
}

var _ executor.Handle = (*handle)(nil)
var _ executor.Cgrouped = (*handle)(nil)

// Cgroup is the cgroup directory of the job's container, as its first
// process's /proc entry says (executor.Cgrouped); "" when it cannot be
// read. Every process of the container is in it or below it.
func (h *handle) Cgroup() string {
	h.cgOnce.Do(func() { h.cg = cgroupDir("/proc", int(h.task.Pid())) })
	return h.cg
}

// cgroupDir is the cgroup v2 directory of a process, or "".
func cgroupDir(proc string, pid int) string {
	if c := process.CgroupOf(proc, pid); c != "" {
		return filepath.Join("/sys/fs/cgroup", c)
	}
	return ""
}

// Logs follows the job's log file from its start; the reader ends once
// the job has ended and all its output has been read.
func (h *handle) Logs() io.ReadCloser {
	f, err := os.Open(h.logPath)
	if err != nil {
		return io.NopCloser(&errReader{fmt.Errorf("job %s: logs: %w", h.id, err)})
	}
	return &follower{f: f, done: h.done, poll: h.poll, closed: make(chan struct{})}
}

// Wait blocks until the job has ended and been removed.
func (h *handle) Wait(ctx context.Context) (executor.Exit, error) {
	select {
	case <-h.done:
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.exit, h.err
	case <-ctx.Done():
		return executor.Exit{}, ctx.Err()
	}
}

// Stop sends SIGTERM to the job's first process, and SIGKILL to all its
// processes when it has not ended after grace. A job's first process is
// PID 1 of its container, which ignores SIGTERM unless it handles it: such
// a job ends at the SIGKILL.
func (h *handle) Stop(ctx context.Context, grace time.Duration) error {
	select {
	case <-h.done:
		return nil
	default:
	}
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	if err := h.task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("job %s: SIGTERM: %w", h.id, err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	if err := h.task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("job %s: SIGKILL: %w", h.id, err)
	}
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// signalOf names the signal of an exit status of 128+n, the way runc
// reports a process killed by signal n.
func signalOf(code uint32) string {
	if code <= 128 || code > 128+64 {
		return ""
	}
	return unix.SignalName(syscall.Signal(code - 128))
}

// follower reads a file that another process appends to, until done is
// closed and the file has been read to its end.
type follower struct {
	f      *os.File
	done   <-chan struct{}
	poll   time.Duration
	once   sync.Once
	closed chan struct{}
}

func (r *follower) Read(p []byte) (int, error) {
	for {
		n, err := r.f.Read(p)
		if n > 0 {
			return n, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		select {
		case <-r.closed:
			return 0, os.ErrClosed
		case <-r.done:
			// The job is over and its output flushed: what is left is
			// read, then the stream ends.
			n, err := r.f.Read(p)
			if n > 0 {
				return n, nil
			}
			if err == nil || errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			return 0, err
		case <-time.After(r.poll):
		}
	}
}

func (r *follower) Close() error {
	r.once.Do(func() { close(r.closed) })
	return r.f.Close()
}

type errReader struct{ err error }

func (r *errReader) Read([]byte) (int, error) { return 0, r.err }

// CheckPort implements agent.PortOwner: the process listening on port of
// the node's loopback is the container's (it runs in the host's network
// namespace unless the executor isolates it).
func (h *handle) CheckPort(port int) error {
	return h.owned.CheckListener(int(h.task.Pid()), port)
}
