package doctor

import (
	"fmt"
	"slices"
	"strings"

	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

func init() {
	register(Check{
		Name: "bandwidth",
		IDs:  []string{"bandwidth-below-rating"},
		Doc:  "A link measured by kiln bench (--record) runs below the share of its rating it is judged against, with the likely causes.",
		Run:  checkBandwidth,
	})
}

// defaultBandwidthThreshold is the share of a rating (percent) below which
// a measured figure is reported when the record does not say.
const defaultBandwidthThreshold = 70

// Test names of kiln bench records (gpubench's constants; the doctor does
// not import the benchmark).
const (
	benchH2D        = "h2d"
	benchD2H        = "d2h"
	benchDevice     = "device"
	benchP2P        = "p2p"
	benchP2PBidi    = "p2p-bidi"
	benchP2PLatency = "p2p-latency"
)

// checkBandwidth reports links whose measured figures fall below the
// threshold share of their rating: one finding per link (a GPU's host
// link, its memory, a GPU pair, a collective's GPUs), with every figure
// under the threshold as evidence and the causes the Snapshot points at.
// Figures kept for reference (pageable host memory, latency), failed tests
// and figures without a rating are never reported.
func checkBandwidth(in *Input) []Finding {
	ms := in.Snapshot.Measurements
	if ms == nil {
		return nil
	}
	threshold := ms.ThresholdPercent
	if threshold <= 0 {
		threshold = defaultBandwidthThreshold
	}
	type group struct {
		kind string
		devs []string
		low  []snapshot.Measurement
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, m := range ms.Results {
		if !belowRating(m, threshold) {
			continue
		}
		kind, need := "", 1
		switch m.Test {
		case benchH2D, benchD2H:
			kind = "host"
		case benchDevice:
			kind = "memory"
		case benchP2P, benchP2PBidi:
			kind, need = "p2p", 2
		case "all-reduce", "all-gather", "reduce-scatter":
			kind, need = "collective", 2
		default:
			continue
		}
		if len(m.Devices) < need {
			// A figure that names no link cannot be reported on one.
			continue
		}
		devs := slices.Clone(m.Devices)
		if kind == "p2p" || kind == "collective" {
			slices.Sort(devs)
		}
		key := kind + " " + strings.Join(devs, ",")
		g := byKey[key]
		if g == nil {
			g = &group{kind: kind, devs: devs}
			byKey[key] = g
			groups = append(groups, g)
		}
		g.low = append(g.low, m)
	}
	var out []Finding
	for _, g := range groups {
		out = append(out, bandwidthFinding(in, g.kind, g.devs, g.low, threshold))
	}
	return out
}

// belowRating recomputes a figure's verdict from its numbers, so a record
// whose verdicts were edited or judged at another threshold is read right.
func belowRating(m snapshot.Measurement, threshold float64) bool {
	if m.Error != "" || m.RatedGBps <= 0 || m.MedianGBps <= 0 {
		return false
	}
	if m.Memory == "pageable" || m.Test == benchP2PLatency || m.Verdict == snapshot.VerdictNotJudged {
		return false
	}
	return 100*m.MedianGBps/m.RatedGBps < threshold
}

// gbpsLabel is a bandwidth with its unit and what it counts.
func gbpsLabel(v float64, direction string) string {
	switch direction {
	case "bidi":
		return fmtFloat(v) + " GB/s (bidi)"
	case "read+write":
		return fmtFloat(v) + " GB/s (read+write)"
	case "bus":
		return fmtFloat(v) + " GB/s (bus)"
	}
	return fmtFloat(v) + " GB/s (uni)"
}

// cause is a likely reason for a slow link and what to do about it.
type cause struct{ why, fix string }

func bandwidthFinding(in *Input, kind string, devs []string, low []snapshot.Measurement, threshold float64) Finding {
	s := in.Snapshot
	worst := low[0]
	for _, m := range low[1:] {
		if m.MedianGBps/m.RatedGBps < worst.MedianGBps/worst.RatedGBps {
			worst = m
		}
	}
	ratio := 100 * worst.MedianGBps / worst.RatedGBps
	names := make([]string, len(devs))
	var gs []*snapshot.GPU
	for i, d := range devs {
		names[i] = d
		if g := s.GPUByPCI(d); g != nil {
			names[i] = gpuName(g)
			gs = append(gs, g)
		}
	}
	var what string
	var causes []cause
	switch kind {
	case "host":
		what = "host link of " + names[0]
		if len(gs) > 0 {
			causes = hostCauses(in, gs[0], low)
		}
	case "memory":
		what = "memory of " + names[0]
		if len(gs) > 0 {
			causes = memoryCauses(gs[0])
		}
	case "p2p":
		what = "peer-to-peer link " + strings.Join(names, " - ")
		if len(gs) == 2 {
			causes = p2pCauses(in, gs[0], gs[1], low)
		}
	default:
		what = fmt.Sprintf("%s over %d GPUs", worst.Test, len(devs))
		causes = collectiveCauses(in, gs)
	}
	var ev []string
	for _, m := range low {
		ev = append(ev, measurementEvidence(s, m))
	}
	if len(causes) == 0 {
		causes = append(causes, cause{
			why: "nothing kiln read explains it: the links are at full width and host memory was on the GPU's NUMA node",
			fix: "Check what kiln cannot read: the IOMMU mode (iommu=pt on the kernel command line spares DMA a translation), the BIOS's PCIe settings (maximum payload size, relaxed ordering), and other work on the node during the run; then run kiln bench again.",
		})
	}
	var fixes []string
	for _, c := range causes {
		ev = append(ev, "likely cause: "+c.why)
		if c.fix != "" && !slices.Contains(fixes, c.fix) {
			fixes = append(fixes, c.fix)
		}
	}
	lost := worst.RatedGBps - worst.MedianGBps
	f := Finding{
		ID:       "bandwidth-below-rating",
		Severity: Warning,
		Title: fmt.Sprintf("%s measured at %s%% of its rating (%s %s of %s)", what, fmtFloat(ratio), worst.Test,
			gbpsLabel(worst.MedianGBps, worst.Direction), gbpsLabel(worst.RatedGBps, worst.Direction)),
		Devices:       devs,
		Evidence:      ev,
		Impact:        fmt.Sprintf("work over this link gets %s%% of what it is rated for, %s less; kiln bench judges below %s%% a fault", fmtFloat(ratio), gbpsLabel(lost, worst.Direction), fmtFloat(threshold)),
		ImpactPercent: pct(100 - ratio),
		Remedy:        strings.Join(fixes, " "),
		Reference:     "kiln bench --help (what each test measures and how it is rated)",
	}
	return f
}

// measurementEvidence is one figure in words.
func measurementEvidence(s *snapshot.Snapshot, m snapshot.Measurement) string {
	var b strings.Builder
	b.WriteString(m.Test)
	if m.Memory != "" {
		b.WriteString(" " + m.Memory)
	}
	if m.HostNUMANode != nil {
		fmt.Fprintf(&b, " from NUMA node %d", *m.HostNUMANode)
		if m.HostLocal != nil && *m.HostLocal {
			b.WriteString(" (the GPU's own)")
		} else if m.HostLocal != nil {
			b.WriteString(" (not the GPU's)")
		}
	}
	if m.Link != "" {
		b.WriteString(", " + m.Link)
	}
	fmt.Fprintf(&b, ": %s, median of %d", gbpsLabel(m.MedianGBps, m.Direction), m.Repetitions)
	if m.MinGBps > 0 && m.MaxGBps > 0 {
		fmt.Fprintf(&b, " (%s to %s)", fmtFloat(m.MinGBps), fmtFloat(m.MaxGBps))
	}
	fmt.Fprintf(&b, ", rated %s", gbpsLabel(m.RatedGBps, m.Direction))
	if m.RatedBasis != "" {
		b.WriteString(" (" + m.RatedBasis + ")")
	}
	fmt.Fprintf(&b, ": %s%%", fmtFloat(100*m.MedianGBps/m.RatedGBps))
	return b.String()
}

// linkOf is a device's own PCIe link as the Snapshot knows it.
func linkOf(s *snapshot.Snapshot, idx map[string]*snapshot.PCIDevice, g *snapshot.GPU) *snapshot.PCIeLink {
	if g.PCIe != nil && g.PCIe.MaxWidth > 0 {
		return g.PCIe
	}
	if d := idx[g.PCIAddress]; d != nil && d.Link != nil {
		return d.Link
	}
	return g.PCIe
}

// downtrained lists a GPU's links that run below what they can: its own
// (width, and generation with the idle caveat) and every bridge's on its
// path to the root port (width).
func downtrained(s *snapshot.Snapshot, g *snapshot.GPU) []cause {
	idx := pciIndex(s)
	var out []cause
	fix := "Reseat the card (and its riser or cable), check the slot's lane setting (bifurcation) in the BIOS, and look for AER errors on the link (kiln doctor reports them); a link that trains narrow again after a reseat points at the slot, the riser or the card."
	if l := linkOf(s, idx, g); l != nil {
		if l.CurrentWidth > 0 && l.MaxWidth > 0 && l.CurrentWidth < l.MaxWidth {
			out = append(out, cause{fmt.Sprintf("%s's link runs at x%d of x%d (downtrained)", gpuName(g), l.CurrentWidth, l.MaxWidth), fix})
		}
		if top := slotMaxGen(l); l.CurrentGen > 0 && top > 0 && l.CurrentGen < top {
			out = append(out, cause{
				fmt.Sprintf("%s's link read Gen%d of Gen%d when the node was read (a GPU at rest lowers it to save power; if it stays there under load the link is downtrained)", gpuName(g), l.CurrentGen, top),
				"Read the link while the GPU is busy (nvidia-smi -q -d PCIE, or lspci -vv, during kiln bench); if it stays low, set the slot to its full generation in the BIOS and reseat the card.",
			})
		}
	}
	for _, a := range g.Upstream {
		d := idx[a]
		if d == nil || d.Link == nil || onCardSwitch(d, g) {
			continue
		}
		if l := d.Link; l.CurrentWidth > 0 && l.MaxWidth > 0 && l.CurrentWidth < l.MaxWidth {
			out = append(out, cause{fmt.Sprintf("%s %s above %s runs at x%d of x%d", d.Kind, a, gpuName(g), l.CurrentWidth, l.MaxWidth), fix})
		}
	}
	return out
}

// behindSwitch names the PCIe switches on a GPU's path to the host (not a
// switch on the card itself) and how many GPUs share each.
func behindSwitch(s *snapshot.Snapshot, g *snapshot.GPU) []cause {
	idx := pciIndex(s)
	var out []cause
	for _, a := range g.Upstream {
		d := idx[a]
		if d == nil || d.Kind != snapshot.KindSwitchUp || onCardSwitch(d, g) {
			continue
		}
		n := 0
		for _, o := range s.GPUs {
			if slices.Contains(o.Upstream, a) {
				n++
			}
		}
		out = append(out, cause{
			fmt.Sprintf("the path crosses the PCIe switch at %s, shared by %d %s: its uplink caps every GPU below it that transfers at the same time, and a switch port set to a narrow mode caps even one", a, n, plural(n, "GPU", "GPUs")),
			"Run kiln bench while the node is otherwise idle; if one GPU alone is slow behind the switch, check the switch's port configuration and firmware with the server's vendor.",
		})
	}
	return out
}

// platformCauses are what the host tells about DMA: a virtual machine's
// IOMMU.
func platformCauses(s *snapshot.Snapshot) []cause {
	if v := s.Host.Virtualized; v != "" && !strings.EqualFold(v, "none") {
		return []cause{{
			fmt.Sprintf("the node is a virtual machine (%s): DMA goes through the hypervisor's IOMMU, which translates every transfer", v),
			"Back the guest's memory with huge pages and, where isolation allows, run the host's IOMMU in pass-through mode (iommu=pt); compare with the same GPU measured on bare metal.",
		}}
	}
	return nil
}

func hostCauses(in *Input, g *snapshot.GPU, low []snapshot.Measurement) []cause {
	s := in.Snapshot
	out := downtrained(s, g)
	remote, local := false, false
	for _, m := range low {
		if m.HostLocal != nil && !*m.HostLocal {
			remote = true
		}
		if m.HostLocal != nil && *m.HostLocal {
			local = true
		}
	}
	switch {
	case g.NUMANode == nil || *g.NUMANode < 0:
		out = append(out, cause{
			fmt.Sprintf("the platform reports no NUMA node for %s, so host memory was placed without regard to it and may have been on the far socket", gpuName(g)),
			"Turn on NUMA reporting in the BIOS (ACPI SRAT, NUMA per socket) so the GPU's node is known, and keep host buffers on the socket the GPU hangs from.",
		})
	case remote && !local:
		// Only the far node's figures are low: placement, not the link.
		why := fmt.Sprintf("host memory on another NUMA node than %s's (node %d): the copies crossed the inter-socket link; from the GPU's own node the link is within its rating", gpuName(g), *g.NUMANode)
		out = append(out, cause{why,
			"Keep host buffers and the threads that fill them on the GPU's NUMA node (numactl --cpunodebind/--membind, or the framework's CPU affinity settings); kiln inventory shows each GPU's node."})
	}
	out = append(out, behindSwitch(s, g)...)
	return append(out, platformCauses(s)...)
}

func memoryCauses(g *snapshot.GPU) []cause {
	var out []cause
	fix := "Find what holds the clocks down (power cap, thermal slowdown, application clocks set low; kiln doctor's thermal and power findings name them) and measure again when the GPU is otherwise idle."
	if c := g.Clocks; c != nil && c.MemoryMHz != nil && c.MaxMemoryMHz != nil && *c.MaxMemoryMHz > 0 && *c.MemoryMHz < 0.95**c.MaxMemoryMHz {
		out = append(out, cause{fmt.Sprintf("%s's memory clock read %s MHz of %s MHz", gpuName(g), fmtFloat(*c.MemoryMHz), fmtFloat(*c.MaxMemoryMHz)), fix})
	}
	var active []string
	for _, t := range g.Throttle {
		if t.Active && t.Name != "idle" {
			active = append(active, t.Name)
		}
	}
	if len(active) > 0 {
		out = append(out, cause{fmt.Sprintf("clock events active on %s: %s", gpuName(g), strings.Join(active, ", ")), fix})
	}
	if g.Processes > 0 {
		out = append(out, cause{fmt.Sprintf("%d other %s on %s when the node was read", g.Processes, plural(g.Processes, "process was", "processes were"), gpuName(g)),
			"Measure on an idle GPU: other work shares the memory bandwidth."})
	}
	return out
}

// acsOnPath lists the ports with ACS redirect on between two GPUs that
// share a PCIe switch, below it. GPUs that share none meet at the root
// complex whatever ACS says.
func acsOnPath(s *snapshot.Snapshot, a, b *snapshot.GPU) []string {
	idx := pciIndex(s)
	var ports []string
	lca := commonAncestor(a.Upstream, b.Upstream)
	if lca < 0 {
		return nil
	}
	for _, g := range []*snapshot.GPU{a, b} {
		for _, p := range below(g.Upstream, a.Upstream[lca]) {
			d := idx[p]
			if d == nil || d.ACS == nil || !(d.ACS.ReqRedir || d.ACS.CmpltRedir) || slices.Contains(ports, p) {
				continue
			}
			if d.Kind == snapshot.KindSwitchDown || d.Kind == snapshot.KindRootPort {
				ports = append(ports, p)
			}
		}
	}
	return ports
}

const acsFix = "Disable ACS redirect on these ports (the BIOS's ACS or PCIe ACS control option, or setpci at boot) when the GPUs are not passed through to separate VMs."

// pairCell is the matrix cell between two GPUs, if the matrix has both.
func pairCell(m *topo.Matrix, a, b string) (topo.Cell, bool) {
	if m == nil {
		return topo.Cell{}, false
	}
	ia, ib := -1, -1
	for i, d := range m.Devices {
		if d.PCI == a {
			ia = i
		}
		if d.PCI == b {
			ib = i
		}
	}
	if ia < 0 || ib < 0 {
		return topo.Cell{}, false
	}
	return m.Cells[ia][ib], true
}

func classCause(c topo.Cell) (cause, bool) {
	switch c.Class {
	case topo.ClassSys:
		return cause{"the pair is SYS: peer traffic crosses the inter-socket link, which kiln does not rate and which is often slower than the PCIe links",
			"Keep peer-to-peer traffic between GPUs of one socket (under one switch, or on NVLink); place multi-GPU jobs by kiln topo's classes."}, true
	case topo.ClassNode, topo.ClassPHB:
		return cause{fmt.Sprintf("the pair is %s: peer traffic goes through the CPU's host bridges, many of which forward it below the PCIe rate", c.Class),
			"Keep peer-to-peer traffic between GPUs under one PCIe switch or on NVLink where the server has them."}, true
	}
	return cause{}, false
}

// nvlinkDown names the inactive NVLinks of a GPU.
func nvlinkDown(g *snapshot.GPU) (cause, bool) {
	down := 0
	for _, l := range g.NVLinks {
		if !strings.EqualFold(l.State, "active") {
			down++
		}
	}
	if down == 0 {
		return cause{}, false
	}
	return cause{fmt.Sprintf("%s has %d of %d NVLinks not active", gpuName(g), down, len(g.NVLinks)),
		"Check nvidia-smi nvlink -s; reset the GPU, reseat an NVLink bridge, and on NVSwitch systems check the fabric manager."}, true
}

func p2pCauses(in *Input, a, b *snapshot.GPU, low []snapshot.Measurement) []cause {
	s := in.Snapshot
	var out []cause
	for _, m := range low {
		if m.PeerAccess != nil && !*m.PeerAccess {
			out = append(out, cause{"the driver gave no direct peer access between these GPUs: the copies were staged through host memory",
				"Peer access needs a path the driver allows: GeForce cards have it off, some platforms refuse it across sockets, and ACS redirect or an IOMMU in translation mode block it; nvidia-smi topo -p2p r shows what the driver allows."})
			break
		}
	}
	if ports := acsOnPath(s, a, b); len(ports) > 0 {
		out = append(out, cause{fmt.Sprintf("ACS redirect is on at %s: peer traffic is sent up to the root complex instead of across the switch (P2P disabled by ACS)", strings.Join(ports, ", ")), acsFix})
	}
	if c, ok := pairCell(in.Topo, a.PCIAddress, b.PCIAddress); ok {
		if cc, ok := classCause(c); ok {
			out = append(out, cc)
		}
		if c.Kind == topo.LinkNVLink {
			for _, g := range []*snapshot.GPU{a, b} {
				if cc, ok := nvlinkDown(g); ok {
					out = append(out, cc)
				}
			}
		}
		if c.Kind == topo.LinkPCIe {
			out = append(out, downtrained(s, a)...)
			out = append(out, downtrained(s, b)...)
		}
	}
	return append(out, platformCauses(s)...)
}

func collectiveCauses(in *Input, gs []*snapshot.GPU) []cause {
	s := in.Snapshot
	var out []cause
	slowest, found := topo.Cell{}, false
	var ports []string
	noPeer := 0
	for x := range gs {
		for y := x + 1; y < len(gs); y++ {
			if c, ok := pairCell(in.Topo, gs[x].PCIAddress, gs[y].PCIAddress); ok && (!found || c.Rank() > slowest.Rank()) {
				slowest, found = c, true
			}
			for _, p := range acsOnPath(s, gs[x], gs[y]) {
				if !slices.Contains(ports, p) {
					ports = append(ports, p)
				}
			}
		}
	}
	if s.Measurements != nil {
		for _, m := range s.Measurements.Results {
			if (m.Test == benchP2P || m.Test == benchP2PBidi) && m.PeerAccess != nil && !*m.PeerAccess {
				noPeer++
			}
		}
	}
	if noPeer > 0 {
		out = append(out, cause{fmt.Sprintf("%d peer-to-peer %s ran without direct peer access: the library falls back to host memory for those pairs", noPeer, plural(noPeer, "test", "tests")),
			"Run with NCCL_DEBUG=INFO to see the transport chosen per pair (P2P, SHM, NET), and make peer access available (see the peer-to-peer findings)."})
	}
	if len(ports) > 0 {
		out = append(out, cause{fmt.Sprintf("ACS redirect is on at %s, between GPUs of the collective (P2P disabled by ACS)", strings.Join(ports, ", ")), acsFix})
	}
	if found {
		if cc, ok := classCause(slowest); ok {
			out = append(out, cc)
		}
	}
	for _, g := range gs {
		if cc, ok := nvlinkDown(g); ok {
			out = append(out, cc)
		}
	}
	return append(out, platformCauses(s)...)
}
