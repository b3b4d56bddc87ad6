package compat

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// Checked is an image kiln compat read before (from its cache), with what
// it needs to run.
type Checked struct {
	Ref          string
	Platform     string
	Requirements *Requirements
}

// Resolve completes what the knowledge base adds to the requirements (the
// CUDA release of each PTX ISA, the CUDA the binaries were built with).
// Check does it on first use; call Resolve before Requirements are shared
// between goroutines.
func (r *Requirements) Resolve(k *kb.KB) { r.resolve(k) }

// Fleet gives the findings only a view of the whole fleet can make about
// images: for each image kiln compat read before, the nodes with GPUs
// where it cannot run ("fleet-image-fails", a warning: a job of that image
// sent there fails) and those where kiln cannot tell ("fleet-image-unknown",
// information: an unknown is not a yes). Nodes without GPUs are left out;
// an image that runs everywhere gives no finding.
func Fleet(images []Checked, nodes map[string]*snapshot.Snapshot, k *kb.KB) []doctor.Finding {
	names := make([]string, 0, len(nodes))
	for name, s := range nodes {
		if s != nil && len(s.GPUs) > 0 {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var out []doctor.Finding
	for _, img := range images {
		if img.Requirements == nil || len(names) == 0 {
			continue
		}
		var fails, unknown []string
		var failEv, unknownEv []string
		fixes := map[string]bool{}
		var fixOrder []string
		for _, name := range names {
			nr := Check(img.Requirements, Node{Name: name, Snapshot: nodes[name]}, k)
			switch nr.Verdict {
			case Fails:
				fails = append(fails, name)
				failEv = append(failEv, nodeEvidence(nr, Fails))
				for _, f := range nodeFixes(nr, Fails) {
					if !fixes[f] {
						fixes[f] = true
						fixOrder = append(fixOrder, f)
					}
				}
			case Unknown:
				unknown = append(unknown, name)
				unknownEv = append(unknownEv, nodeEvidence(nr, Unknown))
			}
		}
		label := img.Ref
		if img.Platform != "" {
			label += " (" + img.Platform + ")"
		}
		if len(fails) > 0 {
			remedy := "Keep jobs of this image off these nodes (kiln compat IMAGE --nodes shows each GPU's verdict), or bring their drivers to what the image needs, or rebuild the image for their GPUs."
			if len(fixOrder) > 0 {
				remedy = strings.Join(fixOrder, "; ") + ". " + remedy
			}
			out = append(out, doctor.Finding{ID: "fleet-image-fails", Severity: doctor.Warning,
				Title:    fmt.Sprintf("%s cannot run on %d of %d GPU nodes", label, len(fails), len(names)),
				Devices:  []string{},
				Evidence: failEv,
				Impact:   "A job of this image sent to one of these nodes fails at start or when it first loads GPU code, after it waited for its GPUs.",
				Remedy:   remedy, Machine: strings.Join(fails, ", ")})
		}
		if len(unknown) > 0 {
			out = append(out, doctor.Finding{ID: "fleet-image-unknown", Severity: doctor.Info,
				Title:    fmt.Sprintf("kiln cannot tell whether %s runs on %d of %d GPU nodes", label, len(unknown), len(names)),
				Devices:  []string{},
				Evidence: unknownEv,
				Impact:   "What kiln read of these nodes or of the image does not settle it: a job may run there or fail.",
				Remedy:   "Run kiln doctor on these nodes (a driver version or GPU model kiln could not read is the usual cause), then kiln compat IMAGE --nodes again.",
				Machine:  strings.Join(unknown, ", ")})
		}
	}
	return out
}

// nodeEvidence is one line for a node: its driver and the first reason of
// the first GPU with the verdict.
func nodeEvidence(nr NodeReport, v Verdict) string {
	drv := nr.Driver
	if nr.DriverCUDA != "" {
		drv += " (CUDA " + nr.DriverCUDA + ")"
	}
	if drv == "" {
		drv = "driver unknown"
	} else {
		drv = "driver " + drv
	}
	reason := strings.Join(nr.Reasons, "; ")
	n := 0
	for _, g := range nr.GPUs {
		if g.Verdict != v {
			continue
		}
		n++
		if reason == "" && len(g.Reasons) > 0 {
			reason = fmt.Sprintf("GPU %d (%s): %s", g.Index, g.Model, g.Reasons[0])
		}
	}
	if n > 1 {
		reason += fmt.Sprintf(" (and %d more GPUs)", n-1)
	}
	return fmt.Sprintf("%s, %s: %s", nr.Node, drv, reason)
}

// nodeFixes are the fixes the node's GPUs with the verdict give.
func nodeFixes(nr NodeReport, v Verdict) []string {
	var out []string
	for _, g := range nr.GPUs {
		if g.Verdict == v {
			out = append(out, g.Fix...)
		}
	}
	return out
}
