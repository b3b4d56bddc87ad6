package doctor

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "pcie-upstream",
		IDs:  []string{"pcie-upstream-bottleneck"},
		Doc:  "A switch or root port on a GPU's path to the CPU is rated or trained slower than the GPU's own link.",
		Run:  checkPCIeUpstream,
	})
	register(Check{
		Name: "pcie-acs",
		IDs:  []string{"pcie-acs-blocks-p2p"},
		Doc:  "ACS request or completion redirect on a port between GPUs forces peer-to-peer traffic up to the root complex.",
		Run:  checkACS,
	})
}

func pciIndex(s *snapshot.Snapshot) map[string]*snapshot.PCIDevice {
	m := make(map[string]*snapshot.PCIDevice, len(s.PCI))
	for i := range s.PCI {
		m[s.PCI[i].Address] = &s.PCI[i]
	}
	return m
}

func checkPCIeUpstream(in *Input) []Finding {
	s := in.Snapshot
	idx := pciIndex(s)
	out := hostCapFindings(in)
	for _, g := range gpus(s) {
		if g.PCIe == nil || len(g.Upstream) == 0 {
			continue
		}
		gGen, gWidth := slotMaxGen(g.PCIe), g.PCIe.MaxWidth
		// A card with a switch of its own (AMD's Navi and Instinct parts
		// carry one on the package, Intel's Arc too): the GPU's x16 is
		// the link inside the package, and the card's link to the host is
		// its switch's upstream port.
		path := g.Upstream
		for len(path) > 0 {
			d := idx[path[0]]
			if d == nil || !onCardSwitch(d, g) {
				break
			}
			if d.Kind == snapshot.KindSwitchUp && d.Link != nil && d.Link.MaxGen > 0 {
				gGen, gWidth = d.Link.MaxGen, d.Link.MaxWidth
			}
			path = path[1:]
		}
		gRate := in.KB.PCIeGBpsUni(gGen, gWidth)
		if gRate == 0 || len(path) == 0 {
			continue
		}
		// Walk the path: each bridge's link is the link above it.
		worst, worstRate := "", gRate
		var worstLink *snapshot.PCIeLink
		for _, a := range path {
			d := idx[a]
			if d == nil || d.Link == nil {
				continue
			}
			l := d.Link
			gen, width := l.MaxGen, l.MaxWidth
			if d.Kind == snapshot.KindSwitchDown && a == path[0] {
				// The port right above the GPU: its link is the GPU's own
				// (judged by pcie-link-downtrained); its capability caps
				// the card.
			} else if l.CurrentGen > 0 && l.CurrentWidth > 0 && (l.CurrentGen < gen || l.CurrentWidth < width) {
				// A trained-down hop counts only by width (generation drops
				// when idle); its rating counts fully.
				width = l.CurrentWidth
			}
			r := in.KB.PCIeGBpsUni(gen, width)
			if r > 0 && r < worstRate*0.99 {
				worst, worstRate, worstLink = a, r, l
			}
		}
		if worst == "" {
			continue
		}
		d := idx[worst]
		share := 100 * worstRate / gRate
		out = append(out, Finding{
			ID:       "pcie-upstream-bottleneck",
			Severity: Warning,
			Title:    fmt.Sprintf("%s: %s %s on its path to the CPU is slower than the GPU's Gen%d x%d link", gpuName(g), strings.ReplaceAll(d.Kind, "-", " "), worst, gGen, gWidth),
			Devices:  []string{g.PCIAddress, worst},
			Evidence: []string{
				fmt.Sprintf("GPU link rated Gen%d x%d = %s GB/s (uni)", gGen, gWidth, fmtFloat(gRate)),
				fmt.Sprintf("%s %s: Gen%d x%d now, Gen%d x%d capability = %s GB/s (uni)", d.Kind, worst, worstLink.CurrentGen, worstLink.CurrentWidth, worstLink.MaxGen, worstLink.MaxWidth, fmtFloat(worstRate)),
				"path: " + strings.Join(append([]string{g.PCIAddress}, g.Upstream...), " -> "),
			},
			Impact:        fmt.Sprintf("host transfers at %s%% of the GPU's rated bandwidth", fmtFloat(share)),
			ImpactPercent: pct(100 - share),
			Remedy:        "Move the GPU to a slot whose path to the CPU runs at full width and speed, or fix the switch uplink (reseat, replace cable/retimer, BIOS link settings).",
			Reference:     "Linux pcie_bandwidth_available() (drivers/pci/pci.c): the narrowest hop limits the device",
		})
	}
	return out
}

// onCardSwitch: a switch port of the GPU's own vendor right above it is the
// card's own switch (GPU makers build no stand-alone PCIe switches).
func onCardSwitch(d *snapshot.PCIDevice, g *snapshot.GPU) bool {
	if d.Kind != snapshot.KindSwitchDown && d.Kind != snapshot.KindSwitchUp {
		return false
	}
	want := map[string]string{snapshot.VendorAMD: "1002", snapshot.VendorIntel: "8086", snapshot.VendorNVIDIA: "10de"}[g.Vendor]
	return want != "" && d.VendorID == want
}

