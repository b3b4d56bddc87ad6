//go:build cgo && !kiln_containerd

package main

import (
	"context"
	"log/slog"

	"kiln.dev/kiln/executor"
)

// noContainerd says why this build runs no container job. A build with cgo
// has the NVML binding, which leaves NVML's symbols for the driver's
// library to fill in when kiln loads it; containerd's client links Go's
// plugin loader, which makes the linker bind every symbol at start, so
// such a kiln would not start on a machine without NVIDIA's driver.
const noContainerd = "this kiln is built with cgo (for NVML) and without the containerd client: " +
	"build it with CGO_ENABLED=0, or with -tags kiln_containerd -ldflags=-extldflags=-Wl,-z,lazy, to run jobs that name an image"

func (f *containerFlags) containerExecutor(context.Context, string, string, *slog.Logger) (executor.Executor, string) {
	return nil, noContainerd
}
