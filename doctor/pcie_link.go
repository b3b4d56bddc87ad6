package doctor

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "pcie-link",
		IDs:  []string{"pcie-link-downtrained"},
		Doc:  "PCIe links trained below what both ends support: width always, generation only while the GPU is busy.",
		Run:  checkPCIeLink,
	})
}

const refPCIeIdle = "nvidia-smi documentation: current link generation and width may be reduced when the GPU is not in use; Linux drivers/pci/pci.h for lane rates"

func checkPCIeLink(in *Input) []Finding {
	s := in.Snapshot
	var out []Finding
	gpuAddr := map[string]bool{}
	for _, g := range gpus(s) {
		if g.PCIAddress != "" {
			gpuAddr[g.PCIAddress] = true
		}
		if f, ok := gpuLinkFinding(in, g); ok {
			out = append(out, f)
		}
	}
	out = append(out, otherLinkFindings(in, gpuAddr)...)
	return out
}

// slotMaxGen is the best generation both the card and the slot support: the
// card's maximum, lowered to the host's when the tool reports the host side.
func slotMaxGen(l *snapshot.PCIeLink) int {
	g := l.MaxGen
	if l.HostMaxGen > 0 && (g == 0 || l.HostMaxGen < g) {
		g = l.HostMaxGen
	}
	return g
}

func gpuLinkFinding(in *Input, g *snapshot.GPU) (Finding, bool) {
	l := g.PCIe
	if l == nil {
		return Finding{}, false
	}
	act, why := gpuActivity(g)
	best := slotMaxGen(l)
	// The port right above the GPU caps what it can train to: a Gen4 card
	// under a Gen3 port runs Gen3 by design (pcie-upstream-bottleneck
	// reports the port).
	if len(g.Upstream) > 0 {
		if up := pciIndex(in.Snapshot)[g.Upstream[0]]; up != nil && up.Link != nil && up.Link.MaxGen > 0 && (best == 0 || up.Link.MaxGen < best) {
			best = up.Link.MaxGen
		}
	}
	widthLow := l.CurrentWidth > 0 && l.MaxWidth > 0 && l.CurrentWidth < l.MaxWidth
	genLow := l.CurrentGen > 0 && best > 0 && l.CurrentGen < best
	if !widthLow && !genLow {
		return Finding{}, false
	}
	rated := in.KB.PCIeGBpsUni(best, l.MaxWidth)
	nowGen := l.CurrentGen
	if genLow && act != activityBusy {
		// An idle GPU lowers its generation to save power: only the width
		// can be judged now, at the generation it would train to.
		nowGen = best
	}
	now := in.KB.PCIeGBpsUni(nowGen, l.CurrentWidth)
	ev := []string{
		fmt.Sprintf("link now Gen%d x%d; card max Gen%d x%d%s", l.CurrentGen, l.CurrentWidth, l.MaxGen, l.MaxWidth, hostMax(l)),
		fmt.Sprintf("GPU activity: %s (%s)", act, why),
	}
	f := Finding{
		ID:        "pcie-link-downtrained",
		Devices:   []string{g.PCIAddress},
		Evidence:  ev,
		Reference: refPCIeIdle,
	}
	if g.PCIAddress == "" {
		f.Devices = nil
	}
	switch {
	case widthLow:
		f.Severity = Warning
		f.Title = fmt.Sprintf("%s: PCIe link runs x%d, card and slot support x%d", gpuName(g), l.CurrentWidth, l.MaxWidth)
		if genLow && act != activityBusy {
			f.Evidence = append(f.Evidence, fmt.Sprintf("Gen%d of Gen%d is the idle power-saving state, not a fault; the width is not lowered for power saving", l.CurrentGen, best))
		}
		f.Remedy = "Reseat the card, check the slot is wired x16 (some slots share lanes with M.2 or another slot), replace the riser or cable, and check BIOS bifurcation settings; on a cloud VM ask the provider how the slot is wired."
	case genLow && act == activityBusy:
		f.Severity = Warning
		f.Title = fmt.Sprintf("%s: PCIe link runs Gen%d x%d under load, card and slot support Gen%d x%d", gpuName(g), l.CurrentGen, l.CurrentWidth, best, l.MaxWidth)
		f.Remedy = "Check BIOS PCIe speed settings (Auto or the highest generation), reseat the card, replace risers or retimer cables; a link that trains low under load often has signal-integrity problems."
	case genLow && act == activityUnknown && l.CurrentGen == 1 && !widthLow:
		// Gen1 at full width is the state an idle GPU parks its link in;
		// a source without activity (lspci) cannot say more.
		return Finding{}, false
	case genLow && act == activityUnknown:
		f.Severity = Info
		f.Title = fmt.Sprintf("%s: PCIe link at Gen%d of Gen%d, GPU activity unknown", gpuName(g), l.CurrentGen, best)
		f.Remedy = "GPUs lower their link generation when idle; read the link again while the GPU runs a job (kiln doctor during a job, or nvidia-smi -q -d PCIE) to tell power saving from a fault."
	default:
		return Finding{}, false
	}
	if rated > 0 && now > 0 {
		share := 100 * now / rated
		f.Impact = fmt.Sprintf("host transfers at %s%% of rated bandwidth: %s GB/s (uni) instead of %s GB/s (uni)", fmtFloat(share), fmtFloat(now), fmtFloat(rated))
		f.ImpactPercent = pct(100 - share)
	} else {
		f.Impact = "host-to-GPU transfers (data loading, checkpoints, NCCL over PCIe) run slower than the card is rated for"
	}
	return f, true
}

