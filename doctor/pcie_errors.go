package doctor

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "pcie-replays",
		IDs:  []string{"pcie-replays"},
		Doc:  "PCIe replay (retry) counters above zero: the link resends packets it corrupted.",
		Run:  checkReplays,
	})
	register(Check{
		Name: "pcie-aer",
		IDs:  []string{"pcie-aer-errors"},
		Doc:  "PCIe Advanced Error Reporting status bits set on GPUs and the ports around them, and AER events in the kernel log.",
		Run:  checkAER,
	})
}

// replayWarn is the count from which replays are a warning: a handful over
// a long uptime is noise, tens point at a marginal link.
const replayWarn = 10

func checkReplays(in *Input) []Finding {
	var warn, info []*snapshot.GPU
	var ev []string
	for _, g := range gpus(in.Snapshot) {
		if g.PCIe == nil || g.PCIe.Replays == nil || *g.PCIe.Replays == 0 {
			continue
		}
		n := *g.PCIe.Replays
		ev = append(ev, fmt.Sprintf("%s: %d replays since reset", gpuName(g), n))
		if n >= replayWarn {
			warn = append(warn, g)
		} else {
			info = append(info, g)
		}
	}
	var out []Finding
	mk := func(sev Severity, gs []*snapshot.GPU) {
		if len(gs) == 0 {
			return
		}
		out = append(out, Finding{
			ID:       "pcie-replays",
			Severity: sev,
			Title:    fmt.Sprintf("%d %s resent PCIe packets (replays since reset)", len(gs), plural(len(gs), "GPU has", "GPUs have")),
			Devices:  addrs(gs),
			Evidence: ev,
			Impact:   "each replay costs link time; a rising count points at a marginal slot, riser or retimer and often precedes AER errors or the GPU falling off the bus",
			Remedy:   "Watch whether the counters grow under load (kiln doctor again later); reseat or move GPUs whose count grows fastest, check risers and retimer cables.",
		})
	}
	mk(Warning, warn)
	mk(Info, info)
	return out
}

