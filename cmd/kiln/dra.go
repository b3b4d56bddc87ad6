//go:build !agentonly

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/cobra"
)

func init() {
	addCommand(newDRACmd)
	addCommand(newKubeCmd)
}

// draBinary is the program that holds kiln's Kubernetes code. It is a
// binary of its own so that the Kubernetes client libraries add nothing to
// the start-up of kiln's other commands.
const draBinary = "kiln-dra"

func newDRACmd() *cobra.Command {
	return &cobra.Command{
		Use:   "dra [slices|classes|plugin|label|...] [flags]",
		Short: "Kubernetes: kiln's DRA driver gpu.kiln.dev (runs kiln-dra)",
		Long: `kiln dra runs kiln-dra, the program with kiln's Kubernetes code, found beside
the kiln executable or on PATH, with the same arguments:

  kiln dra slices [--from CAPTURE...] [-o json|yaml]   the ResourceSlices kiln would publish
  kiln dra classes                                     the DeviceClasses of gpu.kiln.dev
  kiln dra plugin                                      the kubelet plugin (a DaemonSet)
  kiln dra label                                       node labels for clusters without DRA

Build it with: go build -o $(dirname $(which kiln))/kiln-dra ./cmd/kiln-dra`,
		DisableFlagParsing: true,
		RunE:               func(cmd *cobra.Command, args []string) error { return runDRA(cmd, args) },
	}
}

func newKubeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kube",
		Short: "Kubernetes: node labels, the admission webhook (runs kiln-dra)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "label [--from CAPTURE...] [--apply --kubeconfig FILE]",
		Short: "Node labels of this node's GPUs for clusters without DRA",
		Long: `kiln kube label prints the node labels of this node's GPUs (or of a recorded
one) for clusters without Dynamic Resource Allocation: GPU Feature Discovery's
and AMD's node labeller's keys when those tools are absent, and kiln's own
(largest NVLink island, gfx target, ROCm version, doctor status). --apply sets
them on the node. It is 'kiln dra label': both run kiln-dra.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDRA(cmd, append([]string{"label"}, args...))
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "webhook --cert FILE --key FILE [--listen :8443]",
		Short: "The admission webhook: refuse Pods whose images run on no GPU of the cluster",
		Long: `kiln kube webhook serves kiln's admission webhook: a Pod with GPU claims
whose images run on no gpu.kiln.dev device of the cluster is refused with kiln
compat's reason and fix, and claims made for a Pod are kept to the devices
that run its images. It is 'kiln-dra webhook' (see its --help).`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDRA(cmd, append([]string{"webhook"}, args...))
		},
	})
	return cmd
}

// runDRA runs kiln-dra with args, its exit code kiln's.
func runDRA(cmd *cobra.Command, args []string) error {
	path, err := findDRA()
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	c := exec.CommandContext(cmd.Context(), path, args...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
	if err := c.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return &exitError{code: ee.ExitCode()}
		}
		return &exitError{code: 3, err: fmt.Errorf("running %s: %w", path, err)}
	}
	return nil
}

// findDRA looks for kiln-dra beside the running kiln, then on PATH.
func findDRA() (string, error) {
	if self, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(self); err == nil {
			self = real
		}
		p := filepath.Join(filepath.Dir(self), draBinary)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath(draBinary); err == nil {
		return p, nil
	}
	return "", errors.New("kiln-dra is not installed: kiln's Kubernetes commands live in a second binary; build it beside kiln with: go build -o $(dirname $(which kiln))/kiln-dra ./cmd/kiln-dra")
}
