package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/containerd"
)

// containerExecutor connects to the node's containerd; the reason when it
// cannot.
func (f *containerFlags) containerExecutor(ctx context.Context, node, state string, log *slog.Logger) (executor.Executor, string) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	ex, err := containerd.New(cctx, containerd.Config{Address: f.address, PlainHTTP: f.plainHTTP, Node: node,
		LogDir: filepath.Join(state, "container-logs"), Snapshotter: f.snapshotter, IsolateNetwork: f.isolateNet, Logger: log})
	if err != nil {
		return nil, err.Error()
	}
	return ex, ""
}
