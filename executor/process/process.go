// Package process is the process executor: a job runs as a local process
// group with the environment that gives it its GPUs (per vendor), MPS
// limits for fractions, cgroup v2 limits where kiln may write them, and
// its standard output and error captured.
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"kiln.dev/kiln/executor"
)

// Executor runs jobs as processes.
type Executor struct {
	// CgroupParent is the cgroup v2 directory under which each job gets
	// its own cgroup; empty: /sys/fs/cgroup/kiln.
	CgroupParent string
	// Env is the base environment; nil: the agent's own.
	Env []string
	// MaxLogBytes bounds the output kept per job (default 64 MiB).
	MaxLogBytes int
	// StateDir, when set, holds a record of each running job (its process
	// and start time), removed when the job ends; Reap finds there the
	// jobs of a previous run that crashed.
	StateDir string
	// Sandbox keeps jobs away from kiln and from each other (a user of
	// their own, namespaces, a clean environment); nil: jobs run as the
	// agent's user with its environment, as a library caller may want. kiln
	// agent always sets one.
	Sandbox *Sandbox

	probeOnce sync.Once
	delivered Delivered
	nsFlags   uintptr
}

// Name implements executor.Executor.
func (e *Executor) Name() string { return "process" }

// Start implements executor.Executor.
func (e *Executor) Start(ctx context.Context, job executor.Job) (executor.Handle, error) {
	return e.StartWith(ctx, job, JobOptions{})
}

func checkJob(job executor.Job) error {
	if len(job.Command) == 0 {
		return errors.New("process executor: the job has no command")
	}
	if job.Image != "" {
		return fmt.Errorf("process executor: job %s names image %s; images run in the containerd executor", job.ID, job.Image)
	}
	return nil
}

// startPlain runs a job as the agent's user (no sandbox).
func (e *Executor) startPlain(ctx context.Context, job executor.Job) (executor.Handle, error) {
	if len(job.Command) == 0 {
		return nil, errors.New("process executor: the job has no command")
	}
	if job.Image != "" {
		return nil, fmt.Errorf("process executor: job %s names image %s; images run in the containerd executor", job.ID, job.Image)
	}
	cmd := exec.Command(job.Command[0], job.Command[1:]...)
	base := e.Env
	if base == nil {
		base = os.Environ()
	}
	extra := map[string]string{"KILN_JOB_ID": job.ID, "KILN_LEASE_ID": job.LeaseID}
	for k, v := range Env(job.Devices) {
		extra[k] = v
	}
	cmd.Env = environ(base, job.Env, extra)
	cmd.Dir = job.WorkDir
	h := &handle{logs: newLogBuffer(e.MaxLogBytes), done: make(chan struct{}), env: cmd.Env, dir: cmd.Dir}
	cmd.Stdout, cmd.Stderr = h.logs, h.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if job.Limits.CPUMilli > 0 || job.Limits.MemoryBytes > 0 {
		dir, fd, err := e.cgroup(job, 0)
		if err != nil {
			fmt.Fprintf(h.logs, "kiln: cgroup limits not applied: %v\n", err)
		} else {
			h.cgroup = dir
			cmd.SysProcAttr.UseCgroupFD = true
			cmd.SysProcAttr.CgroupFD = fd
			defer syscall.Close(fd)
		}
	}
	if err := cmd.Start(); err != nil {
		h.removeCgroup()
		return nil, fmt.Errorf("starting %s: %w", job.Command[0], err)
	}
	h.cmd = cmd
	if e.StateDir != "" {
		r := record{Job: job.ID, Lease: job.LeaseID, PID: cmd.Process.Pid}
		var err error
		if r.Start, err = procStart(r.PID); err == nil {
			err = e.writeRecord(r)
		}
		if err != nil {
			fmt.Fprintf(h.logs, "kiln: no record of this job kept; if the agent crashes it is not found again: %v\n", err)
		} else {
			h.record = e.recordPath(job.ID)
		}
	}
	go h.wait()
	return h, nil
}

func (e *Executor) cgroupParent() string {
	if e.CgroupParent != "" {
		return e.CgroupParent
	}
	return "/sys/fs/cgroup/kiln"
}

// cgroupRoot says why jobs get no cgroup here, or nil: a cgroup v2
// hierarchy whose cpu, memory and pids controllers kiln may enable.
func (e *Executor) cgroupRoot() error {
	root := filepath.Dir(e.cgroupParent())
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("no cgroup v2 hierarchy at %s", root)
	}
	have := strings.Fields(string(b))
	for _, c := range []string{"cpu", "memory", "pids"} {
		if !slices.Contains(have, c) {
			return fmt.Errorf("the cgroup v2 hierarchy at %s has no %s controller (it has: %s)", root, c, strings.Join(have, " "))
		}
	}
	return nil
}

