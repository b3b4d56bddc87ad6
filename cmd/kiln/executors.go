package main

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/process"
)

// containerFlags choose how an agent runs jobs that name an image.
type containerFlags struct {
	address     string
	none        bool
	plainHTTP   []string
	cdiDir      string
	snapshotter string
}

func (f *containerFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.address, "containerd", "/run/containerd/containerd.sock", "containerd's socket, for jobs that name an image")
	fl.BoolVar(&f.none, "no-containers", false, "run no job that names an image on this node (the server places them elsewhere)")
	fl.StringSliceVar(&f.plainHTTP, "plain-http", nil, "registries (host:port) reached over plain HTTP, a lab's local registry; * for all")
	fl.StringVar(&f.cdiDir, "cdi-dir", "", "where the agent writes the CDI spec of this node's GPUs (default /var/run/cdi)")
	fl.StringVar(&f.snapshotter, "snapshotter", "", "containerd snapshotter for job images (default containerd's, overlayfs; native where overlayfs cannot mount)")
}

// executors makes a node's executors: processes, with their records in
// state (a restarted agent stops what its previous run left), and the
// container executor where it can run; otherwise the reason it cannot.
func (f *containerFlags) executors(ctx context.Context, node, state string, log *slog.Logger) (proc executor.Executor, ctr executor.Executor, noCtr string) {
	proc = &process.Executor{StateDir: filepath.Join(state, "jobs")}
	if f.none {
		return proc, nil, "the agent was started with --no-containers"
	}
	ctr, noCtr = f.containerExecutor(ctx, node, state, log)
	return proc, ctr, noCtr
}
