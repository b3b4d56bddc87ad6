//go:build !agentonly

package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
)

func init() { addCommand(newTokenCmd) }

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Manage API tokens, users, projects and join tokens",
		Long: `kiln token manages who may use the server. Tokens are shown once, when made;
the server keeps only their hash.

  kiln token create --user ana --project vision    a token for ana (made a member of vision)
  kiln token ls                                    tokens (an admin sees all, and the join tokens)
  kiln token rm ID                                 revoke a token (rm --user NAME removes a user)
  kiln token join [--uses N] [--ttl 1h]            a join command for new nodes (admins)
  kiln token revoke ID                             revoke an API token or a join token
  kiln token project vision --weight 2 --max-gpus 8 --member ana   create or change a project (admins)`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newTokenCreateCmd(), newTokenLsCmd(), newTokenRmCmd(), newTokenJoinCmd(), newTokenRevokeCmd(), newTokenProjectCmd())
	return cmd
}

func newTokenCreateCmd() *cobra.Command {
	var cf clientFlags
	var req api.TokenRequest
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "create [--user NAME] [--role admin|member] [--project P]...",
		Short: "Make an API token (admins: for any user, created when new)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			req.TTLSeconds = int(ttl / time.Second)
			tok, err := c.CreateToken(cmd.Context(), req)
			if err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, tok)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token for %s (shown once; kiln keeps only its hash):\n%s\n", printable(tok.User), printable(tok.Secret))
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&req.User, "user", "", "user name (default: yourself)")
	cmd.Flags().StringVar(&req.Role, "role", "", "admin or member (new users: member)")
	cmd.Flags().StringSliceVar(&req.Projects, "project", nil, "add the user to this project (repeatable)")
	cmd.Flags().StringVar(&req.Name, "name", "", "what the token is for")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "the token expires after this long (default: never)")
	cf.addOutput(cmd)
	return cmd
}

func newTokenLsCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List API tokens (not their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			var out struct {
				Tokens     []api.Token     `json:"tokens"`
				JoinTokens []api.JoinToken `json:"join_tokens,omitempty"`
			}
			if out.Tokens, err = c.Tokens(cmd.Context()); err != nil {
				return apiErr(err)
			}
			// Admins see the join tokens too; members are refused them.
			if out.JoinTokens, err = c.JoinTokens(cmd.Context()); err != nil && api.StatusOf(err) != 403 {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, out)
			}
			if err := writeTokenTable(cmd.OutOrStdout(), out.Tokens); err != nil {
				return err
			}
			if len(out.JoinTokens) > 0 {
				fmt.Fprintln(cmd.OutOrStdout())
				return writeJoinTokenTable(cmd.OutOrStdout(), out.JoinTokens)
			}
			return nil
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	return cmd
}

func newTokenRmCmd() *cobra.Command {
	var cf clientFlags
	var user bool
	cmd := &cobra.Command{
		Use:   "rm ID | --user NAME",
		Short: "Revoke an API token, or remove a user with all its tokens (admins)",
		Long: `kiln token rm ID revokes one API token. With --user, the argument is a user
name: the user is removed with its tokens and project memberships (admins only).
The last admin can be neither removed nor left without a token: make another
admin first.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			if user {
				if err := c.DeleteUser(cmd.Context(), args[0]); err != nil {
					return apiErr(err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "user %s removed with its tokens\n", printable(args[0]))
				return nil
			}
			if err := c.DeleteToken(cmd.Context(), args[0]); err != nil {
				return apiErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", printable(args[0]))
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().BoolVar(&user, "user", false, "the argument is a user name: remove the user and its tokens")
	return cmd
}

func newTokenJoinCmd() *cobra.Command {
	var cf clientFlags
	var ttl time.Duration
	var uses int
	cmd := &cobra.Command{
		Use:   "join [--uses N] [--ttl D]",
		Short: "Make a join token and print the command new nodes run (admins)",
		Long: `kiln token join makes a join token and prints the 'kiln join' command to run on a
new node. A join token joins one node and is valid for an hour unless --uses and
--ttl say otherwise; 'kiln token ls' lists the join tokens with their uses and
'kiln token revoke ID' ends one.

A node's name is bound to the key that first joined it: joining under the name
of an existing node is refused, also when that node went silent (its GPUs stay
held while its jobs may still run). An admin lets a new machine take the name
with 'kiln node replace NAME', or removes the node with 'kiln node forget NAME'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			jt, err := c.CreateJoinToken(cmd.Context(), api.JoinTokenRequest{TTLSeconds: int(ttl / time.Second), Uses: uses})
			if err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, jt)
			}
			nodes := "one node"
			if jt.Uses > 1 {
				nodes = fmt.Sprintf("%d nodes", jt.Uses)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "On the node, run (joins %s, valid until %s):\n  %s\n", nodes, jt.Expires.Local().Format(time.DateTime), printable(jt.Command))
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the join token is valid (at most a year)")
	cmd.Flags().IntVar(&uses, "uses", 1, "how many nodes may join with it")
	cf.addOutput(cmd)
	return cmd
}

func newTokenRevokeCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a join token (admins) or an API token, by the id 'kiln token ls' shows",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			err = c.RevokeJoinToken(cmd.Context(), args[0])
			if err == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "join token %s revoked\n", printable(args[0]))
				return nil
			}
			if s := api.StatusOf(err); s != 404 && s != 403 {
				return apiErr(err)
			}
			if err := c.DeleteToken(cmd.Context(), args[0]); err != nil {
				return apiErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", printable(args[0]))
			return nil
		},
	}
	cf.add(cmd)
	return cmd
}

func newTokenProjectCmd() *cobra.Command {
	var cf clientFlags
	var p api.Project
	var period time.Duration
	var envBytes, logPerJob, logBytes string
	cmd := &cobra.Command{
		Use:   "project NAME [--weight W] [--max-gpus N] [--gpu-hours H] [--member USER]...",
		Short: "Create or change a project: fair-share weight, quotas, members (admins); without flags, list projects",
		Long: `kiln token project sets a project's fair-share weight (its share of the GPUs
relative to the other projects while they compete), its quotas (GPU equivalents
held at once, GPU-hours per period), its limits and adds members. Without a name
it lists the projects you may see with what they hold and used.

The limits keep one member from filling the queue or the server's disk: queued
leases in the project and per member (a lease over them is refused with 429),
jobs per lease, the size of a job's environment, and the job output kept per job
and for the whole project (refused with 403; output beyond is dropped and the log
says so). 0 takes the server's default (1000 and 100 queued, 1000 jobs, 256K of
environment, 1G of log per job, 50G per project). The command sets the whole
project: flags left out take their defaults.`,
		Example: `  kiln token project vision --weight 3 --max-gpus 16 --gpu-hours 5000 --member ana --member bo
  kiln token project`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(args) == 0 {
				var list struct {
					Projects []api.Project `json:"projects"`
				}
				if list.Projects, err = c.Projects(cmd.Context()); err != nil {
					return apiErr(err)
				}
				if cf.structured() {
					return writeStructured(out, cf.format, list)
				}
				return writeProjectTable(out, list.Projects)
			}
			p.Name = args[0]
			p.PeriodSeconds = int(period / time.Second)
			for _, sz := range []struct {
				flag, v string
				to      *int64
			}{{"--max-log-bytes-per-job", logPerJob, &p.Limits.MaxLogBytesPerJob}, {"--max-log-bytes", logBytes, &p.Limits.MaxLogBytes}} {
				if sz.v != "" {
					n, err := parseSize(sz.v)
					if err != nil || n > 1<<50 {
						return &exitError{code: 3, err: fmt.Errorf("%s %s: want a size such as 10G", sz.flag, sz.v)}
					}
					*sz.to = int64(n)
				}
			}
			if envBytes != "" {
				n, err := parseSize(envBytes)
				if err != nil || n > 1<<30 {
					return &exitError{code: 3, err: fmt.Errorf("--max-env-bytes %s: want a size such as 256K", envBytes)}
				}
				p.Limits.MaxEnvBytes = int(n)
			}
			for name, v := range map[string]float64{"--weight": p.Weight, "--max-gpus": p.MaxGPUs, "--gpu-hours": p.GPUHours} {
				if err := finiteFlag(name, v); err != nil {
					return err
				}
			}
			got, err := c.PutProject(cmd.Context(), p)
			if err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(out, cf.format, got)
			}
			fmt.Fprintf(out, "project %s: weight %g, max %g GPUs at once, %g GPU-hours per %s (0: no limit), members [%s]\n", printable(got.Name), got.Weight, got.MaxGPUs, got.GPUHours, time.Duration(got.PeriodSeconds)*time.Second, printable(strings.Join(got.Members, " ")))
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().Float64Var(&p.Weight, "weight", 1, "fair-share weight")
	cmd.Flags().Float64Var(&p.MaxGPUs, "max-gpus", 0, "GPU equivalents the project may hold at once (0: no limit)")
	cmd.Flags().Float64Var(&p.GPUHours, "gpu-hours", 0, "GPU-hours per period (0: no limit)")
	cmd.Flags().DurationVar(&period, "period", 30*24*time.Hour, "quota period")
	cmd.Flags().StringSliceVar(&p.Members, "member", nil, "add this user (repeatable; users come from 'kiln token create')")
	cmd.Flags().IntVar(&p.Limits.MaxQueued, "max-queued", 0, "queued leases in the project (0: the server's default)")
	cmd.Flags().IntVar(&p.Limits.MaxQueuedPerUser, "max-queued-per-user", 0, "queued leases of one member (0: the server's default)")
	cmd.Flags().IntVar(&p.Limits.MaxJobsPerLease, "max-jobs-per-lease", 0, "jobs a lease may run (0: the server's default)")
	cmd.Flags().StringVar(&envBytes, "max-env-bytes", "", "size of a job's environment, 256K (default: the server's)")
	cmd.Flags().StringVar(&logPerJob, "max-log-bytes-per-job", "", "output kept of one job, 1G (default: the server's)")
	cmd.Flags().StringVar(&logBytes, "max-log-bytes", "", "output kept of all the project's jobs, 50G (default: the server's)")
	cf.addOutput(cmd)
	return cmd
}