// cgroup makes the job's cgroup with its limits (pidsMax > 0: a pids
// limit too) and opens it for CLONE_INTO_CGROUP.
func (e *Executor) cgroup(job executor.Job, pidsMax int) (string, int, error) {
	parent := e.cgroupParent()
	root := filepath.Dir(parent)
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		return "", -1, fmt.Errorf("no cgroup v2 hierarchy at %s", root)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", -1, fmt.Errorf("%s: %w", parent, err)
	}
	_ = os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+cpu +memory +pids"), 0)
	_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+cpu +memory +pids"), 0)
	dir := filepath.Join(parent, "job-"+filepath.Base(job.ID))
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return "", -1, fmt.Errorf("%s: %w", dir, err)
	}
	if job.Limits.CPUMilli > 0 {
		quota := job.Limits.CPUMilli * 100 // per 100 ms period
		if err := os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(strconv.Itoa(quota)+" 100000"), 0); err != nil {
			os.Remove(dir)
			return "", -1, fmt.Errorf("cpu.max: %w", err)
		}
	}
	if job.Limits.MemoryBytes > 0 {
		if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatUint(job.Limits.MemoryBytes, 10)), 0); err != nil {
			os.Remove(dir)
			return "", -1, fmt.Errorf("memory.max: %w", err)
		}
	}
	if pidsMax > 0 {
		if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(pidsMax)), 0); err != nil {
			os.Remove(dir)
			return "", -1, fmt.Errorf("pids.max: %w", err)
		}
	}
	fd, err := syscall.Open(dir, syscall.O_DIRECTORY|syscall.O_RDONLY, 0)
	if err != nil {
		os.Remove(dir)
		return "", -1, err
	}
	return dir, fd, nil
}

type handle struct {
	cmd    *exec.Cmd
	logs   *logBuffer
	cgroup string
	record string // the job's record file, removed when it ends
	done   chan struct{}
	// A sandboxed job runs under a job init: status is its reports,
	// jobPID the job's process group when it has no PID namespace (0
	// otherwise: killing the init ends the namespace), cleanup gives back
	// its directory and user.
	status  *initStatus
	jobPID  int
	cleanup func()
	owned   Owned // its listeners found so far (CheckPort)
	// Sessions beside the job (Exec): through the init's control socket
	// as the job's user (uid, gid), or, without a sandbox, with the job's
	// environment and directory.
	ctl      *ctlConn
	uid, gid int
	env      []string
	dir      string

	mu      sync.Mutex
	exit    executor.Exit
	stopped bool
}

func (h *handle) wait() {
	err := h.cmd.Wait()
	ex := executor.Exit{Reason: "exited", Finished: time.Now()}
	if h.cmd.ProcessState != nil {
		ex.Code = h.cmd.ProcessState.ExitCode()
		if ws, ok := h.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			ex.Signal = ws.Signal().String()
			ex.Code = 128 + int(ws.Signal())
		}
	} else if err != nil {
		ex.Code, ex.Reason = -1, err.Error()
	}
	if h.status != nil {
		// The init reports how the job itself ended.
		if last := h.status.lastReport(); last != "" {
			if jex, ok := exitOf(last); ok {
				ex.Code, ex.Signal = jex.Code, jex.Signal
			}
		} else if ex.Signal == "" {
			ex.Code, ex.Reason = -1, "the job init ended without a report"
		}
		h.status.c.Close()
		if h.jobPID > 0 {
			_ = syscall.Kill(-h.jobPID, syscall.SIGKILL)
		}
	}
	// The leader is gone; end what it left in its group.
	_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
	h.mu.Lock()
	if h.stopped {
		ex.Reason = "killed"
	}
	h.exit = ex
	h.mu.Unlock()
	h.removeCgroup()
	if h.record != "" {
		_ = os.Remove(h.record)
	}
	if h.ctl != nil {
		h.ctl.close()
	}
	if h.cleanup != nil {
		h.cleanup()
	}
	h.logs.Close()
	close(h.done)
}

func (h *handle) removeCgroup() {
	if h.cgroup != "" {
		_ = os.Remove(h.cgroup)
	}
}

// Logs implements executor.Handle.
func (h *handle) Logs() io.ReadCloser { return h.logs.reader() }

// Cgroup is the job's cgroup directory, or "" (executor.Cgrouped).
func (h *handle) Cgroup() string { return h.cgroup }

// Wait implements executor.Handle.
func (h *handle) Wait(ctx context.Context) (executor.Exit, error) {
	select {
	case <-h.done:
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.exit, nil
	case <-ctx.Done():
		return executor.Exit{}, ctx.Err()
	}
}

// Stop implements executor.Handle: SIGTERM to the job's process group,
// SIGKILL after grace.
func (h *handle) Stop(ctx context.Context, grace time.Duration) error {
	select {
	case <-h.done:
		return nil
	default:
	}
	h.mu.Lock()
	h.stopped = true
	h.mu.Unlock()
	pgid := -h.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-h.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL)
	if h.jobPID > 0 {
		_ = syscall.Kill(-h.jobPID, syscall.SIGKILL)
	}
	select {
	case <-h.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("job process %d did not end after SIGKILL", h.cmd.Process.Pid)
	}
}
