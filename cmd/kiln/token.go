package main

import (
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/server/api"
)

func init() { addCommand(newTokenCmd) }

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Manage API tokens, users, projects and join tokens",
		Long: `kiln token manages who may use the server. Tokens are shown once, when made;
the server keeps only their hash.

  kiln token create --user ana --project vision    a token for ana (made a member of vision)
  kiln token ls                                    tokens (an admin sees all)
  kiln token rm ID                                 revoke a token
  kiln token join                                  a join command for a new node (admins)
  kiln token project vision --weight 2 --max-gpus 8 --member ana   create or change a project (admins)`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newTokenCreateCmd(), newTokenLsCmd(), newTokenRmCmd(), newTokenJoinCmd(), newTokenProjectCmd())
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
			var tok api.Token
			if err := c.Do(cmd.Context(), "POST", "/v1/tokens", req, &tok); err != nil {
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
				Tokens []api.Token `json:"tokens"`
			}
			if err := c.Do(cmd.Context(), "GET", "/v1/tokens", nil, &out); err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, out)
			}
			return writeTokenTable(cmd.OutOrStdout(), out.Tokens)
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
				if err := c.Do(cmd.Context(), "DELETE", "/v1/users/"+url.PathEscape(args[0]), nil, nil); err != nil {
					return apiErr(err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "user %s removed with its tokens\n", printable(args[0]))
				return nil
			}
			if err := c.Do(cmd.Context(), "DELETE", "/v1/tokens/"+url.PathEscape(args[0]), nil, nil); err != nil {
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
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Make a join token and print the command a new node runs (admins)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			var jt api.JoinToken
			if err := c.Do(cmd.Context(), "POST", "/v1/join-tokens", api.JoinTokenRequest{TTLSeconds: int(ttl / time.Second)}, &jt); err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, jt)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "On the node, run (valid until %s):\n  %s\n", jt.Expires.Local().Format(time.DateTime), printable(jt.Command))
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the join token is valid")
	cf.addOutput(cmd)
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
				if err := c.Do(cmd.Context(), "GET", "/v1/projects", nil, &list); err != nil {
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
			var got api.Project
			if err := c.Do(cmd.Context(), "PUT", "/v1/projects/"+url.PathEscape(p.Name), p, &got); err != nil {
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
