package topo

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
)

var numaPalette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f"}

func numaColor(n *int) string {
	if n == nil || *n < 0 {
		return "#bab0ac"
	}
	return numaPalette[*n%len(numaPalette)]
}

// WriteSVG draws the matrix as a self-contained SVG: GPUs on a circle with
// their NVLink and xGMI edges, bands that group them by NUMA node, NICs and
// NVMe drives outside the circle next to their nearest GPU, and a legend
// with the rated bandwidth of each class of GPU pair.
func WriteSVG(w io.Writer, m *Matrix) error {
	gpus := m.GPUs()
	sort.SliceStable(gpus, func(a, b int) bool {
		na, nb := m.Devices[gpus[a]].NUMANode, m.Devices[gpus[b]].NUMANode
		switch {
		case na == nil || nb == nil:
			return na != nil && nb == nil
		default:
			return *na < *nb
		}
	})
	n := len(gpus)
	r := math.Max(170, float64(n)*30)
	r2 := r + 70
	if len(gpus) < len(m.Devices) {
		r2 = r + 150
	}
	width := 2*(r2+110) + 20
	cx, cy := width/2, r2+90
	angle := func(k int) float64 {
		if n == 0 {
			return -math.Pi / 2
		}
		return -math.Pi/2 + 2*math.Pi*float64(k)/float64(n)
	}
	pos := map[int][2]float64{}
	for k, g := range gpus {
		a := angle(k)
		pos[g] = [2]float64{cx + r*math.Cos(a), cy + r*math.Sin(a)}
	}

	var body bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&body, format, args...) }

	// NUMA bands behind the GPUs.
	for _, band := range gpuNUMARuns(m, gpus) {
		col := numaColor(band.numa)
		label := "NUMA unknown"
		if band.numa != nil {
			label = fmt.Sprintf("NUMA %d", *band.numa)
		}
		if band.end-band.start+1 == n {
			p(`<circle cx="%.1f" cy="%.1f" r="%.1f" fill="none" stroke="%s" stroke-opacity="0.15" stroke-width="90"/>`+"\n", cx, cy, r, col)
			p(`<text x="%.1f" y="%.1f" text-anchor="middle" class="numa" fill="%s">%s</text>`+"\n", cx, cy-r-60, col, esc(label))
			continue
		}
		half := math.Pi / float64(n) * 0.9
		a0, a1 := angle(band.start)-half, angle(band.end)+half
		large := 0
		if a1-a0 > math.Pi {
			large = 1
		}
		p(`<path d="M %.1f %.1f A %.1f %.1f 0 %d 1 %.1f %.1f" fill="none" stroke="%s" stroke-opacity="0.15" stroke-width="90"/>`+"\n",
			cx+r*math.Cos(a0), cy+r*math.Sin(a0), r, r, large, cx+r*math.Cos(a1), cy+r*math.Sin(a1), col)
		mid := (a0 + a1) / 2
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" class="numa" fill="%s">%s</text>`+"\n", cx+(r+62)*math.Cos(mid), cy+(r+62)*math.Sin(mid)+4, col, esc(label))
	}

	// GPU-to-GPU fabric edges.
	fabricEdges := 0
	for a := 0; a < n; a++ {
		for b := a + 1; b < n; b++ {
			i, j := gpus[a], gpus[b]
			c := m.Cells[i][j]
			pi, pj := pos[i], pos[j]
			if c.Kind != LinkNVLink && c.Kind != LinkXGMI {
				// GPUs that share a PCIe switch or host bridge are joined
				// by a dashed line; NODE and SYS show as the NUMA bands.
				if c.Class == ClassPIX || c.Class == ClassPXB || c.Class == ClassPHB {
					p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="5,4"><title>%s</title></line>`+"\n",
						pi[0], pi[1], pj[0], pj[1], classColor(c), esc(edgeTitle(m, i, j)))
					p(`<text x="%.1f" y="%.1f" text-anchor="middle" class="small">%s</text>`+"\n", (pi[0]+pj[0])/2, (pi[1]+pj[1])/2-3, esc(c.Class))
				}
				continue
			}
			fabricEdges++
			sw := 1.5
			if c.Links > 0 {
				sw += math.Min(float64(c.Links), 18) / 3
			}
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f" stroke-opacity="0.7"><title>%s</title></line>`+"\n",
				pi[0], pi[1], pj[0], pj[1], classColor(c), sw, esc(edgeTitle(m, i, j)))
		}
	}
	if n > 1 && fabricEdges == 0 {
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" class="small">no NVLink or xGMI between GPUs:</text>`+"\n", cx, cy-6)
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" class="small">GPU pairs talk over PCIe (see legend)</text>`+"\n", cx, cy+10)
	}

	// NICs and NVMe drives next to their nearest GPU.
	attached := map[int]int{}
	var unplaced []int
	for i, d := range m.Devices {
		if d.Kind == KindGPU {
			continue
		}
		g, ok := nearestGPU(m, i)
		if !ok || n == 0 {
			unplaced = append(unplaced, i)
			continue
		}
		k := indexOf(gpus, g)
		slot := attached[g]
		attached[g]++
		rr := r2 + float64(slot/5)*60
		// Neighbours sit 125 px apart along the ring, alternating sides.
		a := angle(k) + float64((slot%5+1)/2)*(125/rr)*float64(1-2*(slot%2))
		x, y := cx+rr*math.Cos(a), cy+rr*math.Sin(a)
		c := m.Cells[g][i]
		gp := pos[g]
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="5,4"><title>%s</title></line>`+"\n",
			gp[0], gp[1], x, y, classColor(c), esc(edgeTitle(m, g, i)))
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" class="small">%s</text>`+"\n", (gp[0]+x)/2, (gp[1]+y)/2-3, esc(c.Class))
		pos[i] = [2]float64{x, y}
	}
	for k, i := range unplaced {
		pos[i] = [2]float64{70 + float64(k%8)*125, 0} // y set below the legend
	}

	// Nodes on top of the edges.
	node := func(i int, y float64) {
		d := m.Devices[i]
		x := pos[i][0]
		p(`<g><title>%s</title>`, esc(deviceTitle(d)))
		p(`<rect x="%.1f" y="%.1f" width="110" height="42" rx="8" fill="%s" stroke="%s" stroke-width="2.5"/>`,
			x-55, y-21, kindColor(d.Kind), numaColor(d.NUMANode))
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" class="name">%s</text>`, x, y-3, esc(d.Name))
		p(`<text x="%.1f" y="%.1f" text-anchor="middle" class="small">%s</text></g>`+"\n", x, y+12, esc(shorten(deviceSubtitle(d), 18)))
	}
	for i := range m.Devices {
		if indexOf(unplaced, i) < 0 {
			node(i, pos[i][1])
		}
	}

	// Legend.
	y := cy + r2 + 70
	p(`<text x="20" y="%.1f" class="name">Legend</text>`+"\n", y)
	y += 22
	for _, item := range []struct{ color, dash, text string }{
		{"#76b900", "", "NVLink (NV#: bonded links; width grows with the link count)"},
		{"#ed1c24", "", "xGMI (AMD Infinity Fabric)"},
		{"#3d85c6", "5,4", "PCIe within switches (PIX, PXB)"},
		{"#e69138", "5,4", "PCIe through host bridges (PHB, NODE)"},
		{"#990000", "5,4", "PCIe across NUMA nodes (SYS)"},
	} {
		dash := ""
		if item.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, item.dash)
		}
		p(`<line x1="20" y1="%.1f" x2="60" y2="%.1f" stroke="%s" stroke-width="3"%s/>`, y-4, y-4, item.color, dash)
		p(`<text x="70" y="%.1f" class="small">%s</text>`+"\n", y, esc(item.text))
		y += 18
	}
	x := 20.0
	for _, g := range numaGroups(m) {
		label := "NUMA unknown"
		if g.numa != nil {
			label = fmt.Sprintf("NUMA %d", *g.numa)
		}
		p(`<rect x="%.1f" y="%.1f" width="14" height="14" fill="none" stroke="%s" stroke-width="2.5"/>`, x, y-11, numaColor(g.numa))
		p(`<text x="%.1f" y="%.1f" class="small">%s</text>`+"\n", x+20, y, esc(label))
		x += 110
	}
	y += 24
	p(`<text x="20" y="%.1f" class="name">Rated bandwidth of GPU pairs (GB/s (uni) is one direction, GB/s (bidi) both added)</text>`+"\n", y)
	y += 20
	for _, line := range pairSummary(m) {
		p(`<text x="20" y="%.1f" class="small">%s</text>`+"\n", y, esc(line))
		y += 16
	}
	if len(unplaced) > 0 {
		y += 30
		p(`<text x="20" y="%.1f" class="name">Devices with no known connection to a GPU</text>`+"\n", y)
		y += 36
		for k, i := range unplaced {
			if k > 0 && k%8 == 0 {
				y += 56
			}
			node(i, y)
		}
	}
	height := y + 40

	ew := &errWriter{w: w}
	fmt.Fprintf(ew, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif">`+"\n",
		width, height, width, height)
	fmt.Fprintln(ew, `<style>.name{font-size:13px;font-weight:bold}.small{font-size:10px}.numa{font-size:13px;font-weight:bold}</style>`)
	fmt.Fprintf(ew, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="white"/>`+"\n", width, height)
	ew.Write(body.Bytes())
	fmt.Fprintln(ew, "</svg>")
	return ew.err
}

type gpuRun struct {
	numa       *int
	start, end int
}

// gpuNUMARuns splits the circle order of GPUs into runs of one NUMA node.
func gpuNUMARuns(m *Matrix, gpus []int) []gpuRun {
	var runs []gpuRun
	for k, g := range gpus {
		nn := m.Devices[g].NUMANode
		if len(runs) > 0 && sameNUMA(runs[len(runs)-1].numa, nn) {
			runs[len(runs)-1].end = k
			continue
		}
		runs = append(runs, gpuRun{numa: nn, start: k, end: k})
	}
	return runs
}

func sameNUMA(a, b *int) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// nearestGPU is the GPU best connected to device i.
func nearestGPU(m *Matrix, i int) (int, bool) {
	best, rank := -1, 0
	for _, g := range m.GPUs() {
		c := m.Cells[g][i]
		if c.Class == ClassUnknown || c.Rank() >= 1000 {
			continue
		}
		if best < 0 || c.Rank() < rank {
			best, rank = g, c.Rank()
		}
	}
	return best, best >= 0
}

func indexOf(xs []int, v int) int {
	for k, x := range xs {
		if x == v {
			return k
		}
	}
	return -1
}

func edgeTitle(m *Matrix, i, j int) string {
	c := m.Cells[i][j]
	s := fmt.Sprintf("%s-%s %s: %s", m.Devices[i].Name, m.Devices[j].Name, c.Class, edgeBandwidth(c))
	if c.Basis != "" {
		s += " (" + c.Basis + ")"
	}
	return s
}

func deviceTitle(d Device) string {
	parts := []string{d.Name}
	for _, s := range []string{d.Model, d.Interface, d.PCI} {
		if s != "" {
			parts = append(parts, s)
		}
	}
	if d.NUMANode != nil {
		parts = append(parts, fmt.Sprintf("NUMA %d", *d.NUMANode))
	}
	if d.CPUAffinity != "" {
		parts = append(parts, "CPUs "+d.CPUAffinity)
	}
	return strings.Join(parts, ", ")
}

func deviceSubtitle(d Device) string {
	switch {
	case d.Interface != "":
		return d.Interface
	case d.Model != "":
		return strings.TrimPrefix(strings.TrimPrefix(d.Model, "NVIDIA "), "AMD ")
	default:
		return d.PCI
	}
}

func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// pairSummary groups GPU pairs by class and rating.
func pairSummary(m *Matrix) []string {
	type key struct {
		class     string
		uni, bidi float64
	}
	count := map[key]int{}
	var order []key
	gpus := m.GPUs()
	for a := 0; a < len(gpus); a++ {
		for b := a + 1; b < len(gpus); b++ {
			c := m.Cells[gpus[a]][gpus[b]]
			k := key{c.Class, c.GBpsUni, c.GBpsBidi}
			if count[k] == 0 {
				order = append(order, k)
			}
			count[k]++
		}
	}
	sort.SliceStable(order, func(a, b int) bool {
		return Cell{Class: order[a].class}.Rank() < Cell{Class: order[b].class}.Rank()
	})
	var out []string
	for _, k := range order {
		bw := "not rated"
		if k.uni > 0 {
			bw = uni(k.uni) + " / " + bidi(k.bidi)
		}
		noun := "pairs"
		if count[k] == 1 {
			noun = "pair"
		}
		out = append(out, fmt.Sprintf("%s: %d %s, %s", k.class, count[k], noun, bw))
	}
	if len(out) == 0 {
		out = append(out, "fewer than two GPUs")
	}
	return out
}

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
