package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/agent"
)

func init() { addCommand(newJoinCmd) }

func newJoinCmd() *cobra.Command {
	var f agentFlags
	var token, caSHA, node string
	var joinOnly bool
	cmd := &cobra.Command{
		Use:   "join URL --token TOKEN --ca-sha256 FINGERPRINT",
		Short: "Join this node to a kiln server, then run its agent",
		Long: `kiln join makes this node an agent of the server at URL. The server printed the
whole command when it started (and 'kiln token join' prints a new one).

The join token proves the node may join; the CA fingerprint pins the server's
own certificate authority, so the connection is trusted without any PKI: a
server whose CA differs is refused. The node gets a client certificate for its
name and keeps it, with its key and the CA, in the state directory. Then the
agent starts (unless --join-only); later starts need only 'kiln agent'.`,
		Example: `  kiln join https://gpu-head:7443 --token kjoin_... --ca-sha256 3f1a...
  kiln join https://gpu-head:7443 --token kjoin_... --ca-sha256 3f1a... --node rack2-hgx --join-only`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if node == "" {
				node = hostNodeName()
			}
			id, err := agent.Join(cmd.Context(), args[0], token, caSHA, node, f.stateDir())
			if err != nil {
				return apiErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "joined %s as node %s (state in %s)\n", printable(id.Server), printable(id.Node), f.stateDir())
			if joinOnly {
				return nil
			}
			return f.run(cmd.Context(), id)
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&token, "token", "", "join token (kjoin_...)")
	cmd.Flags().StringVar(&caSHA, "ca-sha256", "", "SHA-256 fingerprint of the server's CA, from the join command")
	cmd.Flags().StringVar(&node, "node", "", "node name (default: the host name)")
	cmd.Flags().BoolVar(&joinOnly, "join-only", false, "join and exit; start the agent later with 'kiln agent'")
	_ = cmd.MarkFlagRequired("token")
	_ = cmd.MarkFlagRequired("ca-sha256")
	return cmd
}
