package topo

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// chainInfo is a device's path up the PCIe tree.
type chainInfo struct {
	// path starts at the device and ends at the topmost bridge known.
	path []string
	// topIsRoot is true when the top of path is a root port.
	topIsRoot bool
	// hostBridge is the host bridge above the root port when the tree names it.
	hostBridge string
}

const maxDepth = 64

func (b *builder) kindOf(addr string) string {
	if p := b.pci[addr]; p != nil {
		return p.Kind
	}
	return ""
}

// chain walks from device i up to its root port, following the PCI tree's
// parents and, where the tree has none, the GPU's Upstream list.
func (b *builder) chain(i int) chainInfo {
	if c, ok := b.chains[i]; ok {
		return c
	}
	c := b.walk(i)
	b.chains[i] = c
	return c
}

func (b *builder) walk(i int) chainInfo {
	d := b.devs[i]
	if d.addr == "" {
		return chainInfo{}
	}
	full := append([]string{d.addr}, d.hint...)
	c := chainInfo{path: []string{d.addr}}
	seen := map[string]bool{d.addr: true}
	cur := d.addr
	for len(c.path) < maxDepth {
		next := ""
		if p := b.pci[cur]; p != nil {
			next = canon(p.Parent)
		}
		if next == "" {
			for x := 0; x+1 < len(full); x++ {
				if full[x] == cur {
					next = full[x+1]
					break
				}
			}
		}
		if next == "" || seen[next] {
			break
		}
		if b.kindOf(next) == snapshot.KindHostBridge {
			c.hostBridge = next
			break
		}
		seen[next] = true
		c.path = append(c.path, next)
		cur = next
	}
	top := c.path[len(c.path)-1]
	switch b.kindOf(top) {
	case snapshot.KindRootPort:
		c.topIsRoot = len(c.path) > 1
	case "", snapshot.KindBridge, snapshot.KindOther:
		// GPU.Upstream ends with the root port.
		c.topIsRoot = len(d.hint) > 0 && top == d.hint[len(d.hint)-1]
	}
	return c
}

// rootComplex names the host bridge above a root port: the one the tree
// names, else the root port's domain and bus (root ports on one root bus
// share a host bridge).
func rootComplex(c chainInfo) string {
	if c.hostBridge != "" {
		return c.hostBridge
	}
	top := c.path[len(c.path)-1]
	if i := strings.LastIndexByte(top, ':'); i > 0 {
		return top[:i]
	}
	return top
}

// pcieCell classifies a pair from the PCIe tree. When the tree cannot
// decide, it returns false and the reason.
func (b *builder) pcieCell(i, j int) (Cell, bool, string) {
	A, B := b.chain(i), b.chain(j)
	if len(A.path) < 2 || len(B.path) < 2 {
		return Cell{}, false, ""
	}
	posB := map[string]int{}
	for m := 1; m < len(B.path); m++ {
		posB[B.path[m]] = m
	}
	k, m := -1, -1
	for x := 1; x < len(A.path); x++ {
		if y, ok := posB[A.path[x]]; ok {
			k, m = x, y
			break
		}
	}
	if k > 0 {
		// Below one root port (functions of one device, or devices
		// behind switches): PIX or PXB by the bridges crossed.
		class, route := ClassPIX, "through one PCIe switch or bridge"
		if n := b.bridgeUnits(A.path[1:k+1], B.path[1:m+1]); n > 1 {
			class, route = ClassPXB, fmt.Sprintf("through %d PCIe switches or bridges", n)
		}
		hops := append(b.hops(i, A.path[:k+1]), b.hops(j, B.path[:m+1])...)
		return b.rate(class, route, hops), true, ""
	}
	if !A.topIsRoot || !B.topIsRoot {
		return Cell{}, false, "PCIe path incomplete: the topmost bridge found is not a root port"
	}
	hops := append(b.hops(i, A.path), b.hops(j, B.path)...)
	if rootComplex(A) == rootComplex(B) {
		return b.rate(ClassPHB, "through host bridge "+rootComplex(A), hops), true, ""
	}
	na, nb := b.numaOf(i), b.numaOf(j)
	switch {
	case na != nil && nb != nil && *na == *nb:
		return b.rate(ClassNode, fmt.Sprintf("across host bridges within NUMA node %d; the CPU's internal fabric is not rated", *na), hops), true, ""
	case na != nil && nb != nil:
		return b.rate(ClassSys, fmt.Sprintf("across NUMA nodes %d and %d; the inter-socket link is not rated", *na, *nb), hops), true, ""
	case len(b.s.Host.NUMANodes) == 1:
		return b.rate(ClassNode, "across host bridges of the host's single NUMA node; the CPU's internal fabric is not rated", hops), true, ""
	}
	return Cell{}, false, "different PCIe host bridges, but the NUMA node of a device is unknown, so NODE and SYS cannot be told apart"
}

