//go:build !agentonly

package main

import (
	"errors"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
)

func init() { addCommand(newLogsCmd) }

func newLogsCmd() *cobra.Command {
	var cf clientFlags
	var follow, raw bool
	cmd := &cobra.Command{
		Use:   "logs [-f] JOB|LEASE",
		Short: "Print a job's output (standard output and error, as the agent captured them)",
		Long: `kiln logs prints what a job wrote. Given a lease id, it prints the lease's first
job. With -f it follows the output until the job ends.

On a terminal, what could take it over (escape sequences other than colours,
control characters) is shown escaped; --raw writes the bytes as they are. Into
a file or a pipe the bytes always go as they are.`,
		Example: `  kiln logs j-1a2b3c
  kiln logs -f l-9x8y7z`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			id := args[0]
			if strings.HasPrefix(id, "l-") {
				l, err := c.GetLease(ctx, id, api.LeaseWait{})
				if err != nil {
					return apiErr(err)
				}
				if len(l.Jobs) == 0 {
					return &exitError{code: 2, err: errors.New("lease " + id + " has no job")}
				}
				id = l.Jobs[0]
			}
			logs, err := c.JobLogs(ctx, id, follow)
			if err != nil {
				return apiErr(err)
			}
			defer logs.Close()
			if err := copyOutput(cmd.OutOrStdout(), logs, raw); err != nil && ctx.Err() == nil {
				return &exitError{code: 3, err: err}
			}
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the job ends")
	cmd.Flags().BoolVar(&raw, "raw", false, "write the output's bytes as they are, also to a terminal")
	return cmd
}

// copyOutput copies a job's output to w: to a terminal through termSafe
// unless raw, elsewhere as it is.
func copyOutput(w io.Writer, r io.Reader, raw bool) error {
	if raw || !isTerminal(w) {
		_, err := io.Copy(w, r)
		return err
	}
	ts := &termSafe{w: w}
	_, err := io.Copy(ts, r)
	if ferr := ts.Flush(); err == nil {
		err = ferr
	}
	return err
}
