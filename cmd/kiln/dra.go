package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/cobra"
)

func init() { addCommand(newDRACmd) }

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
		RunE: func(cmd *cobra.Command, args []string) error {
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
		},
	}
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
