// Command kiln-dra is kiln's Kubernetes side: the DRA driver gpu.kiln.dev
// (a kubelet plugin that publishes a node's GPUs as ResourceSlices and
// prepares them for containers through CDI), a preview of the slices for a
// live or recorded machine, the DeviceClasses, and node labels for clusters
// without DRA. It is a binary of its own, built from kiln's module, so that
// the Kubernetes libraries weigh nothing on kiln's other commands; `kiln dra`
// runs it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/textsafe"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

var commands []func() *cobra.Command

func addCommand(c func() *cobra.Command) { commands = append(commands, c) }

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	var verbose bool
	root := &cobra.Command{
		Use:   "kiln-dra",
		Short: "kiln on Kubernetes: the DRA driver gpu.kiln.dev",
		Long: `kiln-dra publishes the GPUs kiln finds as Kubernetes Dynamic Resource
Allocation devices of the driver gpu.kiln.dev, with their topology, versions
and health as attributes, and prepares them for containers.

  kiln-dra slices [--from CAPTURE...]   the ResourceSlices kiln would publish
  kiln-dra classes                      the DeviceClasses to install
  kiln-dra plugin                       the kubelet plugin (run as a DaemonSet)
  kiln-dra label                        node labels for clusters without DRA`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))
		},
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log more, to standard error")
	root.SetOut(stdout)
	root.SetErr(stderr)
	for _, c := range commands {
		root.AddCommand(c())
	}
	return root
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) && ee.err == nil {
		return ee.code
	}
	fmt.Fprintln(stderr, "kiln-dra:", textsafe.Lines(err.Error()))
	if errors.As(err, &ee) {
		return ee.code
	}
	return 3
}
