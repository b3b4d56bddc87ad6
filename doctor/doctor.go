// Package doctor explains what is wrong with a node. It is a registry of
// checks, one concern each (one file each), every check a pure function of a
// Snapshot, the knowledge base and the topology derived from them. Checks
// never do I/O, so each is tested on recorded machines without hardware.
//
// Finding ids are part of kiln's interface, like a linter's rule names: they
// do not change once published.
package doctor

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

// Severity orders findings. Its text form is used in JSON and YAML.
type Severity int

// Severities, from least to most urgent.
const (
	Info Severity = iota
	Warning
	Critical
)

func (s Severity) String() string {
	switch s {
	case Info:
		return "info"
	case Warning:
		return "warning"
	case Critical:
		return "critical"
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Severity) UnmarshalText(b []byte) error {
	switch string(b) {
	case "info":
		*s = Info
	case "warning":
		*s = Warning
	case "critical":
		*s = Critical
	default:
		return fmt.Errorf("unknown severity %q (want info, warning or critical)", b)
	}
	return nil
}

// Finding is one problem the doctor reports.
type Finding struct {
	ID       string   `json:"id"`
	Severity Severity `json:"severity"`
	// Title is one line that names the problem and where it is.
	Title string `json:"title"`
	// Devices are canonical PCI addresses (dddd:bb:dd.f); empty when the
	// finding concerns the node or the source gave no address.
	Devices []string `json:"devices"`
	// Code is the Xid for xid-error, the NVSwitch error for nvswitch-error.
	Code int `json:"code,omitempty"`
	// Evidence lists the values read that support the finding.
	Evidence []string `json:"evidence"`
	// Impact says why it matters; ImpactPercent puts a number on it where
	// facts allow (share of rated bandwidth lost, for instance).
	Impact        string   `json:"impact"`
	ImpactPercent *float64 `json:"impact_percent,omitempty"`
	Remedy        string   `json:"remedy"`
	Reference     string   `json:"reference,omitempty"`
	// Machine names the machine of a report on several ("gpu-node-7",
	// "machine 2"); empty when the report is of one machine.
	Machine string `json:"machine,omitempty"`
	// Secondary marks a finding caused by another one (CausedBy names it):
	// fix the cause first.
	Secondary bool   `json:"secondary,omitempty"`
	CausedBy  string `json:"caused_by,omitempty"`
}

// Input is what every check sees.
type Input struct {
	Snapshot *snapshot.Snapshot
	KB       *kb.KB
	// Topo is the link matrix; nil when it could not be built.
	Topo *topo.Matrix
}

// Check is one concern.
type Check struct {
	// Name identifies the check; the ids it may report are in IDs.
	Name string
	IDs  []string
	// Doc is one sentence for `kiln doctor --list`.
	Doc string
	Run func(in *Input) []Finding
}

var registry []Check

func register(c Check) {
	registry = append(registry, c)
}

// Checks returns the registered checks sorted by name.
func Checks() []Check {
	out := append([]Check(nil), registry...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Report is the doctor's answer for one node.
type Report struct {
	Hostname string    `json:"hostname,omitempty"`
	GPUs     int       `json:"gpus"`
	Sources  []string  `json:"sources,omitempty"`
	Checks   int       `json:"checks_run"`
	Findings []Finding `json:"findings"`
	Notes    []string  `json:"notes,omitempty"`
	// Errors are the inputs kiln could not read; the report covers the
	// others.
	Errors []string `json:"errors,omitempty"`
	// Machines lists the machines of a report on inputs of several; each
	// finding names its machine.
	Machines []MachineReport `json:"machines,omitempty"`
}

// MachineReport is one machine of a report on several.
type MachineReport struct {
	Label    string   `json:"label"`
	Hostname string   `json:"hostname,omitempty"`
	GPUs     int      `json:"gpus"`
	Sources  []string `json:"sources"`
	// Why says why its inputs were taken as a machine of their own.
	Why      string `json:"why,omitempty"`
	Critical int    `json:"critical"`
	Warnings int    `json:"warnings"`
	Info     int    `json:"info"`
}

// Combine makes one report of the reports of several machines: every
// finding carries its machine's label, and Machines says what each was.
// One report is returned as it is.
func Combine(reps []*Report, labels, why []string) *Report {
	if len(reps) == 1 {
		return reps[0]
	}
	out := &Report{Findings: []Finding{}}
	for i, r := range reps {
		out.GPUs += r.GPUs
		out.Sources = append(out.Sources, r.Sources...)
		out.Checks = r.Checks
		for _, f := range r.Findings {
			f.Machine = labels[i]
			out.Findings = append(out.Findings, f)
		}
		for _, n := range r.Notes {
			out.Notes = append(out.Notes, labels[i]+": "+n)
		}
		out.Machines = append(out.Machines, MachineReport{Label: labels[i], Hostname: r.Hostname, GPUs: r.GPUs, Sources: r.Sources,
			Why: why[i], Critical: r.Count(Critical), Warnings: r.Count(Warning), Info: r.Count(Info)})
	}
	return out
}

// Exit codes, documented in `kiln doctor --help`.
const (
	ExitHealthy  = 0
	ExitWarning  = 1
	ExitCritical = 2
	ExitCannot   = 3
)

// ExitCode is 0 when healthy or only informational, 1 with warnings, 2
// with a critical finding.
func (r *Report) ExitCode() int {
	code := ExitHealthy
	for _, f := range r.Findings {
		switch f.Severity {
		case Critical:
			return ExitCritical
		case Warning:
			code = ExitWarning
		}
	}
	return code
}

// Count returns the number of findings of a severity.
func (r *Report) Count(s Severity) int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == s {
			n++
		}
	}
	return n
}

// Run examines a snapshot with every registered check. It sorts findings by
// severity (critical first), then id, then first device.
func Run(ctx context.Context, s *snapshot.Snapshot, k *kb.KB) (*Report, error) {
	if s == nil {
		return nil, fmt.Errorf("doctor: no snapshot")
	}
	if k == nil {
		k = kb.Default()
	}
	in := &Input{Snapshot: s, KB: k}
	rep := &Report{Hostname: s.Host.Hostname, GPUs: len(s.GPUs), Findings: []Finding{}}
	for _, src := range s.Sources {
		if src.Path != "" {
			rep.Sources = append(rep.Sources, src.Kind+" "+src.Path)
		} else {
			rep.Sources = append(rep.Sources, src.Kind)
		}
	}
	m, err := topo.Build(s, k)
	if err != nil {
		rep.Notes = append(rep.Notes, "topology not built: "+err.Error())
	} else {
		in.Topo = m
	}
	for _, c := range Checks() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, f := range c.Run(in) {
			if f.Devices == nil {
				f.Devices = []string{}
			}
			if f.Evidence == nil {
				f.Evidence = []string{}
			}
			rep.Findings = append(rep.Findings, f)
		}
		rep.Checks++
	}
	for _, n := range s.Notes {
		rep.Notes = append(rep.Notes, n.Source+": "+n.Message)
	}
	sort.SliceStable(rep.Findings, func(i, j int) bool {
		a, b := rep.Findings[i], rep.Findings[j]
		if a.Severity != b.Severity {
			return a.Severity > b.Severity
		}
		if a.ID != b.ID {
			return a.ID < b.ID
		}
		return strings.Join(a.Devices, ",") < strings.Join(b.Devices, ",")
	})
	return rep, nil
}
