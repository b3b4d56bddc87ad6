//go:build !agentonly

package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func init() { addCommand(newUICmd) }

func newUICmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Print a one-time link that opens kiln's web page signed in as you",
		Long: `kiln ui asks the server for a sign-in link to its web page (/ui/): the fleet with
GPUs free and held and an allocation map coloured by project and filled by real
use, each node's topology picture and findings with their fix, the queue with
why each lease waits, and the projects. The page updates itself as the server's
state changes.

The link holds a one-time code, good for two minutes. Opening it trades the code
for a session cookie (HttpOnly, Secure, SameSite=Strict, twelve hours) with the
rights of the token kiln ui used, so neither the browser's history nor a page
script ever holds the token; revoking the token ends the session. Every asset is
served by the server itself under a strict content security policy: the page
works on an air-gapped network, without Prometheus.`,
		Example: `  kiln ui
  KILN_CONFIG=/var/lib/kiln/admin-client.json kiln ui`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			link, err := c.UILink(cmd.Context())
			if err != nil {
				return apiErr(err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "Open this link once, before %s (it signs your browser in as you):\n", link.Expires.Local().Format("15:04:05"))
			fmt.Fprintln(cmd.OutOrStdout(), printable(link.URL)) // the server's answer is data too
			return nil
		},
	}
	cf.add(cmd)
	return cmd
}
