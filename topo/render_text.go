package topo

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// legend explains the classes, in the words nvidia-smi topo -m uses.
var legend = []string{
	"X    = self",
	"NV#  = connection traversing a bonded set of # NVLinks (directly or through NVSwitches)",
	"XGMI = connection traversing AMD xGMI (Infinity Fabric) links",
	"PIX  = connection traversing at most a single PCIe bridge or switch",
	"PXB  = connection traversing multiple PCIe bridges or switches (without traversing the PCIe host bridge)",
	"PHB  = connection traversing PCIe as well as a PCIe host bridge (typically the CPU)",
	"NODE = connection traversing PCIe as well as the interconnect between PCIe host bridges within a NUMA node",
	"SYS  = connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI, Infinity Fabric)",
	"?    = not known from the sources read",
	"GB/s (uni) is one direction; GB/s (bidi) is both directions added. Ratings are the links' capabilities,",
	"the slowest hop of a PCIe path; CPU interconnects between host bridges and sockets are not rated.",
}

// WriteText writes the matrix as a table like nvidia-smi topo -m, then the
// rated bandwidth of every pair that involves a GPU, then a legend and the
// notes.
func WriteText(w io.Writer, m *Matrix) error {
	var buf bytes.Buffer
	ew := &errWriter{w: &buf}
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	header := []string{""}
	for _, d := range m.Devices {
		header = append(header, d.Name)
	}
	header = append(header, "CPU Affinity", "NUMA Affinity")
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for i, d := range m.Devices {
		row := []string{d.Name}
		for j := range m.Devices {
			row = append(row, cellClass(m, i, j))
		}
		row = append(row, orNA(d.CPUAffinity), numaText(d.NUMANode))
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()

	fmt.Fprintln(ew, "\nDevices:")
	tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	for _, d := range m.Devices {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", d.Name, orNA(d.PCI), d.Interface, d.Model)
	}
	tw.Flush()

	fmt.Fprintln(ew, "\nRated bandwidth per pair:")
	tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  Pair\tClass\tPer direction\tBoth directions\tBasis")
	for _, p := range gpuPairs(m) {
		c := m.Cells[p[0]][p[1]]
		fmt.Fprintf(tw, "  %s-%s\t%s\t%s\t%s\t%s\n", m.Devices[p[0]].Name, m.Devices[p[1]].Name, c.Class,
			uniOrUnknown(c.GBpsUni), bidiOrUnknown(c.GBpsBidi), c.Basis)
	}
	tw.Flush()

	fmt.Fprintln(ew, "\nLegend:")
	for _, l := range legend {
		fmt.Fprintln(ew, "  "+l)
	}
	if len(m.Notes) > 0 {
		fmt.Fprintln(ew, "\nNotes:")
		for _, n := range m.Notes {
			fmt.Fprintln(ew, "  - "+n)
		}
	}
	if ew.err != nil {
		return ew.err
	}
	// tabwriter pads empty trailing cells; drop the padding.
	lines := strings.SplitAfter(buf.String(), "\n")
	var out strings.Builder
	for _, l := range lines {
		nl := strings.HasSuffix(l, "\n")
		out.WriteString(strings.TrimRight(l, " \n"))
		if nl {
			out.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// gpuPairs lists every unordered pair of devices of which at least one is a
// GPU: GPU-GPU pairs first, then GPU-NIC and GPU-NVMe.
func gpuPairs(m *Matrix) [][2]int {
	var out, rest [][2]int
	for i, a := range m.Devices {
		for j := i + 1; j < len(m.Devices); j++ {
			b := m.Devices[j]
			switch {
			case a.Kind == KindGPU && b.Kind == KindGPU:
				out = append(out, [2]int{i, j})
			case a.Kind == KindGPU || b.Kind == KindGPU:
				rest = append(rest, [2]int{i, j})
			}
		}
	}
	return append(out, rest...)
}

func cellClass(m *Matrix, i, j int) string {
	if i < len(m.Cells) && j < len(m.Cells[i]) && m.Cells[i][j].Class != "" {
		return m.Cells[i][j].Class
	}
	return ClassUnknown
}

func orNA(s string) string {
	if s == "" {
		return "N/A"
	}
	return s
}

func numaText(n *int) string {
	if n == nil {
		return "N/A"
	}
	return strconv.Itoa(*n)
}

func uniOrUnknown(v float64) string {
	if v <= 0 {
		return "unknown"
	}
	return uni(v)
}

func bidiOrUnknown(v float64) string {
	if v <= 0 {
		return "unknown"
	}
	return bidi(v)
}

// errWriter keeps the first write error so renderers can check once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
