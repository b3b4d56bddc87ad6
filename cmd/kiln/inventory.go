//go:build !agentonly

package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/units"
)

func init() { addCommand(newInventoryCmd) }

func newInventoryCmd() *cobra.Command {
	var src sourceFlags
	var format, record string
	cmd := &cobra.Command{
		Use:   "inventory [--from FILE...] [--record DIR]",
		Short: "List every GPU of the node with its PCIe path, firmware, driver stack and health counters",
		Long: `kiln inventory finds every GPU of every vendor on this machine, or in captures
of another, and prints the node's Snapshot: the host, the driver stack, each GPU
(model, PCI address, memory, firmware, PCIe link now and at most, NUMA node,
MIG or partition state, ECC and throttle state), links and kernel-log events.
Partitions of one GPU (MIG instances, AMD CPX partitions) are not counted as GPUs.

-o json writes the Snapshot itself (schema: snapshot/schema.json); every other
kiln command reads it back with --from.

--record DIR writes a replayable bundle of this machine: the sysfs and procfs
files kiln reads, NVML readings and kernel log lines. Attach it to a bug report,
or use it as a test fixture; 'kiln inventory --from DIR' replays it.`,
		Example: `  kiln inventory
  kiln inventory -o json > node.json
  kiln inventory --record ./gpu01-bundle
  kiln inventory --from nvidia-smi-q.xml --from lspci-vvv.txt`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat("-o", format, "text", "json", "yaml"); err != nil {
				return err
			}
			if len(args) > 0 && len(src.from) == 0 {
				return &exitError{code: 3, err: fmt.Errorf("unexpected arguments %q: captures are given with --from", args)}
			}
			out := cmd.OutOrStdout()
			if record != "" {
				if len(src.from) > 0 {
					return &exitError{code: 3, err: fmt.Errorf("--record records the live machine; it cannot be combined with --from")}
				}
				if err := discover.Record(cmd.Context(), src.options(), record); err != nil {
					return &exitError{code: 3, err: fmt.Errorf("recording to %s: %w", record, err)}
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "recorded this machine to %s; replay it with: kiln inventory --from %s\n", record, record)
				src.from = []string{record}
			}
			s, err := src.load(cmd.Context(), args)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			if format == "text" {
				writeInventoryText(out, s)
				return nil
			}
			return writeStructured(out, format, s)
		},
	}
	src.add(cmd)
	cmd.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json (the Snapshot) or yaml")
	cmd.Flags().StringVar(&record, "record", "", "record a replayable bundle of the live machine into `DIR`")
	return cmd
}

func writeInventoryText(w io.Writer, s *snapshot.Snapshot) {
	h := s.Host
	if h.Hostname != "" || h.OSPrettyName != "" || h.Kernel != "" {
		fmt.Fprintf(w, "host:    %s  %s  kernel %s  %s\n", or(h.Hostname, "?"), or(h.OSPrettyName, h.OS+" "+h.OSVersion), or(h.Kernel, "?"), h.Arch)
	}
	if h.CPUModel != "" {
		fmt.Fprintf(w, "cpu:     %s, %d CPUs, %d NUMA %s\n", h.CPUModel, h.CPUs, len(h.NUMANodes), pluralS(len(h.NUMANodes), "node", "nodes"))
	}
	d := s.Drivers
	var drv []string
	if d.NVIDIAKernel != "" || d.NVIDIAUser != "" {
		drv = append(drv, fmt.Sprintf("nvidia %s", or(d.NVIDIAUser, d.NVIDIAKernel)))
	}
	if d.CUDADriver != "" {
		drv = append(drv, "CUDA "+d.CUDADriver)
	}
	if d.AMDGPU != "" {
		drv = append(drv, "amdgpu "+d.AMDGPU)
	}
	if d.ROCm != "" {
		drv = append(drv, "ROCm "+d.ROCm)
	}
	if d.NouveauLoaded != nil && *d.NouveauLoaded {
		drv = append(drv, "nouveau loaded")
	}
	if d.FabricManager != nil && d.FabricManager.State != "" {
		drv = append(drv, "fabric "+d.FabricManager.State)
	}
	if len(drv) > 0 {
		fmt.Fprintf(w, "drivers: %s\n", strings.Join(drv, ", "))
	}
	fmt.Fprintf(w, "gpus:    %d\n\n", len(s.GPUs))
	if len(s.GPUs) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "#\tPCI\tMODEL\tMEMORY\tFIRMWARE\tPCIE NOW/MAX\tNUMA\tMODE")
		for _, g := range s.GPUs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, or(g.PCIAddress, or(g.MatrixName, "?")),
				or(g.Model, g.Vendor+" "+g.DeviceID), memText(g.MemoryTotalBytes), or(g.VBIOS, "-"), linkText(g.PCIe), numaText(g.NUMANode), modeText(&g))
		}
		tw.Flush()
	}
	if len(s.Links) > 0 {
		fmt.Fprintf(w, "\nlinks:   %d device pairs joined by NVLink/xGMI (see kiln topo)\n", len(s.Links))
	}
	if len(s.Events) > 0 {
		fmt.Fprintf(w, "events:  %d kernel/fabric log events (see kiln doctor)\n", len(s.Events))
	}
	for _, n := range s.Notes {
		fmt.Fprintf(w, "note:    %s: %s\n", n.Source, n.Message)
	}
}

func or(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return s
}

func memText(b uint64) string {
	if b == 0 {
		return "-"
	}
	return units.BytesRounded(b, 0)
}

func linkText(l *snapshot.PCIeLink) string {
	if l == nil || (l.CurrentGen == 0 && l.MaxGen == 0) {
		return "-"
	}
	return fmt.Sprintf("Gen%d x%d / Gen%d x%d", l.CurrentGen, l.CurrentWidth, l.MaxGen, l.MaxWidth)
}

func numaText(n *int) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}

func modeText(g *snapshot.GPU) string {
	var parts []string
	if g.MIG != nil && g.MIG.Enabled {
		parts = append(parts, fmt.Sprintf("MIG (%d instances)", len(g.MIG.Instances)))
	}
	if g.Partition != nil && (g.Partition.Compute != "" || g.Partition.Count > 1) {
		parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s %s %d partitions", g.Partition.Compute, g.Partition.Memory, g.Partition.Count)))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