func checkAER(in *Input) []Finding {
	s := in.Snapshot
	isGPU := map[string]bool{}
	for _, g := range s.GPUs {
		if g.PCIAddress != "" {
			isGPU[g.PCIAddress] = true
		}
	}
	var gpuCE, gpuUE, portUR, otherUE []string
	var evGPU, evPort []string
	for _, d := range s.PCI {
		if d.AER == nil {
			continue
		}
		ce, ue := d.AER.Correctable, d.AER.Uncorrectable
		onlyUR := len(ue) > 0 && allIn(ue, "UnsupReq")
		if len(ce) > 0 && allIn(ce, "AdvNonFatalErr") {
			// An uncorrectable error the device handled as advisory (an
			// Unsupported Request to a configuration probe, mostly): no
			// link error.
			ce = nil
			if len(ue) == 0 || onlyUR {
				portUR = append(portUR, d.Address)
				evPort = append(evPort, fmt.Sprintf("%s (%s) CESta: AdvNonFatalErr", d.Address, d.Kind))
			}
		}
		switch {
		case isGPU[d.Address] || d.Kind == snapshot.KindGPU:
			if len(ce) > 0 {
				gpuCE = append(gpuCE, d.Address)
				evGPU = append(evGPU, fmt.Sprintf("%s CESta: %s", d.Address, strings.Join(ce, " ")))
			}
			if len(ue) > 0 && !onlyUR {
				gpuUE = append(gpuUE, d.Address)
				evGPU = append(evGPU, fmt.Sprintf("%s UESta: %s", d.Address, strings.Join(ue, " ")))
			}
		default:
			if onlyUR {
				portUR = append(portUR, d.Address)
				evPort = append(evPort, fmt.Sprintf("%s (%s) UESta: UnsupReq", d.Address, d.Kind))
			} else if len(ue) > 0 {
				otherUE = append(otherUE, d.Address)
				evPort = append(evPort, fmt.Sprintf("%s (%s) UESta: %s", d.Address, d.Kind, strings.Join(ue, " ")))
			}
		}
	}
	var out []Finding
	if len(gpuCE)+len(gpuUE) > 0 {
		devs := uniq(append(gpuCE, gpuUE...))
		sev := Warning
		out = append(out, Finding{
			ID:        "pcie-aer-errors",
			Severity:  sev,
			Title:     fmt.Sprintf("%d %s PCIe AER error status bits set", len(devs), plural(len(devs), "GPU has", "GPUs have")),
			Devices:   devs,
			Evidence:  evGPU,
			Impact:    "corrected errors (RxErr, BadTLP, BadDLLP, Timeout) are physical-layer noise the link recovers from by replaying; many of them slow transfers and warn of a marginal link",
			Remedy:    "Correlate with the GPUs' PCIe replay counters and the kernel log; reseat GPUs or replace risers/retimers on the worst links. The status bits are sticky: clear them (setpci) after a fix to see whether they return.",
			Reference: "PCI Express Base Specification, Advanced Error Reporting; lspci CESta/UESta",
		})
	}
	if len(otherUE) > 0 {
		out = append(out, Finding{
			ID:       "pcie-aer-errors",
			Severity: Warning,
			Title:    fmt.Sprintf("%d PCIe %s uncorrectable error status bits set", len(otherUE), plural(len(otherUE), "port or device has", "ports or devices have")),
			Devices:  uniq(otherUE),
			Evidence: evPort,
			Impact:   "uncorrectable errors can abort transfers or take a device off the bus",
			Remedy:   "Read the kernel log around boot and under load for AER messages from these devices; reseat or replace the affected card or cable.",
		})
	}
	if len(portUR) > 0 {
		out = append(out, Finding{
			ID:       "pcie-aer-errors",
			Severity: Info,
			Title:    fmt.Sprintf("%d PCIe %s Unsupported Request or advisory non-fatal status set", len(uniq(portUR)), plural(len(uniq(portUR)), "device has", "devices have")),
			Devices:  uniq(portUR),
			Evidence: evPort,
			Impact:   "usually left by configuration-space probing at boot; harmless unless it grows",
			Remedy:   "Nothing to do unless the kernel log shows AER errors from these ports.",
		})
	}
	// AER events from the kernel log.
	byDev := map[string][]snapshot.Event{}
	// Reports are grouped by the port that received them: a root port
	// collects the errors of the link below it, whichever end logged them.
	for _, e := range s.Events {
		if e.Kind == snapshot.EventAER {
			k := e.Port
			if k == "" {
				k = e.Device
			}
			byDev[k] = append(byDev[k], e)
		}
	}
	keys := make([]string, 0, len(byDev))
	for k := range byDev {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, port := range keys {
		evs := byDev[port]
		sev, corrected, total := Info, 0, 0
		devs := []string{port}
		for _, e := range evs {
			total += 1 + e.Repeats
			devs = append(devs, e.Device)
			m := strings.ToLower(e.Message)
			switch {
			case strings.Contains(m, "fatal") && !strings.Contains(m, "non-fatal") && !strings.Contains(m, "nonfatal"):
				sev = Critical
			case strings.Contains(m, "uncorrect"):
				sev = max(sev, Warning)
			default:
				corrected += 1 + e.Repeats
				if e.Code > 1 {
					// A firmware-first record numbered past 1: the
					// platform has logged hardware errors before.
					corrected++
				}
			}
		}
		if corrected >= 2 {
			// Correctable errors that recur on a link: it is marginal.
			sev = max(sev, Warning)
		}
		f := Finding{
			ID:       "pcie-aer-errors",
			Severity: sev,
			Title:    fmt.Sprintf("kernel log: %d PCIe AER %s from %s", total, plural(total, "report", "reports"), orNode(port)),
			Evidence: eventLines(evs, 5),
			Impact:   "the PCIe link reported errors: correctable ones that recur mean a marginal link (replays cost bandwidth, and they precede uncorrectable ones); fatal ones take the device off the bus",
			Remedy:   "Reseat or replace the card, riser or cable on this link; update the platform firmware; if it recurs, lower the slot's generation in the BIOS to confirm a signal-integrity fault.",
			Devices:  uniq(devs),
		}
		out = append(out, f)
	}
	return out
}

func orNode(dev string) string {
	if dev == "" {
		return "the node"
	}
	return dev
}

func eventLines(evs []snapshot.Event, max int) []string {
	var out []string
	for i, e := range evs {
		if i == max {
			out = append(out, fmt.Sprintf("... and %d more", len(evs)-max))
			break
		}
		t := e.RawTime
		if !e.Time.IsZero() {
			t = e.Time.Format("2006-01-02 15:04:05")
		}
		if t != "" {
			t = "[" + t + "] "
		}
		out = append(out, t+firstLine(e.Message, 240))
	}
	return out
}

// firstLine keeps an event's first line (multi-line events carry dumps) and
// at most max bytes of it.
func firstLine(s string, max int) string {
	more := false
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s, more = s[:i], true
	}
	if len(s) > max {
		s, more = s[:max], true
	}
	if more {
		s += " ..."
	}
	return s
}

func allIn(xs []string, want string) bool {
	for _, x := range xs {
		if x != want {
			return false
		}
	}
	return true
}

func uniq(xs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if x != "" && !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	sort.Strings(out)
	return out
}
