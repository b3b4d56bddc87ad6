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

func init() { addCommand(newLsCmd) }

func newLsCmd() *cobra.Command {
	var cf clientFlags
	var project, state string
	var all bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List leases: queued (with position and estimated start), granted, stopping",
		Long: `kiln ls lists the leases you may see: your projects' (all of them for an admin).
By default only live leases (queued, granted, stopping); --all adds the ended ones
(done, cancelled, refused, preempted, expired, lost) with the reason each ended.`,
		Example: `  kiln ls
  kiln ls --all --project vision
  kiln ls -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			leases, err := c.ListLeases(cmd.Context(), api.LeaseFilter{All: all, Project: project, State: state})
			if err != nil {
				return apiErr(err)
			}
			list := api.LeaseList{Leases: leases}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, list)
			}
			writeLeaseTable(cmd.OutOrStdout(), list.Leases)
			return nil
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include ended leases")
	cmd.Flags().StringVarP(&project, "project", "p", "", "only this project")
	cmd.Flags().StringVar(&state, "state", "", "only this state")
	return cmd
}

func writeLeaseTable(w io.Writer, ls []api.Lease) {
	if len(ls) == 0 {
		fmt.Fprintln(w, "no leases")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LEASE\tPROJECT\tUSER\tSIZE\tPRIO\tSTATE\tWHERE / WHY")
	for _, l := range ls {
		where := ""
		switch l.State {
		case api.LeaseQueued:
			where = fmt.Sprintf("position %d", l.QueuePosition)
			if l.EstimatedStart != nil {
				where += ", starts ~" + l.EstimatedStart.Local().Format("15:04:05")
			}
			if l.Reason != "" {
				where += " (" + l.Reason + ")"
			}
		case api.LeaseGranted, api.LeaseStopping:
			var parts []string
			for _, a := range l.Allocations {
				ids := make([]string, len(a.Devices))
				for i, d := range a.Devices {
					ids[i] = d.ID
				}
				parts = append(parts, a.Node+":"+strings.Join(ids, ","))
			}
			where = strings.Join(parts, " ")
			if l.Isolation != "" && l.Isolation != api.IsolationExclusive {
				where += " [" + l.Isolation + "]"
			}
			if l.EndsAt != nil {
				where += " ends " + l.EndsAt.Local().Format(time.DateTime)
			}
			if l.State == api.LeaseStopping {
				where += " -- " + l.Reason
			}
		default:
			where = l.Reason
		}
		prio := fmt.Sprint(l.Request.Priority)
		if l.Request.Preemptible {
			prio += " (preemptible)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(l.ID), cell(l.Project), cell(l.User), cell(l.Request.ShortSize()), prio, cell(l.State), cell(where))
	}
	tw.Flush()
}
