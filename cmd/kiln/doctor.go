//go:build !agentonly

package main

import (
	"fmt"

	"io"
	"kiln.dev/kiln/capture"
	"strings"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/source"
)

func init() { addCommand(newDoctorCmd) }

func newDoctorCmd() *cobra.Command {
	var src sourceFlags
	var format string
	var list bool
	cmd := &cobra.Command{
		Use:   "doctor [--from FILE...]",
		Short: "Explain what is wrong with a node, why it matters and how to fix it",
		Long: `kiln doctor examines one node -- this machine, or captures of another -- and
reports findings: each with a stable id, a severity, the devices concerned (PCI
addresses), the evidence read, the impact (with a number where facts allow) and
the remedy.

Checks look at PCIe links (downtrained, slow upstream hops, ACS, replays, AER),
firmware consistency, the driver stack, NVLink and the fabric manager, memory
errors, clocks and temperatures, MIG, kernel-log events (Xid decoded, GPUs fallen
off the bus, amdgpu and NVSwitch errors) and the topology (P2P paths, NIC
locality). 'kiln doctor --list' prints every check and the ids it reports.

A GPU that lowered its PCIe generation while idle is saving power, not failing:
kiln reports a low generation only while the GPU is busy, and tells you when it
cannot tell. Link width is judged always.

Captures are read inside whatever wraps them (CRLF, UTF-16, colours, prompts,
a collector's prefix on every line, a cut tail). A failed tool's output is a
capture too: "Unable to determine the device handle", "No devices were found"
or a table of ERR! is reported as gpu-unreachable. nvidia-bug-report.log(.gz),
sosreport tarballs and folders of captures are read whole. Inputs that share
no host name, GPU UUID or PCI address are of different machines: each is
audited apart and every finding names its machine. An input that holds no
GPU (a kernel log of a healthy boot) gets a report that says what was read.
With -o json a report is always printed; inputs that could not be read are
listed in its "errors" (exit 3).

Xid severities follow NVIDIA's recommended action for the code, and the
driver's own words when it asks for a reset; an Xid caused by another is
marked secondary.

Exit codes:
  0  healthy (or only informational findings)
  1  warnings
  2  at least one critical finding
  3  kiln could not run: unreadable input, or no GPU found to examine`,
		Example: `  kiln doctor
  kiln doctor -o json
  kiln doctor --from nvidia-smi-q.txt --from lspci-vvv.txt --from dmesg.log
  kiln doctor --from ./kfd-topology/ --from rocm-smi.json
  kiln doctor --from bundle/            # made by: kiln inventory --record bundle/
  kiln doctor --from nvidia-bug-report.log.gz
  kiln doctor --from sosreport-gpu01-2025-01-17.tar.xz
  kubectl logs ds/gpu-audit --prefix | kiln doctor --from -`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if list {
				return printChecks(out)
			}
			if err := checkFormat("-o", format, "text", "json", "yaml"); err != nil {
				return err
			}
			if len(args) > 0 && len(src.from) == 0 {
				return &exitError{code: 3, err: fmt.Errorf("unexpected arguments %q: captures are given with --from", args)}
			}
			var rep *doctor.Report
			var err error
			if len(src.from) == 0 {
				rep, err = doctorLive(cmd, &src)
			} else {
				rep, err = doctorFiles(cmd, append(append([]string(nil), src.from...), args...))
			}
			if err != nil {
				return err
			}
			if format == "text" {
				for _, e := range rep.Errors {
					fmt.Fprintln(cmd.ErrOrStderr(), "kiln: "+printable(e))
				}
				if len(rep.Errors) == 0 || len(rep.Sources) > 0 {
					writeDoctorText(out, rep, colorOK(out))
				}
			} else if err := writeStructured(out, format, rep); err != nil {
				return &exitError{code: doctor.ExitCannot, err: err}
			}
			if len(rep.Errors) > 0 {
				return &exitError{code: doctor.ExitCannot}
			}
			if c := rep.ExitCode(); c != 0 {
				return &exitError{code: c}
			}
			return nil
		},
	}
	src.add(cmd)
	cmd.Flags().StringVarP(&format, "output", "o", "text", "output format: text, json or yaml")
	cmd.Flags().BoolVar(&list, "list", false, "list the checks and the finding ids they report, then exit")
	return cmd
}

