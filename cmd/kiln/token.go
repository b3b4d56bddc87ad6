package main

import (
	"fmt"
	"net/url"
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
			fmt.Fprintf(cmd.OutOrStdout(), "token for %s (shown once; kiln keeps only its hash):\n%s\n", tok.User, tok.Secret)
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
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tUSER\tNAME\tCREATED\tEXPIRES")
			for _, t := range out.Tokens {
				exp := "never"
				if t.Expires != nil {
					exp = t.Expires.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.User, t.Name, t.Created.Local().Format(time.DateTime), exp)
			}
			return tw.Flush()
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	return cmd
}

func newTokenRmCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "rm ID",
		Short: "Revoke an API token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			if err := c.Do(cmd.Context(), "DELETE", "/v1/tokens/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return apiErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", args[0])
			return nil
		},
	}
	cf.add(cmd)
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
			fmt.Fprintf(cmd.OutOrStdout(), "On the node, run (valid until %s):\n  %s\n", jt.Expires.Local().Format(time.DateTime), jt.Command)
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
	cmd := &cobra.Command{
		Use:   "project NAME [--weight W] [--max-gpus N] [--gpu-hours H] [--member USER]...",
		Short: "Create or change a project: fair-share weight, quotas, members (admins); without flags, list projects",
		Long: `kiln token project sets a project's fair-share weight (its share of the GPUs
relative to the other projects while they compete), its quotas (GPU equivalents
held at once, GPU-hours per period) and adds members. Without a name it lists the
projects you may see with what they hold and used.`,
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
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PROJECT\tWEIGHT\tMAX GPUS\tGPU-HOURS\tHELD\tUSED H\tQUEUED\tMEMBERS")
				for _, p := range list.Projects {
					fmt.Fprintf(tw, "%s\t%g\t%g\t%g\t%g\t%.1f\t%d\t%v\n", p.Name, p.Weight, p.MaxGPUs, p.GPUHours, p.HeldGPUs, p.UsedHours, p.QueuedLease, p.Members)
				}
				return tw.Flush()
			}
			p.Name = args[0]
			p.PeriodSeconds = int(period / time.Second)
			var got api.Project
			if err := c.Do(cmd.Context(), "PUT", "/v1/projects/"+url.PathEscape(p.Name), p, &got); err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(out, cf.format, got)
			}
			fmt.Fprintf(out, "project %s: weight %g, max %g GPUs at once, %g GPU-hours per %s (0: no limit), members %v\n", got.Name, got.Weight, got.MaxGPUs, got.GPUHours, time.Duration(got.PeriodSeconds)*time.Second, got.Members)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().Float64Var(&p.Weight, "weight", 1, "fair-share weight")
	cmd.Flags().Float64Var(&p.MaxGPUs, "max-gpus", 0, "GPU equivalents the project may hold at once (0: no limit)")
	cmd.Flags().Float64Var(&p.GPUHours, "gpu-hours", 0, "GPU-hours per period (0: no limit)")
	cmd.Flags().DurationVar(&period, "period", 30*24*time.Hour, "quota period")
	cmd.Flags().StringSliceVar(&p.Members, "member", nil, "add this user (repeatable; users come from 'kiln token create')")
	cf.addOutput(cmd)
	return cmd
}
