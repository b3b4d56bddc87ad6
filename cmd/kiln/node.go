//go:build !agentonly

package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"kiln.dev/kiln/api"
)

func init() { addCommand(newNodeCmd) }

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Replace or forget a node (admins)",
		Long: `A node's name is bound to the key that first joined it, so that nobody holding a
join token takes the name (and the GPUs) of a node that went silent while its
jobs may still run there. When a machine is reinstalled, or another machine takes
its place, an admin says so:

  kiln node replace NAME   the next agent that joins with a valid join token takes
                           the name with its new key; the old agent's certificate
                           is refused at once; the GPUs its lost leases hold stay
                           fenced until the new agent registers (it stops what runs)
  kiln node forget NAME    a node that is not ready (lost, or never registered) is
                           removed: what its lost leases hold is freed, its jobs
                           there are marked lost, and its name is free`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newNodeActionCmd("replace", "Let the next agent that joins take the node's name with a new key",
		func(ctx context.Context, c *api.Client, node string) error {
			_, err := c.ReplaceNode(ctx, node)
			return err
		}),
		newNodeActionCmd("forget", "Remove a node that is not ready; free what its lost leases hold",
			func(ctx context.Context, c *api.Client, node string) error { return c.ForgetNode(ctx, node) }))
	return cmd
}

func newNodeActionCmd(verb, short string, call func(ctx context.Context, c *api.Client, node string) error) *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			if err := call(cmd.Context(), c, args[0]); err != nil {
				return apiErr(err)
			}
			switch verb {
			case "replace":
				fmt.Fprintf(cmd.OutOrStdout(), "node %s: the next agent that joins with a valid join token takes its name ('kiln token join' makes one)\n", printable(args[0]))
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "node %s forgotten\n", printable(args[0]))
			}
			return nil
		},
	}
	cf.add(cmd)
	return cmd
}
