package topo

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// pairKey is an unordered pair of device indexes, a < b.
type pairKey struct{ a, b int }

func keyOf(i, j int) pairKey {
	if i > j {
		i, j = j, i
	}
	return pairKey{i, j}
}

// pairLinks is what explicit link data says about one GPU pair.
type pairLinks struct {
	nvlink    int
	nvVersion int
	viaSwitch bool

	xgmi        int
	xgmiKnown   bool
	xgmiVersion int
	xgmiStated  float64
	hops        int
}

// fabric gathers NVLink and xGMI facts per GPU and per GPU pair.
type fabric struct {
	pairs map[pairKey]*pairLinks
	// switchLinks counts a GPU's active NVLinks that end at NVSwitches.
	switchLinks   map[int]int
	switchVersion map[int]int
	// unknownRemote counts active NVLinks whose far end is not reported.
	unknownRemote map[int]int
	// reported is the lowest per-link speed per direction a driver reports.
	reported map[int]float64
	// switchEvidence says why the node is taken to have an NVSwitch fabric.
	switchEvidence string
}

func (b *builder) gpuIdents() map[string]int {
	ids := map[string]int{}
	for i, d := range b.devs {
		if b.m.Devices[i].Kind != KindGPU {
			continue
		}
		if d.addr != "" {
			ids[d.addr] = i
		}
		if d.matrixName != "" {
			ids[d.matrixName] = i
		}
		if d.gpu != nil && d.gpu.MatrixName != "" {
			ids[strings.TrimSpace(d.gpu.MatrixName)] = i
		}
	}
	return ids
}

func (b *builder) collectLinks() {
	f := fabric{
		pairs:         map[pairKey]*pairLinks{},
		switchLinks:   map[int]int{},
		switchVersion: map[int]int{},
		unknownRemote: map[int]int{},
		reported:      map[int]float64{},
	}
	ids := b.gpuIdents()
	resolve := func(x string) int {
		if c := canon(x); c != "" {
			if i, ok := ids[c]; ok {
				return i
			}
		}
		if i, ok := ids[strings.TrimSpace(x)]; ok {
			return i
		}
		return -1
	}
	switches := 0
	isSwitch := func(x string) bool {
		if p := b.pci[canon(x)]; p != nil && p.Kind == snapshot.KindNVSwitch {
			return true
		}
		return strings.Contains(strings.ToLower(x), "nvswitch")
	}
	for _, p := range b.pci {
		if p.Kind == snapshot.KindNVSwitch {
			switches++
		}
	}
	pl := func(i, j int) *pairLinks {
		k := keyOf(i, j)
		if f.pairs[k] == nil {
			f.pairs[k] = &pairLinks{}
		}
		return f.pairs[k]
	}

	viaSwitchLinks := false
	for _, l := range b.s.Links {
		kind := strings.ToLower(l.Kind)
		if kind != snapshot.LinkNVLink && kind != snapshot.LinkXGMI {
			continue
		}
		ia, ib := resolve(l.A), resolve(l.B)
		count := max(l.Count, 0)
		switch {
		case ia >= 0 && ib >= 0 && ia != ib:
			p := pl(ia, ib)
			if kind == snapshot.LinkNVLink {
				p.nvlink = max(p.nvlink, count)
				p.nvVersion = max(p.nvVersion, l.Version)
				p.viaSwitch = p.viaSwitch || l.ViaSwitch
				viaSwitchLinks = viaSwitchLinks || l.ViaSwitch
			} else {
				p.xgmiKnown = true
				p.xgmi = max(p.xgmi, count)
				p.xgmiVersion = max(p.xgmiVersion, l.Version)
				if l.BandwidthGBpsUni > 0 {
					p.xgmiStated = l.BandwidthGBpsUni
				}
				if l.Hops > 0 {
					p.hops = l.Hops
				}
			}
		case kind == snapshot.LinkNVLink && (ia >= 0) != (ib >= 0):
			g, other := ia, l.B
			if g < 0 {
				g, other = ib, l.A
			}
			if isSwitch(other) || l.ViaSwitch {
				f.switchLinks[g] = max(f.switchLinks[g], count)
				f.switchVersion[g] = max(f.switchVersion[g], l.Version)
				viaSwitchLinks = true
			}
		}
	}

	// Per-link NVLink state of each GPU.
	direct := map[[2]int]int{}
	nvSwitch := map[int]int{}
	anySwitchRemote := false
	for i, d := range b.devs {
		if d.gpu == nil {
			continue
		}
		for _, nl := range d.gpu.NVLinks {
			if !strings.EqualFold(strings.TrimSpace(nl.State), "active") {
				continue
			}
			if nl.SpeedGBps > 0 && (f.reported[i] == 0 || nl.SpeedGBps < f.reported[i]) {
				f.reported[i] = nl.SpeedGBps
			}
			rk := strings.ToLower(nl.RemoteKind)
			r := -1
			if nl.RemotePCI != "" {
				r = resolve(nl.RemotePCI)
			}
			switch {
			case rk == snapshot.KindNVSwitch || (rk == "" && nl.RemotePCI != "" && isSwitch(nl.RemotePCI)):
				nvSwitch[i]++
				anySwitchRemote = true
			case r >= 0 && r != i:
				direct[[2]int{i, r}]++
			default:
				f.unknownRemote[i]++
			}
		}
	}
	for k, n := range direct {
		back := direct[[2]int{k[1], k[0]}]
		p := pl(k[0], k[1])
		p.nvlink = max(p.nvlink, n, back)
	}
	for i, n := range nvSwitch {
		f.switchLinks[i] = max(f.switchLinks[i], n)
	}
	switch {
	case switches > 0:
		f.switchEvidence = fmt.Sprintf("the PCI tree lists %d NVSwitch(es)", switches)
	case anySwitchRemote:
		f.switchEvidence = "other NVLinks are reported to end at NVSwitches"
	case viaSwitchLinks:
		f.switchEvidence = "the link data says NVLink runs through NVSwitches"
	}
	b.fabric = f
}