func hostMax(l *snapshot.PCIeLink) string {
	if l.HostMaxGen > 0 {
		return fmt.Sprintf("; host max Gen%d", l.HostMaxGen)
	}
	return ""
}

// otherLinkFindings looks at PCIe functions that are not GPUs (NICs, NVMe,
// bridges). A port whose link is exactly what the device below it supports
// is correct, not degraded: a Gen4 NVMe drive behind a Gen5 switch port
// trains Gen4. Such ports are reported only when they are CPU root ports
// that strand lanes (information, not a fault).
func otherLinkFindings(in *Input, gpuAddr map[string]bool) []Finding {
	s := in.Snapshot
	children := map[string][]*snapshot.PCIDevice{}
	byAddr := map[string]*snapshot.PCIDevice{}
	for i := range s.PCI {
		d := &s.PCI[i]
		byAddr[d.Address] = d
		if d.Parent != "" {
			children[d.Parent] = append(children[d.Parent], d)
		}
	}
	var out []Finding
	for i := range s.PCI {
		d := &s.PCI[i]
		if gpuAddr[d.Address] || d.Link == nil {
			continue
		}
		l := d.Link
		if l.CurrentWidth == 0 {
			// x0: no link trained (an empty slot, a port in D3); there is
			// nothing below it to be slow.
			continue
		}
		genLow := l.CurrentGen > 0 && l.MaxGen > 0 && l.CurrentGen < l.MaxGen
		widthLow := l.CurrentWidth > 0 && l.MaxWidth > 0 && l.CurrentWidth < l.MaxWidth
		if !genLow && !widthLow {
			continue
		}
		isPort := d.Kind == snapshot.KindRootPort || d.Kind == snapshot.KindSwitchDown || d.Kind == snapshot.KindBridge
		if isPort && hasGPUBelow(children[d.Address], gpuAddr) {
			// The port's link is the GPU's own link, judged (with the
			// GPU's activity) by gpuLinkFinding.
			continue
		}
		var limiter *snapshot.PCIDevice
		if isPort {
			limiter = endpointLimit(l, children[d.Address])
			if limiter != nil && d.Kind != snapshot.KindRootPort {
				continue // correct result: the device below is slower
			}
		}
		if d.Kind == snapshot.KindSwitchUp {
			// An upstream port's link is judged from the port above it.
			continue
		}
		f := Finding{
			ID:       "pcie-link-downtrained",
			Severity: Info,
			Devices:  []string{d.Address},
			Evidence: []string{fmt.Sprintf("%s %s: link Gen%d x%d, capability Gen%d x%d", d.Kind, d.Address, l.CurrentGen, l.CurrentWidth, l.MaxGen, l.MaxWidth)},
		}
		name := strings.TrimSpace(d.Name)
		if name == "" {
			name = d.Kind
		}
		slot := (*snapshot.PCIDevice)(nil)
		if !isPort && d.Parent != "" {
			if up := byAddr[d.Parent]; up != nil && up.Link != nil && slotExplains(up.Link, l) {
				slot = up
			}
		}
		switch {
		case slot != nil:
			f.Title = fmt.Sprintf("%s (%s) runs Gen%d x%d of Gen%d x%d: the port above (%s) supports Gen%d x%d", name, d.Address, l.CurrentGen, l.CurrentWidth, l.MaxGen, l.MaxWidth, slot.Address, slot.Link.MaxGen, slot.Link.MaxWidth)
			f.Impact = "the slot, not the card, sets this link; not a fault"
			f.Remedy = "Move the card to a wider or faster slot if its throughput matters."
		case limiter != nil:
			f.Title = fmt.Sprintf("root port %s runs Gen%d x%d of Gen%d x%d: the device below (%s) supports no more", d.Address, l.CurrentGen, l.CurrentWidth, l.MaxGen, l.MaxWidth, limiter.Address)
			f.Evidence = append(f.Evidence, fmt.Sprintf("device below %s: capability Gen%d x%d", limiter.Address, limiter.Link.MaxGen, limiter.Link.MaxWidth))
			f.Impact = "not a fault: the slot's spare lanes are unused; a GPU would get the full link here"
			f.Remedy = "Nothing to fix for this device; keep this slot in mind when placing a GPU or NIC that needs the lanes."
		default:
			f.Title = fmt.Sprintf("%s (%s) runs Gen%d x%d of Gen%d x%d", name, d.Address, l.CurrentGen, l.CurrentWidth, l.MaxGen, l.MaxWidth)
			f.Impact = "non-GPU device below its rated link; low priority unless it is a NIC or drive that feeds the GPUs"
			f.Remedy = "Check the slot wiring and the card seating when this device's throughput matters."
			// A drive, or a NIC fast enough to feed GPUs (rated Gen3 x8 or
			// more; not a 1 GbE management port), matters to the jobs.
			if d.Kind == snapshot.KindNVMe || (d.Kind == snapshot.KindNIC && in.KB.PCIeGBpsUni(l.MaxGen, l.MaxWidth) >= 7.8) {
				f.Severity = Warning
				f.Impact = "a NIC or drive that feeds GPUs runs below its rated link: data loading or GPUDirect traffic slows down"
			}
		}
		if r := in.KB.PCIeGBpsUni(l.MaxGen, l.MaxWidth); r > 0 {
			now := in.KB.PCIeGBpsUni(l.CurrentGen, l.CurrentWidth)
			f.ImpactPercent = pct(100 - 100*now/r)
		}
		out = append(out, f)
	}
	return out
}

