// Package executor runs jobs inside leases on a node: a process executor
// (environment per GPU vendor, MPS limits for fractions, cgroup limits) and
// a container executor (containerd, GPUs injected through CDI). The agent
// chooses one per job; both satisfy Executor.
package executor

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Device is one GPU (or MIG instance, or fraction of a GPU) granted to a job.
type Device struct {
	// Vendor is "nvidia", "amd" or "intel".
	Vendor string
	// Index is the device's index as the vendor's runtime numbers it
	// (CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES value).
	Index int
	// PCIAddress is canonical dddd:bb:dd.f.
	PCIAddress string
	// UUID is the GPU's (or MIG instance's) UUID where known; NVIDIA's
	// runtime accepts it in CUDA_VISIBLE_DEVICES.
	UUID string
	// CDIName is the fully qualified CDI device name ("kiln.dev/gpu=0").
	CDIName string
	// Share is set for a fractional lease.
	Share *Share
}

// Share is the part of a GPU a fractional lease gets and how it is enforced.
type Share struct {
	// MilliGPU is the compute share in thousandths of the GPU.
	MilliGPU int
	// MemoryBytes is the memory the job may use.
	MemoryBytes uint64
	// Isolation is "mig" (hardware), "mps" (enforced memory limit and
	// thread percentage) or "time-slicing" (none).
	Isolation string
}

// Limits are host resource limits for a job.
type Limits struct {
	CPUMilli    int
	MemoryBytes uint64
}

// Job is one command or image to run inside a lease.
type Job struct {
	ID      string
	LeaseID string
	// Command is argv; for a container job it overrides the image's
	// entrypoint when set.
	Command []string
	// Image is an OCI reference for container jobs; empty for processes.
	Image   string
	Env     map[string]string
	WorkDir string
	Devices []Device
	// Choose, when set, leaves it to the cluster's scheduler to pick this
	// many of Devices (the Kubernetes executor, which says so with
	// Chooser); the job gets those it picks.
	Choose int
	Limits Limits
	// ModelDir is a model's folder in the node's model cache, which a
	// container job gets read-only at ModelTarget (a process job reads it
	// where it is).
	ModelDir string
}

// ModelTarget is where a container job sees its model.
const ModelTarget = "/model"

// Chooser is an executor whose cluster's scheduler can pick a job's
// devices (Job.Choose).
type Chooser interface {
	LetsSchedulerChoose() bool
}

// Picked is a job's handle whose devices the cluster's scheduler picked:
// Picked gives their positions in Job.Devices once known (nil before).
type Picked interface {
	Picked() []int
}

// Exit is how a job ended.
type Exit struct {
	Code     int
	Signal   string
	Reason   string // "exited", "killed", "preempted", "expired", "failed to start"
	Finished time.Time
}

// Executor starts jobs.
type Executor interface {
	// Name is "process" or "containerd".
	Name() string
	// Start launches the job and returns at once; the job runs until it
	// exits or Stop is called.
	Start(ctx context.Context, job Job) (Handle, error)
}

// Reaper is an executor that can find the jobs a previous run of the
// agent left running (it crashed or was killed, its jobs outlived it) and
// stop them, so that their GPUs are free before the agent tells the server
// what runs.
type Reaper interface {
	Reap(ctx context.Context, grace time.Duration) ([]Leftover, error)
}

// Leftover is a job a previous run of the agent left.
type Leftover struct {
	Job, Lease string
	// Stopped is true when it still ran and was stopped; false when it
	// had ended already or could not be told apart from another process.
	Stopped bool
}

// Handle is a running job.
type Handle interface {
	// Logs streams the job's combined stdout and stderr from the start;
	// each call returns a new reader. Readers end when the job ends.
	Logs() io.ReadCloser
	// Wait blocks until the job ends.
	Wait(ctx context.Context) (Exit, error)
	// Stop asks the job to end (SIGTERM), then kills it after grace.
	Stop(ctx context.Context, grace time.Duration) error
}

// Cgrouped is a Handle whose job runs in a cgroup v2 of its own: every
// process the job starts is in it or below it, which is how the agent
// tells a GPU's processes by lease.
type Cgrouped interface {
	// Cgroup is the job's cgroup directory (/sys/fs/cgroup/kiln/job-j1);
	// empty when the job got none.
	Cgroup() string
}

// ExecSpec is a command to run beside a running job (kiln exec, kiln
// shell): as the job's user, with its environment, file system view and
// limits. An empty Command runs a shell.
type ExecSpec struct {
	Command []string
	// TTY runs it on a terminal of Rows x Cols of type Term; otherwise it
	// gets pipes, and Stderr is its own.
	TTY        bool
	Rows, Cols uint16
	Term       string
}

// Session is a command running beside a job.
type Session interface {
	// Stdin is its input (with TTY, what is typed on its terminal).
	Stdin() io.WriteCloser
	// Stdout is its output (with TTY, its terminal's); it ends when the
	// command and what it started closed it.
	Stdout() io.Reader
	// Stderr is its error output; nil with TTY.
	Stderr() io.Reader
	// Resize sets its terminal's size (TTY only).
	Resize(rows, cols uint16) error
	// Signal sends sig ("INT", "TERM", "HUP", "QUIT", "KILL") to its
	// process group.
	Signal(sig string) error
	// Wait returns how it ended.
	Wait(ctx context.Context) (Exit, error)
	// Close ends it (SIGKILL) if it still runs and frees its terminal.
	Close() error
}

// SignalNamed is the signal a Session's Signal takes by name ("INT" or
// "SIGINT", any case): INT, TERM, HUP, QUIT and KILL.
func SignalNamed(name string) (syscall.Signal, bool) {
	switch strings.TrimPrefix(strings.ToUpper(name), "SIG") {
	case "INT":
		return syscall.SIGINT, true
	case "TERM":
		return syscall.SIGTERM, true
	case "HUP":
		return syscall.SIGHUP, true
	case "QUIT":
		return syscall.SIGQUIT, true
	case "KILL":
		return syscall.SIGKILL, true
	}
	return 0, false
}

// CheckCommand refuses a session's command that no executor can run: an
// empty program name, or an argument holding a NUL byte. No command at
// all (a shell) passes.
func CheckCommand(argv []string) error {
	for i, a := range argv {
		if a == "" && i == 0 || strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("argument %d of the command is empty or holds a NUL byte", i+1)
		}
	}
	return nil
}

// SessionEnd is how a session ended, once it has: executors' sessions
// embed one, and the first Finish is kept. The zero value is not ready:
// use NewSessionEnd.
type SessionEnd struct {
	once sync.Once
	done chan struct{}
	exit Exit
}

// NewSessionEnd is a session that has not ended.
func NewSessionEnd() *SessionEnd { return &SessionEnd{done: make(chan struct{})} }

// Finish records how the session ended; later calls change nothing.
func (e *SessionEnd) Finish(x Exit) {
	e.once.Do(func() {
		e.exit = x
		close(e.done)
	})
}

// Done is closed once the session ended.
func (e *SessionEnd) Done() <-chan struct{} { return e.done }

// Ended reports whether the session ended.
func (e *SessionEnd) Ended() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// Wait implements Session's Wait.
func (e *SessionEnd) Wait(ctx context.Context) (Exit, error) {
	select {
	case <-e.done:
		return e.exit, nil
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

// DefaultSessionShell is what a session without a command runs in a
// container: bash where the image has it, else sh.
var DefaultSessionShell = []string{"/bin/sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash; exec sh"}

// Execer is a job handle that runs commands beside its job.
type Execer interface {
	Exec(ctx context.Context, spec ExecSpec) (Session, error)
}