func writeTokenTable(w io.Writer, toks []api.Token) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tUSER\tNAME\tCREATED\tEXPIRES")
	for _, t := range toks {
		exp := "never"
		if t.Expires != nil {
			exp = t.Expires.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cell(t.ID), cell(t.User), cell(t.Name), t.Created.Local().Format(time.DateTime), exp)
	}
	return tw.Flush()
}

func writeProjectTable(w io.Writer, ps []api.Project) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECT\tWEIGHT\tMAX GPUS\tGPU-HOURS\tHELD\tUSED H\tQUEUED\tMEMBERS")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%g\t%g\t%g\t%g\t%.1f\t%d\t[%s]\n", cell(p.Name), p.Weight, p.MaxGPUs, p.GPUHours, p.HeldGPUs, p.UsedHours, p.QueuedLease, cells(p.Members, " "))
	}
	return tw.Flush()
}

func writeJoinTokenTable(w io.Writer, toks []api.JoinToken) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOIN TOKEN\tUSED\tCREATED\tEXPIRES\tSTATE")
	now := time.Now()
	for _, t := range toks {
		state := "valid"
		switch {
		case t.Revoked != nil:
			state = "revoked " + t.Revoked.Local().Format(time.DateTime)
		case !now.Before(t.Expires):
			state = "expired"
		case t.Used >= t.Uses:
			state = "used up"
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\n", cell(t.ID), t.Used, t.Uses, t.Created.Local().Format(time.DateTime), t.Expires.Local().Format(time.DateTime), state)
	}
	return tw.Flush()
}
