package gpubench

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

// Judge puts every figure of ms beside the rating of its link and gives
// its verdict: below-rating under thresholdPercent of the rating (0: the
// default, 70), ok at or above, not-rated where no rating is known,
// not-judged for figures kept for reference (pageable memory, whose
// copies go through the driver's staging buffers, and latency). Ratings
// come from the node's Snapshot, its matrix (nil: built here) and the
// knowledge base: the slowest PCIe link between a GPU and its root port
// for host transfers, the catalog's memory bandwidth for device memory,
// the pair's cell for peer-to-peer, and the slowest pair's per-direction
// rating for collectives (bus bandwidth is comparable with it). Each
// measurement's GPUs become the Snapshot's indexes of its devices.
func Judge(ms *snapshot.Measurements, s *snapshot.Snapshot, m *topo.Matrix, k *kb.KB, thresholdPercent float64) {
	if ms == nil {
		return
	}
	if thresholdPercent <= 0 {
		thresholdPercent = DefaultThresholdPercent
	}
	ms.ThresholdPercent = thresholdPercent
	if k == nil {
		k = kb.Default()
	}
	if s == nil {
		s = snapshot.New()
	}
	if m == nil {
		m, _ = topo.Build(s, k)
	}
	j := newJudge(s, m, k)
	for i := range ms.Results {
		j.judge(&ms.Results[i], ms.Ranks, thresholdPercent)
	}
}

type judge struct {
	s   *snapshot.Snapshot
	m   *topo.Matrix
	k   *kb.KB
	pci map[string]*snapshot.PCIDevice
}

func newJudge(s *snapshot.Snapshot, m *topo.Matrix, k *kb.KB) *judge {
	j := &judge{s: s, m: m, k: k, pci: map[string]*snapshot.PCIDevice{}}
	for i := range s.PCI {
		if a, err := snapshot.CanonicalPCI(s.PCI[i].Address); err == nil {
			j.pci[a] = &s.PCI[i]
		}
	}
	return j
}

// matrixIndex returns a device's row in the matrix, -1 if absent.
func (j *judge) matrixIndex(addr string) int {
	if j.m == nil || addr == "" {
		return -1
	}
	a, err := snapshot.CanonicalPCI(addr)
	if err != nil {
		return -1
	}
	for i, d := range j.m.Devices {
		if d.PCI == a {
			return i
		}
	}
	return -1
}

// name is how kiln topo names the GPU measured at position i of m.
func (j *judge) name(m *snapshot.Measurement, i int) string {
	if i < len(m.Devices) {
		if x := j.matrixIndex(m.Devices[i]); x >= 0 {
			return j.m.Devices[x].Name
		}
		if g := j.s.GPUByPCI(m.Devices[i]); g != nil {
			return fmt.Sprintf("GPU%d", g.Index)
		}
	}
	if i < len(m.GPUs) {
		return fmt.Sprintf("GPU%d", m.GPUs[i])
	}
	return "GPU?"
}

func (j *judge) judge(m *snapshot.Measurement, ranks int, threshold float64) {
	for i, d := range m.Devices {
		if g := j.s.GPUByPCI(d); g != nil && i < len(m.GPUs) {
			m.GPUs[i] = g.Index
		}
	}
	names := make([]string, len(m.Devices))
	for i := range names {
		names[i] = j.name(m, i)
	}
	if len(names) == 0 {
		names = []string{"GPU?"}
	}
	m.RatedGBps, m.RatedBasis = 0, ""
	judged := true
	switch m.Test {
	case TestH2D, TestD2H:
		m.Link = names[0] + " host link"
		if g := j.s.GPUByPCI(first(m.Devices)); g != nil {
			m.RatedGBps, m.RatedBasis = j.hostLink(g, names[0])
		}
		judged = m.Memory != HostPageable.String()
	case TestDevice:
		m.Link = names[0] + " memory"
		if g := j.s.GPUByPCI(first(m.Devices)); g != nil {
			m.RatedGBps, m.RatedBasis = j.memory(g)
		}
	case TestP2P, TestP2PBidi, TestP2PLatency:
		if len(names) < 2 {
			break
		}
		sep := "->"
		if m.Test == TestP2PBidi {
			sep = "<->"
		}
		m.Link = names[0] + sep + names[1]
		a, b := j.matrixIndex(m.Devices[0]), j.matrixIndex(m.Devices[1])
		if a >= 0 && b >= 0 {
			c := j.m.Cells[a][b]
			if c.Class != "" && c.Class != topo.ClassUnknown {
				m.Link += " (" + c.Class + ")"
			}
			m.RatedGBps, m.RatedBasis = c.GBpsUni, c.Basis
			if m.Test == TestP2PBidi {
				m.RatedGBps = c.GBpsBidi
			}
		}
		judged = m.Test != TestP2PLatency
	case string(AllReduce), string(AllGather), string(ReduceScatter):
		m.Link = fmt.Sprintf("%s over %d GPUs", m.Test, len(m.Devices))
		if ranks > len(m.Devices) {
			m.Link = fmt.Sprintf("%s over %d ranks (%d GPUs here)", m.Test, ranks, len(m.Devices))
			m.RatedBasis = "spans several nodes: the network between them is not rated"
			break
		}
		m.RatedGBps, m.RatedBasis = j.slowestPair(m.Devices)
	}
	m.Ratio = 0
	if m.RatedGBps > 0 && m.MedianGBps > 0 {
		m.Ratio = m.MedianGBps / m.RatedGBps
	}
	switch {
	case m.Error != "":
		m.Verdict = snapshot.VerdictFailed
	case !judged:
		m.Verdict = snapshot.VerdictNotJudged
	case m.RatedGBps <= 0 || m.MedianGBps <= 0:
		m.Verdict = snapshot.VerdictNotRated
	case m.Ratio*100 < threshold:
		m.Verdict = snapshot.VerdictBelowRating
	default:
		m.Verdict = snapshot.VerdictOK
	}
}