// endpointLimit returns the device below a port whose own capability
// explains the port's link state, or nil.
func endpointLimit(l *snapshot.PCIeLink, below []*snapshot.PCIDevice) *snapshot.PCIDevice {
	for _, c := range below {
		if c.Link == nil {
			continue
		}
		cl := c.Link
		genOK := l.CurrentGen == 0 || cl.MaxGen == 0 || l.CurrentGen >= min(l.MaxGen, cl.MaxGen)
		widthOK := l.CurrentWidth == 0 || cl.MaxWidth == 0 || l.CurrentWidth >= min(l.MaxWidth, cl.MaxWidth)
		if genOK && widthOK {
			return c
		}
	}
	return nil
}

// slotExplains reports whether the port above a device caps the device's
// link at what it runs now.
func slotExplains(port, dev *snapshot.PCIeLink) bool {
	if dev.CurrentWidth < dev.MaxWidth && (port.MaxWidth == 0 || port.MaxWidth > dev.CurrentWidth) {
		return false
	}
	if dev.CurrentGen < dev.MaxGen && (port.MaxGen == 0 || port.MaxGen > dev.CurrentGen) {
		return false
	}
	return true
}

func hasGPUBelow(below []*snapshot.PCIDevice, gpuAddr map[string]bool) bool {
	for _, c := range below {
		if gpuAddr[c.Address] || c.Kind == snapshot.KindGPU {
			return true
		}
	}
	return false
}
