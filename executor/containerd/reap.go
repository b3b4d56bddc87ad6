package containerd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"kiln.dev/kiln/executor"
)

var _ executor.Reaper = (*Executor)(nil)

// Reap stops the jobs a previous run of the agent left: kiln's containers
// of this node (Config.Node; every kiln container when it is empty) still
// in containerd. Each running task gets SIGTERM, SIGKILL after grace; then
// task and container are removed, so that the GPUs are free before the
// agent tells the server what runs. Their log files stay.
func (e *Executor) Reap(ctx context.Context, grace time.Duration) ([]executor.Leftover, error) {
	filter := fmt.Sprintf("labels.%q", LabelJob)
	if e.cfg.Node != "" {
		filter = fmt.Sprintf("labels.%q==%q", LabelNode, e.cfg.Node)
	}
	ctx = e.ns(ctx)
	ctrs, err := e.client.Containers(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("listing kiln's containers: %w", err)
	}
	var out []executor.Leftover
	var errs []error
	for _, ctr := range ctrs {
		labels, _ := ctr.Labels(ctx)
		lo := executor.Leftover{Job: ctr.ID(), Lease: labels[LabelLease]}
		task, err := ctr.Task(ctx, nil)
		switch {
		case errdefs.IsNotFound(err):
			task = nil
		case err != nil:
			errs = append(errs, fmt.Errorf("container %s: %w", ctr.ID(), err))
			continue
		}
		if task != nil {
			if st, err := task.Status(ctx); err == nil && st.Status == client.Running {
				lo.Stopped = true
				if err := stopTask(ctx, task, grace); err != nil {
					errs = append(errs, fmt.Errorf("container %s: %w", ctr.ID(), err))
				}
			}
		}
		e.remove(context.WithoutCancel(ctx), ctr, task)
		out = append(out, lo)
	}
	return out, errors.Join(errs...)
}

// stopTask sends SIGTERM, then SIGKILL to every process after grace, and
// waits for the task to end.
func stopTask(ctx context.Context, task client.Task, grace time.Duration) error {
	exitCh, err := task.Wait(ctx)
	if err != nil {
		return err
	}
	if err := task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exitCh:
		return nil
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("SIGKILL: %w", err)
	}
	select {
	case <-exitCh:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("the task did not end after SIGKILL")
	case <-ctx.Done():
		return ctx.Err()
	}
}
