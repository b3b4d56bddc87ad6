//go:build !agentonly

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
)

func init() { addCommand(newCancelCmd) }

func newCancelCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "cancel LEASE...",
		Short: "Cancel queued leases and release granted ones (their jobs are stopped)",
		Long: `kiln cancel removes a queued lease from the queue, or releases a granted one:
its jobs get SIGTERM and, after the server's grace period, SIGKILL. Members may
cancel their projects' leases only.`,
		Example: `  kiln cancel l-1a2b3c
  kiln cancel l-1a2b3c l-4d5e6f -o json`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			var out []api.Lease
			var firstErr error
			for _, id := range args {
				l, err := c.CancelLease(cmd.Context(), id)
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "kiln: cancel %s: %s\n", printable(id), printable(err.Error()))
					if firstErr == nil {
						firstErr = apiErr(err)
					}
					continue
				}
				out = append(out, *l)
				if !cf.structured() {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", printable(l.ID), printable(l.State))
				}
			}
			if cf.structured() {
				if err := writeStructured(cmd.OutOrStdout(), cf.format, api.LeaseList{Leases: out}); err != nil {
					return err
				}
			}
			return firstErr
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	return cmd
}