// bridgeUnits counts the PCIe switches and bridges a path traverses below
// its common ancestor. A switch is an upstream port with its downstream
// ports and counts once; a bridge of unknown kind counts once.
func (b *builder) bridgeUnits(sideA, sideB []string) int {
	in := map[string]bool{}
	parent := map[string]string{}
	for _, side := range [][]string{sideA, sideB} {
		for x, e := range side {
			in[e] = true
			if x+1 < len(side) {
				parent[e] = side[x+1]
			}
		}
	}
	n := 0
	for e := range in {
		if b.kindOf(e) == snapshot.KindSwitchDown && in[parent[e]] && b.kindOf(parent[e]) == snapshot.KindSwitchUp {
			continue
		}
		n++
	}
	return n
}

// hop is one physical PCIe link: child's upstream link.
type hop struct {
	child      string
	childLink  snapshot.PCIeLink
	parentLink snapshot.PCIeLink
	hasParent  bool
}

// hops lists the physical links from the device at the bottom of path up
// to its last element. Links inside a switch (downstream port to upstream
// port) are not physical and are skipped.
func (b *builder) hops(dev int, path []string) []hop {
	var out []hop
	for x := 0; x+1 < len(path); x++ {
		child, parent := path[x], path[x+1]
		if b.kindOf(child) == snapshot.KindSwitchDown {
			continue
		}
		h := hop{child: child}
		if x == 0 {
			h.childLink = b.endpointLink(dev)
		} else {
			h.childLink = b.linkOf(child)
		}
		switch b.kindOf(parent) {
		case snapshot.KindRootPort, snapshot.KindSwitchDown, "":
			// A downstream-facing port's link registers describe this link.
			h.parentLink = b.linkOf(parent)
			h.hasParent = true
		}
		out = append(out, h)
	}
	return out
}

func (b *builder) linkOf(addr string) snapshot.PCIeLink {
	if p := b.pci[addr]; p != nil && p.Link != nil {
		return *p.Link
	}
	return snapshot.PCIeLink{}
}

// endpointLink is a device's own link: the PCI tree's view, completed by
// what the GPU driver reports.
func (b *builder) endpointLink(i int) snapshot.PCIeLink {
	d := b.devs[i]
	l := snapshot.PCIeLink{}
	if d.addr != "" {
		l = b.linkOf(d.addr)
	}
	if d.gpu == nil {
		return l
	}
	if g := d.gpu.PCIe; g != nil {
		if l.MaxGen == 0 {
			l.MaxGen = g.MaxGen
		}
		if l.MaxWidth == 0 {
			l.MaxWidth = g.MaxWidth
		}
		if l.CurrentGen == 0 {
			l.CurrentGen = g.CurrentGen
		}
		if l.CurrentWidth == 0 {
			l.CurrentWidth = g.CurrentWidth
		}
		if l.HostMaxGen == 0 {
			l.HostMaxGen = g.HostMaxGen
		}
	}
	return l
}

func minPosInt(a, b int) int {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	default:
		return min(a, b)
	}
}

// rate finds the slowest hop of a path: its rated bandwidth from the
// capabilities of both ends, and its bandwidth in the current link state.
func (b *builder) rate(class, route string, hops []hop) Cell {
	c := Cell{Class: class, Kind: LinkPCIe}
	rated, best, bestGen, bestWidth := 0, 0.0, 0, 0
	nowBest, nowGen, nowWidth := 0.0, 0, 0
	for _, h := range hops {
		capGen := minPosInt(h.childLink.MaxGen, h.childLink.HostMaxGen)
		capW := h.childLink.MaxWidth
		curGen, curW := h.childLink.CurrentGen, h.childLink.CurrentWidth
		if h.hasParent {
			capGen = minPosInt(capGen, h.parentLink.MaxGen)
			capW = minPosInt(capW, h.parentLink.MaxWidth)
			curGen = minPosInt(curGen, h.parentLink.CurrentGen)
			curW = minPosInt(curW, h.parentLink.CurrentWidth)
		}
		if v := b.k.PCIeGBpsUni(capGen, capW); capGen > 0 && capW > 0 && v > 0 {
			rated++
			if best == 0 || v < best {
				best, bestGen, bestWidth = v, capGen, capW
				c.Bottleneck = h.child
			}
		}
		if v := b.k.PCIeGBpsUni(curGen, curW); curGen > 0 && curW > 0 && v > 0 {
			if nowBest == 0 || v < nowBest {
				nowBest, nowGen, nowWidth = v, curGen, curW
			}
		}
	}
	if rated == 0 {
		c.Basis = fmt.Sprintf("PCIe, %s; link capabilities unknown, so not rated", route)
		c.Bottleneck = ""
		return c
	}
	c.GBpsUni = best
	c.GBpsBidi = 2 * best
	c.NowGBpsUni = nowBest
	c.Basis = fmt.Sprintf("PCIe Gen%d x%d at the slowest of %d links (%s), %s", bestGen, bestWidth, len(hops), c.Bottleneck, route)
	if rated < len(hops) {
		c.Basis += fmt.Sprintf("; only %d of %d links have known capabilities", rated, len(hops))
	}
	if nowBest > 0 && nowBest < best {
		c.Basis += fmt.Sprintf("; now Gen%d x%d, %s (links train down when idle)", nowGen, nowWidth, uni(nowBest))
	}
	return c
}
