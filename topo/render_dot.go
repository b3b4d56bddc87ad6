package topo

import (
	"fmt"
	"io"
	"strings"
)

// WriteDOT writes the matrix as a Graphviz graph: GPUs, NICs and NVMe drives
// as nodes grouped by NUMA node, and one edge for every pair that involves a
// GPU, labelled with its class and rated bandwidth. NVLink and xGMI edges are
// drawn thick.
func WriteDOT(w io.Writer, m *Matrix) error {
	ew := &errWriter{w: w}
	fmt.Fprintln(ew, "graph topology {")
	fmt.Fprintln(ew, `  graph [overlap=false, splines=true, fontname="Helvetica"];`)
	fmt.Fprintln(ew, `  node [shape=box, style="rounded,filled", fontname="Helvetica"];`)
	fmt.Fprintln(ew, `  edge [fontname="Helvetica", fontsize=9];`)
	for _, g := range numaGroups(m) {
		indent := "  "
		if g.numa != nil {
			fmt.Fprintf(ew, "  subgraph cluster_numa%d {\n    label=%s;\n    style=dashed;\n", *g.numa, dotQuote(fmt.Sprintf("NUMA node %d", *g.numa)))
			indent = "    "
		}
		for _, i := range g.devices {
			d := m.Devices[i]
			label := d.Name
			for _, s := range []string{d.Model, d.Interface, d.PCI} {
				if s != "" {
					label += "\n" + s
				}
			}
			fmt.Fprintf(ew, "%s%s [label=%s, fillcolor=%s];\n", indent, dotQuote(d.Name), dotQuote(label), dotQuote(kindColor(d.Kind)))
		}
		if g.numa != nil {
			fmt.Fprintln(ew, "  }")
		}
	}
	for _, p := range gpuPairs(m) {
		c := m.Cells[p[0]][p[1]]
		attrs := []string{"label=" + dotQuote(c.Class+"\n"+edgeBandwidth(c)), "color=" + dotQuote(classColor(c))}
		switch c.Kind {
		case LinkNVLink, LinkXGMI:
			attrs = append(attrs, "penwidth=4")
		default:
			attrs = append(attrs, "style=dashed")
		}
		fmt.Fprintf(ew, "  %s -- %s [%s];\n", dotQuote(m.Devices[p[0]].Name), dotQuote(m.Devices[p[1]].Name), strings.Join(attrs, ", "))
	}
	fmt.Fprintln(ew, "}")
	return ew.err
}

func edgeBandwidth(c Cell) string {
	if c.GBpsUni <= 0 {
		return "bandwidth not rated"
	}
	return uni(c.GBpsUni) + " / " + bidi(c.GBpsBidi)
}

func dotQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", "")
	return `"` + r.Replace(s) + `"`
}

func kindColor(kind string) string {
	switch kind {
	case KindGPU:
		return "#d9ead3"
	case KindNIC:
		return "#cfe2f3"
	default:
		return "#fff2cc"
	}
}

func classColor(c Cell) string {
	switch {
	case c.Kind == LinkNVLink:
		return "#76b900"
	case c.Kind == LinkXGMI:
		return "#ed1c24"
	case c.Class == ClassPIX, c.Class == ClassPXB:
		return "#3d85c6"
	case c.Class == ClassPHB, c.Class == ClassNode:
		return "#e69138"
	case c.Class == ClassSys, c.Class == "SOC":
		return "#990000"
	default:
		return "#999999"
	}
}

// numaGroup is the devices of one NUMA node; numa is nil for unknown.
type numaGroup struct {
	numa    *int
	devices []int
}

// numaGroups groups devices by NUMA node, in order of node id, unknown last.
func numaGroups(m *Matrix) []numaGroup {
	var groups []numaGroup
	var unknown []int
	for i, d := range m.Devices {
		if d.NUMANode == nil {
			unknown = append(unknown, i)
			continue
		}
		found := false
		for g := range groups {
			if *groups[g].numa == *d.NUMANode {
				groups[g].devices = append(groups[g].devices, i)
				found = true
			}
		}
		if !found {
			n := *d.NUMANode
			groups = append(groups, numaGroup{numa: &n, devices: []int{i}})
		}
	}
	for a := 1; a < len(groups); a++ {
		for b := a; b > 0 && *groups[b].numa < *groups[b-1].numa; b-- {
			groups[b], groups[b-1] = groups[b-1], groups[b]
		}
	}
	if len(unknown) > 0 {
		groups = append(groups, numaGroup{devices: unknown})
	}
	return groups
}
