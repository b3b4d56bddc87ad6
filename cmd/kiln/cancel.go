package main

import (
	"fmt"
	"net/url"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/server/api"
)

func init() { addCommand(newCancelCmd) }

func newCancelCmd() *cobra.Command {
	var cf clientFlags
	var format string
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
			if err := checkFormat("-o", format, "text", "json", "yaml"); err != nil {
				return err
			}
			c, _, err := cf.client()
			if err != nil {
				return err
			}
			var out []api.Lease
			var firstErr error
			for _, id := range args {
				var l api.Lease
				if err := c.Do(cmd.Context(), "DELETE", "/v1/leases/"+url.PathEscape(id), nil, &l); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "kiln: cancel %s: %v\n", id, err)
					if firstErr == nil {
						firstErr = apiErr(err)
					}
					continue
				}
				out = append(out, l)
				if format == "text" {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", l.ID, l.State)
				}
			}
			if format != "text" {
				if err := writeStructured(cmd.OutOrStdout(), format, api.LeaseList{Leases: out}); err != nil {
					return err
				}
			}
			return firstErr
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	return cmd
}