// hostCapFindings: the driver reports the host side's maximum generation
// (nvidia-smi "Host Max", NVML's max host link generation) below the GPU's
// own ("Device Max"): the slot, root port or switch above caps the card,
// busy or idle. GPUs capped alike are one finding.
func hostCapFindings(in *Input) []Finding {
	type capKey struct{ dev, host, width int }
	groups := map[capKey][]*snapshot.GPU{}
	var keys []capKey
	for _, g := range gpus(in.Snapshot) {
		l := g.PCIe
		if l == nil || l.HostMaxGen == 0 || l.MaxGen == 0 || l.HostMaxGen >= l.MaxGen {
			continue
		}
		k := capKey{l.MaxGen, l.HostMaxGen, l.MaxWidth}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], g)
	}
	var out []Finding
	for _, k := range keys {
		gs := groups[k]
		width := k.width
		if width == 0 {
			width = 16
		}
		full, capped := in.KB.PCIeGBpsUni(k.dev, width), in.KB.PCIeGBpsUni(k.host, width)
		f := Finding{
			ID:       "pcie-upstream-bottleneck",
			Severity: Warning,
			Devices:  addrs(gs),
			Title: fmt.Sprintf("%d %s: the host side of the link is Gen%d, the %s Gen%d", len(gs), plural(len(gs), "GPU", "GPUs"), k.host,
				plural(len(gs), "GPU", "GPUs"), k.dev),
			Evidence:  []string{fmt.Sprintf("driver: device max Gen%d, host max Gen%d, width x%d", k.dev, k.host, width)},
			Remedy:    "Move the GPU to a slot wired to a root port or switch of its generation, check the BIOS's PCIe speed setting for the slot (often set to Gen3 or Auto behind risers), or replace a riser or retimer rated for the lower generation.",
			Reference: "nvidia-smi -q PCIe Generation (Device Max, Host Max); NVML nvmlDeviceGetGpuMaxPcieLinkGeneration",
		}
		for _, g := range gs {
			if g.PCIe.CurrentGen > k.host {
				f.Evidence = append(f.Evidence, fmt.Sprintf("%s runs Gen%d to the switch above it; the host side of the path caps at Gen%d", g.PCIAddress, g.PCIe.CurrentGen, k.host))
				break
			}
		}
		if full > 0 && capped > 0 {
			share := 100 * capped / full
			f.Impact = fmt.Sprintf("host transfers at most %s GB/s (uni) instead of %s GB/s (uni), %s GB/s (uni) lost per direction (%s%% of the card's rating)",
				fmtFloat(capped), fmtFloat(full), fmtFloat(full-capped), fmtFloat(100-share))
			f.ImpactPercent = pct(100 - share)
		} else {
			f.Impact = fmt.Sprintf("host transfers run at Gen%d rates, not the card's Gen%d", k.host, k.dev)
		}
		out = append(out, f)
	}
	return out
}

// checkACS reports ports with ACS redirect enabled on the path between two
// GPUs that share a PCIe switch. Such ports send peer-to-peer reads and
// writes up to the root complex (or block them under an IOMMU) instead of
// letting the switch route them.
func checkACS(in *Input) []Finding {
	s := in.Snapshot
	idx := pciIndex(s)
	gs := gpus(s)
	flagged := map[string]bool{}
	var ports, devs, ev []string
	for a := 0; a < len(gs); a++ {
		for b := a + 1; b < len(gs); b++ {
			lca := commonAncestor(gs[a].Upstream, gs[b].Upstream)
			if lca < 0 {
				continue // no shared switch: traffic crosses the root complex anyway
			}
			for _, g := range []*snapshot.GPU{gs[a], gs[b]} {
				for _, addr := range below(g.Upstream, gs[a].Upstream[lca]) {
					d := idx[addr]
					if d == nil || d.ACS == nil || !(d.ACS.ReqRedir || d.ACS.CmpltRedir) || flagged[addr] {
						continue
					}
					if d.Kind != snapshot.KindSwitchDown && d.Kind != snapshot.KindRootPort {
						continue
					}
					flagged[addr] = true
					ports = append(ports, addr)
					devs = append(devs, g.PCIAddress)
					ev = append(ev, fmt.Sprintf("%s %s above %s: ACSCtl ReqRedir%s CmpltRedir%s SrcValid%s", d.Kind, addr, gpuName(g), pm(d.ACS.ReqRedir), pm(d.ACS.CmpltRedir), pm(d.ACS.SrcValid)))
				}
			}
		}
	}
	if len(ports) == 0 {
		return nil
	}
	return []Finding{{
		ID:        "pcie-acs-blocks-p2p",
		Severity:  Warning,
		Title:     fmt.Sprintf("ACS redirect is on for %d %s between GPUs that share a PCIe switch", len(ports), plural(len(ports), "port", "ports")),
		Devices:   uniq(append(devs, ports...)),
		Evidence:  ev,
		Impact:    "GPU peer-to-peer traffic that could stay inside the switch goes up to the root complex: bandwidth drops and latency rises, and P2P fails outright under an IOMMU",
		Remedy:    "Disable ACS redirect on these switch ports (BIOS 'ACS' / 'PCIe ACS control' option, or setpci at boot) when the GPUs are not passed through to separate VMs; keep it where VM isolation needs it.",
		Reference: "NVIDIA NCCL troubleshooting: PCI Access Control Services (ACS)",
	}}
}

// commonAncestor returns the index in a of the nearest bridge that a and b
// (upstream chains, nearest first) share, or -1.
func commonAncestor(a, b []string) int {
	for i, x := range a {
		for _, y := range b {
			if x == y {
				return i
			}
		}
	}
	return -1
}

// below returns the part of an upstream chain that lies under stop.
func below(chain []string, stop string) []string {
	for i, x := range chain {
		if x == stop {
			return chain[:i]
		}
	}
	return nil
}

func pm(b bool) string {
	if b {
		return "+"
	}
	return "-"
}
