package doctor

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// Fleet finds what only a view of many nodes shows: the same GPU model on
// different firmware (VBIOS), and nodes of one GPU vendor on different
// driver versions. A job spread over such nodes, or moved between them,
// meets different clocks, bugs and failure behaviour; benchmarks of one
// do not hold for the other. nodes maps a node's name to its Snapshot;
// the findings name the nodes (Machine) and say which runs what.
func Fleet(nodes map[string]*snapshot.Snapshot) []Finding {
	vbios := map[string]map[string][]string{}   // model -> VBIOS -> nodes
	drivers := map[string]map[string][]string{} // vendor -> driver -> nodes
	add := func(m map[string]map[string][]string, k, v, node string) {
		if k == "" || v == "" {
			return
		}
		if m[k] == nil {
			m[k] = map[string][]string{}
		}
		for _, n := range m[k][v] {
			if n == node {
				return
			}
		}
		m[k][v] = append(m[k][v], node)
	}
	for name, s := range nodes {
		if s == nil {
			continue
		}
		for _, g := range s.GPUs {
			add(vbios, g.Model, g.VBIOS, name)
		}
		if d := firstNonEmpty(s.Drivers.NVIDIAKernel, s.Drivers.NVIDIAUser); d != "" && hasVendorGPU(s, snapshot.VendorNVIDIA) {
			add(drivers, "NVIDIA", d, name)
		}
		if d := firstNonEmpty(s.Drivers.ROCm, s.Drivers.AMDGPU); d != "" && hasVendorGPU(s, snapshot.VendorAMD) {
			add(drivers, "AMD", d, name)
		}
	}
	var out []Finding
	// mixed adds a finding for each key that has several values.
	mixed := func(by map[string]map[string][]string, id string, sev Severity, title func(k string, n int) string, impact, remedy string) {
		for _, k := range sortedKeys(by) {
			if len(by[k]) < 2 {
				continue
			}
			out = append(out, Finding{ID: id, Severity: sev, Title: title(k, len(by[k])), Evidence: spread(by[k]),
				Impact: impact, Remedy: remedy, Machine: strings.Join(nodesOf(by[k]), ", ")})
		}
	}
	mixed(vbios, "fleet-vbios-mixed", Warning,
		func(model string, n int) string {
			return fmt.Sprintf("%s runs %d VBIOS versions across the fleet", model, n)
		},
		"The same GPU on different firmware can clock, throttle and fail differently: results and benchmarks of one node do not hold on another, and a job spread over them runs at the pace of the slowest.",
		"Bring every node's GPUs of this model to one VBIOS (the vendor's firmware update for the board), then run kiln doctor and kiln bench again.")
	mixed(drivers, "fleet-driver-mixed", Info,
		func(vendor string, n int) string {
			return fmt.Sprintf("%s GPUs run %d driver versions across the fleet", vendor, n)
		},
		"An image that runs on one node's driver may need a newer one elsewhere (kiln compat judges each node), and driver bugs differ between versions.",
		"Run one driver version on every node where the images allow, and check images with kiln compat against the oldest one kept.")
	return out
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func hasVendorGPU(s *snapshot.Snapshot, vendor string) bool {
	for _, g := range s.GPUs {
		if g.Vendor == vendor {
			return true
		}
	}
	return false
}

// spread says which nodes run which value, the most common value first.
func spread(by map[string][]string) []string {
	vals := sortedKeys(by)
	sort.SliceStable(vals, func(i, j int) bool { return len(by[vals[i]]) > len(by[vals[j]]) })
	var out []string
	for _, v := range vals {
		ns := append([]string(nil), by[v]...)
		sort.Strings(ns)
		out = append(out, fmt.Sprintf("%s on %s", v, strings.Join(ns, ", ")))
	}
	return out
}

func nodesOf(by map[string][]string) []string {
	set := map[string]bool{}
	for _, ns := range by {
		for _, n := range ns {
			set[n] = true
		}
	}
	return sortedKeys(set)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
