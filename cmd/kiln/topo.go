//go:build !agentonly

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/topo"
)

func init() { addCommand(newTopoCmd) }

func newTopoCmd() *cobra.Command {
	var src sourceFlags
	var output, format string
	cmd := &cobra.Command{
		Use:   "topo [--from FILE...]",
		Short: "Show how GPUs, NICs and NVMe drives connect, with rated bandwidth per pair",
		Long: `kiln topo prints the GPU x GPU matrix in the vocabulary of nvidia-smi topo -m
(NV# = # bonded NVLinks, XGMI, PIX = one PCIe switch, PXB = several switches,
PHB = through a host bridge, NODE = across host bridges in one NUMA node,
SYS = across the CPU interconnect), each GPU's nearest NICs and drives and its
NUMA node, and for every pair the rated bandwidth, computed from link generation
and lane or link count in kiln's knowledge base.

Bandwidth is always labelled: GB/s (uni) is one direction, GB/s (bidi) both
directions added (the figure vendors usually quote).`,
		Example: `  kiln topo
  kiln topo -o json
  kiln topo --format svg > topo.svg
  kiln topo --from nvidia-smi-topo-m.txt`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat("-o", output, "text", "json", "yaml"); err != nil {
				return err
			}
			if err := checkFormat("--format", format, "text", "dot", "svg"); err != nil {
				return err
			}
			if len(args) > 0 && len(src.from) == 0 {
				return &exitError{code: 3, err: fmt.Errorf("unexpected arguments %q: captures are given with --from", args)}
			}
			s, err := src.load(cmd.Context(), args)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			m, err := topo.Build(s, kb.Default())
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			out := cmd.OutOrStdout()
			if output != "text" {
				return writeStructured(out, output, m)
			}
			switch format {
			case "dot":
				return topo.WriteDOT(out, m)
			case "svg":
				return topo.WriteSVG(out, m)
			}
			return topo.WriteText(out, m)
		},
	}
	src.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	cmd.Flags().StringVar(&format, "format", "text", "text output drawn as: text (tables), dot (graphviz) or svg (picture)")
	return cmd
}
