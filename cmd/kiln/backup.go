//go:build !agentonly

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/server"
)

func init() {
	addCommand(newBackupCmd)
	addCommand(newRestoreCmd)
}

func newBackupCmd() *cobra.Command {
	var data string
	cmd := &cobra.Command{
		Use:   "backup FILE",
		Short: "Back up the server's data directory (on the server's host; the server may run)",
		Long: `kiln backup writes FILE (a gzipped tar, mode 0600) with a consistent copy of the
store, taken while the server runs (SQLite's VACUUM INTO, one read transaction),
the CA certificate and key, and the admin's client configuration. The copy is
checked before kiln backup returns. Job logs are not in it.

Keep backups as private as the data directory: the CA key in them signs agent
certificates.`,
		Example: `  kiln backup /var/backups/kiln-$(date +%F).tar.gz --data /var/lib/kiln`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				data = defaultDataDir()
			}
			if err := server.Backup(cmd.Context(), data, args[0]); err != nil {
				return &exitError{code: 3, err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "backed up %s to %s\n", data, args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "the server's data directory (default $KILN_DATA or ~/.local/share/kiln)")
	return cmd
}

func newRestoreCmd() *cobra.Command {
	var data string
	cmd := &cobra.Command{
		Use:   "restore FILE",
		Short: "Put a backup back in the data directory (on the server's host, with the server stopped)",
		Long: `kiln restore checks the backup FILE made by 'kiln backup' (the store's integrity,
the CA key against its certificate), then puts the store, the CA and the admin
configuration in place in the data directory. What it replaces is moved into
<data>/replaced-<time>/, not deleted. It refuses while a server runs on the
directory, and refuses a backup whose CA is not the one in the directory (agents
pinned that one).

What happened after the backup is lost: leases, jobs, tokens and nodes that
joined since (they join again with a new join token).`,
		Example: `  kiln restore /var/backups/kiln-2025-06-01.tar.gz --data /var/lib/kiln`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				data = defaultDataDir()
			}
			moved, err := server.Restore(cmd.Context(), data, args[0])
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s into %s\n", args[0], data)
			if moved != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "what it replaced is in %s\n", moved)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "the server's data directory (default $KILN_DATA or ~/.local/share/kiln)")
	return cmd
}