// doctorLive examines this machine; finding no GPU here is an error (exit
// 3), since there is nothing to examine.
func doctorLive(cmd *cobra.Command, src *sourceFlags) (*doctor.Report, error) {
	s, err := src.load(cmd.Context(), nil)
	if err != nil {
		return nil, &exitError{code: doctor.ExitCannot, err: err}
	}
	if nothingToExamine(s) {
		fmt.Fprintln(cmd.ErrOrStderr(), printableLines(noGPUMessage(s)))
		return nil, &exitError{code: doctor.ExitCannot}
	}
	rep, err := doctor.Run(cmd.Context(), s, kb.Default())
	if err != nil {
		return nil, &exitError{code: doctor.ExitCannot, err: err}
	}
	return rep, nil
}

// doctorFiles examines captures: every input that can be read gives a
// report (a kernel log without a GPU line says so), inputs of several
// machines are audited each on its own, and inputs that cannot be read are
// listed in the report's errors.
func doctorFiles(cmd *cobra.Command, paths []string) (*doctor.Report, error) {
	ctx := cmd.Context()
	parts := source.Parts(ctx, paths)
	var errs []string
	for _, p := range parts {
		if p.Err != nil {
			errs = append(errs, p.Err.Error())
		}
	}
	var reps []*doctor.Report
	var labels, why []string
	for _, m := range capture.Machines(parts) {
		kb.Default().Annotate(m.Snapshot)
		r, err := doctor.Run(ctx, m.Snapshot, kb.Default())
		if err != nil {
			return nil, &exitError{code: doctor.ExitCannot, err: err}
		}
		if nothingToExamine(m.Snapshot) {
			r.Notes = append(r.Notes, "no GPU, GPU event or device matrix in these inputs: nothing for the checks to examine")
		}
		reps = append(reps, r)
		labels, why = append(labels, m.Label), append(why, m.Why)
	}
	if len(reps) == 0 {
		return &doctor.Report{Findings: []doctor.Finding{}, Errors: errs}, nil
	}
	rep := doctor.Combine(reps, labels, why)
	rep.Errors = errs
	return rep, nil
}

// nothingToExamine is true when a snapshot has no GPU, no GPU-like PCI
// device and no event: there is nothing for the doctor to say.
func nothingToExamine(s *snapshot.Snapshot) bool {
	if len(s.GPUs) > 0 || len(s.Events) > 0 || s.Matrix != nil {
		return false
	}
	for _, d := range s.PCI {
		if d.Kind == snapshot.KindGPU || d.Kind == snapshot.KindNVSwitch {
			return false
		}
	}
	return true
}

func noGPUMessage(s *snapshot.Snapshot) string {
	var b strings.Builder
	b.WriteString("kiln found no GPU to examine.\nIt looked at:\n")
	if len(s.Sources) == 0 {
		b.WriteString("  (no source produced data)\n")
	}
	for _, src := range s.Sources {
		fmt.Fprintf(&b, "  - %s %s\n", src.Kind, src.Path)
	}
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "  note (%s): %s\n", n.Source, n.Message)
	}
	b.WriteString("GPUs are found on the PCI bus (vendor 10de NVIDIA, 1002 AMD, 8086 Intel; display or 3D controller class).\n")
	b.WriteString("If this machine has GPUs, check that /sys is mounted (in a container: mount the host's /sys) or pass captures with --from.")
	return b.String()
}