func first(xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	return xs[0]
}

// linkCaps is what one PCIe link can do: the lower generation and width of
// its two ends.
type linkCaps struct{ gen, width int }

func capsOf(l *snapshot.PCIeLink) linkCaps {
	if l == nil {
		return linkCaps{}
	}
	return linkCaps{gen: minPos(l.MaxGen, l.HostMaxGen), width: l.MaxWidth}
}

func (c linkCaps) and(o linkCaps) linkCaps {
	return linkCaps{gen: minPos(c.gen, o.gen), width: minPos(c.width, o.width)}
}

func minPos(a, b int) int {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}

// hostLink rates a GPU's path to the host: a stated C2C bandwidth, else
// the slowest PCIe link between the GPU and its root port (each link
// rated at the lower capability of its two ends), else the card's rating
// from the catalog.
func (j *judge) hostLink(g *snapshot.GPU, name string) (float64, string) {
	for _, l := range j.s.Links {
		if strings.EqualFold(l.Kind, snapshot.LinkC2C) && l.BandwidthGBpsUni > 0 && (l.A == g.PCIAddress || l.B == g.PCIAddress) {
			return l.BandwidthGBpsUni, "NVLink-C2C to the CPU, as the driver states it"
		}
	}
	// The chain from the GPU up: the GPU's own link, then each bridge.
	chain := append([]string{g.PCIAddress}, g.Upstream...)
	caps := func(i int) linkCaps {
		var c linkCaps
		if d := j.pci[chain[i]]; d != nil {
			c = capsOf(d.Link)
		}
		if i == 0 {
			c = c.and(capsOf(g.PCIe))
		}
		return c
	}
	kind := func(i int) string {
		if d := j.pci[chain[i]]; d != nil {
			return d.Kind
		}
		return ""
	}
	best, bestCaps, links, bottleneck := 0.0, linkCaps{}, 0, ""
	for i := range chain {
		switch kind(i) {
		case snapshot.KindSwitchDown, snapshot.KindRootPort:
			// Their link registers describe the link below them.
			continue
		}
		c := caps(i)
		if i+1 < len(chain) {
			switch kind(i + 1) {
			case snapshot.KindSwitchDown, snapshot.KindRootPort, "":
				c = c.and(caps(i + 1))
			}
		}
		v := j.k.PCIeGBpsUni(c.gen, c.width)
		if c.gen <= 0 || c.width <= 0 || v <= 0 {
			continue
		}
		links++
		if best == 0 || v < best {
			best, bestCaps, bottleneck = v, c, chain[i]
		}
	}
	if best > 0 {
		basis := fmt.Sprintf("PCIe Gen%d x%d", bestCaps.gen, bestCaps.width)
		if links > 1 {
			basis += fmt.Sprintf(", the slowest of %d links between %s and its root port (at %s)", links, name, bottleneck)
		} else {
			basis += fmt.Sprintf(", %s's link", name)
		}
		return best, basis
	}
	if mdl, ok := j.model(g); ok && mdl.PCIeGen > 0 && mdl.PCIeWidth > 0 {
		if v := j.k.PCIeGBpsUni(mdl.PCIeGen, mdl.PCIeWidth); v > 0 {
			return v, fmt.Sprintf("PCIe Gen%d x%d, the %s's rating in kiln's catalog (the slot's link was not read)", mdl.PCIeGen, mdl.PCIeWidth, mdl.Name)
		}
	}
	return 0, ""
}

func (j *judge) model(g *snapshot.GPU) (kb.GPUModel, bool) {
	if g.DeviceID != "" {
		if m, ok := j.k.GPUByDeviceID(g.Vendor, g.DeviceID); ok {
			return m, true
		}
	}
	if g.Model != "" {
		return j.k.GPUByName(g.Model)
	}
	return kb.GPUModel{}, false
}

// memory rates a GPU's memory from the catalog.
func (j *judge) memory(g *snapshot.GPU) (float64, string) {
	m, ok := j.model(g)
	bw := m.DeviceMemoryBandwidthGBps() // one die's share on a board of several (MI250)
	if !ok || bw <= 0 {
		return 0, ""
	}
	return bw, fmt.Sprintf("%s memory bandwidth in kiln's catalog (bytes read plus written)", m.Name)
}

// slowestPair rates a collective by the slowest pair of its GPUs, per
// direction; unknown when any pair is not rated.
func (j *judge) slowestPair(devs []string) (float64, string) {
	if j.m == nil || len(devs) < 2 {
		return 0, ""
	}
	idx := make([]int, len(devs))
	for i, d := range devs {
		if idx[i] = j.matrixIndex(d); idx[i] < 0 {
			return 0, ""
		}
	}
	best, basis := 0.0, ""
	for a := range idx {
		for b := a + 1; b < len(idx); b++ {
			c := j.m.Cells[idx[a]][idx[b]]
			if c.GBpsUni <= 0 {
				return 0, ""
			}
			if best == 0 || c.GBpsUni < best {
				best = c.GBpsUni
				basis = fmt.Sprintf("the slowest GPU pair, %s-%s (%s), per direction: %s", j.m.Devices[idx[a]].Name, j.m.Devices[idx[b]].Name, c.Class, c.Basis)
			}
		}
	}
	return best, basis
}