// fabricCell is the NVLink or xGMI connection of a GPU pair from explicit
// link data.
func (b *builder) fabricCell(i, j int) (Cell, bool) {
	if b.m.Devices[i].Kind != KindGPU || b.m.Devices[j].Kind != KindGPU {
		return Cell{}, false
	}
	f := &b.fabric
	p := f.pairs[keyOf(i, j)]
	if p == nil {
		p = &pairLinks{}
	}
	direct := p.nvlink
	ea, eb := f.switchLinks[i], f.switchLinks[j]
	ua, ub := f.unknownRemote[i], f.unknownRemote[j]
	if f.switchEvidence != "" && (ua > 0 || ub > 0) && direct == 0 {
		ea, eb = ea+ua, eb+ub
		if ea > 0 && eb > 0 {
			b.note("NVLinks whose far ends are not reported are taken as links into the NVSwitch fabric because "+f.switchEvidence, b.pair(i, j))
		}
	} else if ua > 0 && ub > 0 && direct == 0 && ea == 0 && eb == 0 {
		b.note("GPUs have active NVLinks whose far ends are not reported and no NVSwitch is known; which GPUs they join is unknown", b.pair(i, j))
	}
	viaSwitch := p.viaSwitch
	switched := 0
	if ea > 0 && eb > 0 {
		switched = min(ea, eb)
		viaSwitch = true
		if ea != eb {
			b.note("GPUs reach the NVSwitch fabric with different numbers of active NVLinks; a pair is limited by the GPU with fewer", b.pair(i, j))
		}
	}
	if total := direct + switched; total > 0 {
		version := max(p.nvVersion, f.switchVersion[i], f.switchVersion[j])
		return b.nvlinkCell(i, j, total, version, viaSwitch, ""), true
	}
	if p.xgmiKnown {
		return b.xgmiCell(i, j, p, ""), true
	}
	return Cell{}, false
}

// nvlinkCell rates links bonded NVLinks between GPUs i and j.
func (b *builder) nvlinkCell(i, j, links, version int, viaSwitch bool, origin string) Cell {
	c := Cell{Class: fmt.Sprintf("NV%d", links), Kind: LinkNVLink, Links: links}
	gen := version
	if gen <= 0 {
		gen = b.modelGen(i, j, LinkNVLink)
	}
	rate := b.k.LinkGBpsUni(LinkNVLink, gen)
	reported := minPositive(b.fabric.reported[i], b.fabric.reported[j])
	var basis string
	switch {
	case rate > 0:
		basis = fmt.Sprintf("%d x NVLink%d at %s per link", links, gen, uni(rate))
		if reported > 0 && reported != rate {
			basis += fmt.Sprintf("; the driver reports %s per link", uni(reported))
		}
	case reported > 0:
		rate = reported
		basis = fmt.Sprintf("%d x NVLink at %s per link as the driver reports it; generation unknown", links, uni(rate))
	default:
		basis = fmt.Sprintf("%d NVLinks; NVLink generation unknown, so not rated", links)
	}
	if viaSwitch {
		basis += "; through NVSwitch"
	}
	if origin != "" {
		basis = origin + "; " + basis
	}
	c.Basis = basis
	c.GBpsUni = float64(links) * rate
	c.GBpsBidi = 2 * c.GBpsUni
	return c
}

// xgmiCell rates an xGMI connection.
func (b *builder) xgmiCell(i, j int, p *pairLinks, origin string) Cell {
	c := Cell{Class: ClassXGMI, Kind: LinkXGMI, Links: p.xgmi}
	links, counted := p.xgmi, true
	if links <= 0 {
		links, counted = 1, false
	}
	gen := p.xgmiVersion
	if gen <= 0 {
		gen = b.modelGen(i, j, LinkXGMI)
	}
	rate := b.k.LinkGBpsUni(LinkXGMI, gen)
	var basis string
	switch {
	case rate > 0:
		c.GBpsUni = float64(links) * rate
		basis = fmt.Sprintf("%d x xGMI gen%d at %s per link", links, gen, uni(rate))
		if !counted {
			basis += " (link count unknown, rated as one link)"
		}
	case p.xgmiStated > 0:
		c.GBpsUni = p.xgmiStated
		basis = fmt.Sprintf("xGMI at %s as the source states it; generation unknown", uni(p.xgmiStated))
	default:
		basis = "xGMI; generation unknown, so not rated"
	}
	if p.hops > 1 {
		basis += fmt.Sprintf("; indirect, %d hops", p.hops)
	}
	if origin != "" {
		basis = origin + "; " + basis
	}
	c.Basis = basis
	c.GBpsBidi = 2 * c.GBpsUni
	return c
}

// modelGen is the interconnect generation the knowledge base gives the
// GPUs' model, 0 when unknown or when the two GPUs disagree.
func (b *builder) modelGen(i, j int, kind string) int {
	gen := 0
	for _, x := range []int{i, j} {
		m := b.devs[x].model
		if m == nil || m.Interconnect != kind || m.InterconnectGen <= 0 {
			return 0
		}
		if gen != 0 && gen != m.InterconnectGen {
			return 0
		}
		gen = m.InterconnectGen
	}
	return gen
}

func minPositive(a, b float64) float64 {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	default:
		return min(a, b)
	}
}
