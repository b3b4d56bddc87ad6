package doctor

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"

	"kiln.dev/kiln/topo"
)

func init() {
	register(Check{
		Name: "topology",
		IDs:  []string{"no-p2p-path", "nic-locality"},
		Doc:  "No GPU pair closer than the host bridge; GPUs without a NIC near them.",
		Run:  checkTopology,
	})
}

// Class ranks from the topo package: NV#/XGMI best, SYS worst.
func classCloserThanHostBridge(c topo.Cell) bool {
	switch {
	case strings.HasPrefix(c.Class, "NV"), c.Class == "XGMI", c.Class == "PIX", c.Class == "PXB":
		return true
	}
	return false
}

func knownClass(c topo.Cell) bool {
	switch c.Class {
	case "", "?", "X":
		return false
	}
	return true
}

func checkTopology(in *Input) []Finding {
	m := in.Topo
	if m == nil {
		return nil
	}
	gi := m.GPUs()
	var out []Finding
	if len(gi) >= 2 && !fabricUnread(in) {
		best := ""
		allKnown := true
		close := false
		fromNUMA := true
		counts := map[string]int{}
		for a := 0; a < len(gi); a++ {
			for b := a + 1; b < len(gi); b++ {
				c := m.Cells[gi[a]][gi[b]]
				if !knownClass(c) {
					allKnown = false
					continue
				}
				counts[c.Class]++
				fromNUMA = fromNUMA && c.FromNUMA
				if classCloserThanHostBridge(c) {
					close = true
				}
				if best == "" || c.Rank() < (topo.Cell{Class: best}).Rank() {
					best = c.Class
				}
			}
		}
		// Classes guessed from NUMA nodes alone (a capture that gives only
		// them) say nothing of a bridge between the cards.
		if allKnown && !close && best != "" && !fromNUMA {
			var ev []string
			for _, cl := range []string{"PHB", "NODE", "SYS"} {
				if counts[cl] > 0 {
					ev = append(ev, fmt.Sprintf("%d GPU %s %s", counts[cl], plural(counts[cl], "pair is", "pairs are"), cl))
				}
			}
			ev = append(ev, numaSummary(m))
			out = append(out, Finding{
				ID: "no-p2p-path", Severity: Warning,
				Title:     fmt.Sprintf("no GPU pair is closer than the host bridge (best: %s)", best),
				Evidence:  ev,
				Impact:    "every GPU-to-GPU transfer crosses a host bridge or the CPU interconnect: peer-to-peer is slow or disabled and multi-GPU jobs pay for it in every collective",
				Remedy:    "Keep multi-GPU jobs on GPUs of one NUMA node, or move GPUs under a shared PCIe switch or add NVLink bridges; single-GPU jobs are unaffected.",
				Reference: "nvidia-smi topo -m legend (PIX, PXB, PHB, NODE, SYS)",
			})
		}
	}
	// NIC locality: every GPU should have a NIC at PIX or PXB.
	var nics []int
	for i, d := range m.Devices {
		if d.Kind == "nic" {
			nics = append(nics, i)
		}
	}
	if len(nics) > 0 && len(gi) > 0 {
		var far []string
		var devs []string
		var ev []string
		for _, g := range gi {
			_, cls := m.NearestNIC(g)
			if cls == "" || cls == "?" {
				continue
			}
			if cls != "PIX" && cls != "PXB" && !strings.HasPrefix(cls, "NV") {
				far = append(far, m.Devices[g].Name)
				if m.Devices[g].PCI != "" {
					devs = append(devs, m.Devices[g].PCI)
				}
				ev = append(ev, fmt.Sprintf("%s: nearest NIC is %s away", m.Devices[g].Name, cls))
			}
		}
		if len(far) > 0 {
			out = append(out, Finding{
				ID: "nic-locality", Severity: Info, Devices: devs,
				Title:    fmt.Sprintf("%d of %d GPUs have no NIC under the same PCIe switch", len(far), len(gi)),
				Evidence: ev,
				Impact:   "multi-node traffic from these GPUs crosses the host bridge or the CPU interconnect; GPUDirect RDMA is slow or unavailable for them",
				Remedy:   "For multi-node training, place one NIC under each GPU's PCIe switch (1:1 GPU-NIC pairing); for single-node work this does not matter.",
			})
		}
	}
	return out
}

func numaSummary(m *topo.Matrix) string {
	per := map[int][]string{}
	var order []int
	for _, i := range m.GPUs() {
		d := m.Devices[i]
		n := -1
		if d.NUMANode != nil {
			n = *d.NUMANode
		}
		if _, ok := per[n]; !ok {
			order = append(order, n)
		}
		per[n] = append(per[n], d.Name)
	}
	var parts []string
	for _, n := range order {
		label := fmt.Sprintf("NUMA %d", n)
		if n < 0 {
			label = "NUMA unknown"
		}
		parts = append(parts, label+": "+strings.Join(per[n], " "))
	}
	return strings.Join(parts, "; ")
}

// fabricUnread is true when the GPUs are of a model with NVLink or xGMI but
// no link state was read (lspci or sysfs alone): the PCIe classes then say
// nothing about peer-to-peer, which runs over the fabric.
func fabricUnread(in *Input) bool {
	s := in.Snapshot
	if len(s.Links) > 0 {
		return false
	}
	for _, g := range s.GPUs {
		if len(g.NVLinks) > 0 {
			return false
		}
	}
	for _, g := range s.GPUs {
		m, ok := in.KB.GPUByDeviceID(g.Vendor, g.DeviceID)
		if !ok {
			m, ok = in.KB.GPUByName(g.Model)
		}
		if ok && (m.Interconnect == "nvlink" || m.Interconnect == "xgmi") && m.InterconnectLinks > 0 && (m.NVSwitch || m.Class == "datacenter") {
			return true
		}
	}
	for _, d := range s.PCI {
		if d.Kind == snapshot.KindNVSwitch {
			return true
		}
	}
	return false
}
