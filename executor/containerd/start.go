package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/identifiers"

	"kiln.dev/kiln/executor"
)

// cleanupTimeout bounds how long removing a finished job's task and
// container may take.
const cleanupTimeout = 30 * time.Second

// Start pulls the job's image when needed, creates its container and
// starts it. ctx bounds the pull and the start, not the job.
func (e *Executor) Start(ctx context.Context, job executor.Job) (executor.Handle, error) {
	if err := identifiers.Validate(job.ID); err != nil {
		return nil, fmt.Errorf("job id %q cannot name a container: %w", job.ID, err)
	}
	if job.Image == "" {
		return nil, fmt.Errorf("job %s: %w", job.ID, ErrNoImage)
	}
	ctx = e.ns(ctx)
	image, err := e.Pull(ctx, job.Image)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", job.ID, err)
	}
	opts, err := e.specOpts(job, image)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{LabelJob: job.ID}
	if job.LeaseID != "" {
		labels[LabelLease] = job.LeaseID
	}
	if e.cfg.Node != "" {
		labels[LabelNode] = e.cfg.Node
	}
	copts := []client.NewContainerOpts{client.WithImage(image)}
	if e.cfg.Snapshotter != "" {
		copts = append(copts, client.WithSnapshotter(e.cfg.Snapshotter))
	}
	copts = append(copts,
		client.WithNewSnapshot(job.ID+"-rootfs", image),
		client.WithRuntime(e.cfg.Runtime, nil),
		client.WithNewSpec(opts...),
		client.WithContainerLabels(labels),
	)
	ctr, err := e.client.NewContainer(ctx, job.ID, copts...)
	if err != nil {
		return nil, fmt.Errorf("job %s: creating container: %w", job.ID, err)
	}

	// The job outlives ctx: everything after the start uses a context
	// that keeps the namespace but not the caller's deadline.
	bg := context.WithoutCancel(ctx)
	logPath := e.LogPath(job.ID)
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
	if err != nil {
		e.remove(bg, ctr, nil)
		return nil, fmt.Errorf("job %s: log file: %w", job.ID, err)
	}
	// The job's stdout and stderr reach this process through FIFOs and are
	// appended to its log file here (an *os.File takes concurrent writes).
	// Not the shim's own file logging: the shim gives its copy of the
	// output only 2 s after the task is deleted, and on a loaded machine
	// lines went missing; the client waits for these FIFOs to drain before
	// it deletes the task.
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, logFile, logFile), cio.WithFIFODir(filepath.Join(e.cfg.LogDir, "fifo"))))
	if err != nil {
		logFile.Close()
		e.remove(bg, ctr, nil)
		return nil, fmt.Errorf("job %s: creating task: %w", job.ID, err)
	}
	exitCh, err := task.Wait(bg)
	if err != nil {
		e.remove(bg, ctr, task)
		logFile.Close()
		return nil, fmt.Errorf("job %s: %w", job.ID, err)
	}
	if err := task.Start(ctx); err != nil {
		e.remove(bg, ctr, task)
		logFile.Close()
		return nil, fmt.Errorf("job %s: starting: %w", job.ID, err)
	}
	e.log.Info("job started", "job", job.ID, "image", image.Name(), "pid", task.Pid())
	h := &handle{
		id:      job.ID,
		logPath: logPath,
		logFile: logFile,
		poll:    e.cfg.PollInterval,
		task:    task,
		ctr:     ctr,
		fifoDir: filepath.Join(e.cfg.LogDir, "fifo"),
		done:    make(chan struct{}),
	}
	go h.watch(bg, e, ctr, exitCh)
	if e.cfg.IsolateNetwork {
		return isolated{h}, nil
	}
	return h, nil
}

// remove deletes a job's task and container with its snapshot.
func (e *Executor) remove(ctx context.Context, ctr client.Container, task client.Task) {
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	if task != nil {
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil {
			e.log.Warn("removing task", "container", ctr.ID(), "err", err)
		}
	}
	if err := ctr.Delete(ctx, client.WithSnapshotCleanup); err != nil {
		e.log.Warn("removing container", "container", ctr.ID(), "err", err)
	}
}

// watch waits for the task to end, removes it (the client first waits for
// its output to drain into the log file), then records the exit.
func (h *handle) watch(ctx context.Context, e *Executor, ctr client.Container, exitCh <-chan client.ExitStatus) {
	st := <-exitCh
	code, at, err := st.Result()
	e.remove(ctx, ctr, h.task)
	if err := h.logFile.Close(); err != nil {
		e.log.Warn("closing job log", "job", h.id, "err", err)
	}
	exit := executor.Exit{Code: int(code), Finished: at, Reason: "exited"}
	var waitErr error
	if err != nil {
		waitErr = fmt.Errorf("job %s: ended without an exit status: %w", h.id, err)
		e.log.Warn("job ended without an exit status", "job", h.id, "err", err)
	}
	if at.IsZero() {
		exit.Finished = time.Now()
	}
	if sig := signalOf(code); sig != "" {
		exit.Signal = sig
	}
	h.mu.Lock()
	if h.stopping {
		exit.Reason = "killed"
	}
	h.exit, h.err = exit, waitErr
	h.mu.Unlock()
	close(h.done)
	e.log.Info("job ended", "job", h.id, "code", exit.Code, "signal", exit.Signal, "reason", exit.Reason)
}