func printChecks(w io.Writer) error {
	for _, c := range doctor.Checks() {
		fmt.Fprintf(w, "%-14s %s\n", c.Name, c.Doc)
		fmt.Fprintf(w, "%-14s ids: %s\n", "", strings.Join(c.IDs, ", "))
	}
	return nil
}

const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiRed    = "\x1b[31m"
	ansiYellow = "\x1b[33m"
	ansiCyan   = "\x1b[36m"
	ansiDim    = "\x1b[2m"
)

func writeDoctorText(w io.Writer, rep *doctor.Report, color bool) {
	if len(rep.Machines) == 0 {
		writeMachineText(w, rep, color)
		return
	}
	fmt.Fprintf(w, "These inputs are of %d machines; each is audited on its own.\n", len(rep.Machines))
	for _, m := range rep.Machines {
		sub := &doctor.Report{Hostname: m.Label, GPUs: m.GPUs, Checks: rep.Checks, Sources: m.Sources}
		for _, f := range rep.Findings {
			if f.Machine == m.Label {
				sub.Findings = append(sub.Findings, f)
			}
		}
		for _, n := range rep.Notes {
			if rest, ok := strings.CutPrefix(n, m.Label+": "); ok {
				sub.Notes = append(sub.Notes, rest)
			}
		}
		fmt.Fprintln(w)
		writeMachineText(w, sub, color)
		if m.Why != "" {
			fmt.Fprintf(w, "note: audited apart: %s\n", printable(m.Why))
		}
	}
}

func writeMachineText(w io.Writer, rep *doctor.Report, color bool) {
	paint := func(code, s string) string {
		if !color {
			return s
		}
		return code + s + ansiReset
	}
	host := printable(rep.Hostname)
	if host == "" {
		host = "node"
	}
	fmt.Fprintf(w, "%s: %d %s, %d checks, %d critical, %d warnings, %d info\n",
		paint(ansiBold, host), rep.GPUs, pluralS(rep.GPUs, "GPU", "GPUs"), rep.Checks,
		rep.Count(doctor.Critical), rep.Count(doctor.Warning), rep.Count(doctor.Info))
	if len(rep.Sources) > 0 {
		fmt.Fprintf(w, "%s\n", paint(ansiDim, "read: "+printable(strings.Join(rep.Sources, "; "))))
	}
	groups := []struct {
		sev   doctor.Severity
		label string
		color string
	}{
		{doctor.Critical, "CRITICAL", ansiRed},
		{doctor.Warning, "WARNING", ansiYellow},
		{doctor.Info, "INFO", ansiCyan},
	}
	for _, g := range groups {
		first := true
		for _, f := range rep.Findings {
			if f.Severity != g.sev {
				continue
			}
			if first {
				fmt.Fprintf(w, "\n%s\n", paint(g.color+ansiBold, g.label))
				first = false
			}
			title := f.Title
			if f.Secondary {
				cause := f.CausedBy
				if cause == "" {
					cause = "another finding"
				}
				title += " (secondary: caused by " + cause + "; fix that first)"
			}
			fmt.Fprintf(w, "  %s %s\n", paint(g.color, "["+f.ID+"]"), printable(title))
			for _, e := range f.Evidence {
				fmt.Fprintf(w, "      evidence: %s\n", printable(e))
			}
			if f.Impact != "" {
				fmt.Fprintf(w, "      impact:   %s\n", printable(f.Impact))
			}
			if f.Remedy != "" {
				fmt.Fprintf(w, "      fix:      %s\n", printable(f.Remedy))
			}
			if f.Reference != "" {
				fmt.Fprintf(w, "      %s\n", paint(ansiDim, "ref: "+printable(f.Reference)))
			}
		}
	}
	if len(rep.Findings) == 0 {
		fmt.Fprintf(w, "\n%s\n", paint(ansiBold, "No problems found."))
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "%s\n", paint(ansiDim, "note: "+printable(n)))
	}
}

func pluralS(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
