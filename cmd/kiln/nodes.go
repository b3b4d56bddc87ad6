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

func init() { addCommand(newNodesCmd) }

func newNodesCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "nodes [NODE]",
		Short: "List the nodes, their GPUs and who holds them",
		Long: `kiln nodes lists the nodes that joined the server: their state (ready, lost),
their GPUs free and in all, and the doctor's findings they reported. Given a
node, it lists its devices: model, memory, NVLink island, NUMA node, the
isolation a fraction gets there, use, the leases holding it, and drains.

Nodes that replay a recorded machine (kiln up --demo, kiln agent --from) are
marked RECORDED: their GPUs are not real.`,
		Example: `  kiln nodes
  kiln nodes hgx-h100-03
  kiln nodes -o yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(args) == 1 {
				n, err := c.Node(cmd.Context(), args[0])
				if err != nil {
					return apiErr(err)
				}
				if cf.structured() {
					return writeStructured(out, cf.format, n)
				}
				writeNodeDevices(out, *n)
				return nil
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return apiErr(err)
			}
			nl := api.NodeList{Nodes: nodes}
			if cf.structured() {
				return writeStructured(out, cf.format, nl)
			}
			writeNodeTable(out, nl.Nodes)
			return nil
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	return cmd
}

func writeNodeTable(w io.Writer, nodes []api.Node) {
	if len(nodes) == 0 {
		fmt.Fprintln(w, "no nodes: join one with the command 'kiln server' printed, or 'kiln token join'")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tGPUS FREE/ALL\tMODELS\tDRIVER\tLAST SEEN\tNOTES")
	for _, n := range nodes {
		models := map[string]int{}
		var order []string
		drained := 0
		for _, d := range n.Devices {
			if d.Parent != "" {
				continue
			}
			if models[d.Model] == 0 {
				order = append(order, d.Model)
			}
			models[d.Model]++
			if d.Drained {
				drained++
			}
		}
		var ms []string
		for _, m := range order {
			ms = append(ms, fmt.Sprintf("%dx %s", models[m], m))
		}
		var notes []string
		if n.Recorded {
			notes = append(notes, "RECORDED (not real GPUs)")
		}
		if drained > 0 {
			notes = append(notes, fmt.Sprintf("%d drained", drained))
		}
		crit := 0
		for _, f := range n.Findings {
			if f.Severity == "critical" {
				crit++
			}
		}
		if crit > 0 {
			notes = append(notes, fmt.Sprintf("%d critical findings", crit))
		}
		fmt.Fprintf(tw, "%s\t%s\t%g/%d\t%s\t%s\t%s ago\t%s\n", cell(n.ID), cell(n.State), n.Free, n.Total, cell(strings.Join(ms, ", ")),
			cell(n.Driver), time.Since(n.LastSeen).Round(time.Second), cell(strings.Join(notes, "; ")))
	}
	tw.Flush()
}

func writeNodeDevices(w io.Writer, n api.Node) {
	fmt.Fprintf(w, "node %s: %s, %g of %d GPUs free", printable(n.ID), printable(n.State), n.Free, n.Total)
	if n.Recorded {
		fmt.Fprint(w, " -- RECORDED machine: these GPUs are not real")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tMODEL\tMEMORY\tPCI\tNUMA\tISLAND\tSHARING\tUSED\tLEASES\tDRAINED")
	for _, d := range n.Devices {
		numa := "-"
		if d.NUMANode != nil {
			numa = fmt.Sprint(*d.NUMANode)
		}
		drain := ""
		if d.Drained {
			drain = d.DrainReason
		}
		if d.Held {
			drain = strings.TrimSpace(drain + " held by a lost lease")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d‰\t%s\t%s\n", cell(d.ID), cell(d.Model), sizeText(d.MemoryBytes), cell(d.PCIAddress), numa, cell(d.Island), cell(d.Isolation), d.UsedMilli, cells(d.Leases, ","), cell(drain))
	}
	tw.Flush()
	for _, f := range n.Findings {
		fmt.Fprintf(w, "%s [%s] %s\n", cell(strings.ToUpper(f.Severity)), cell(f.ID), cell(f.Title))
	}
}
