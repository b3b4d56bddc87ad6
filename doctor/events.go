package doctor

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"kiln.dev/kiln/snapshot"
)

func init() {
	register(Check{
		Name: "kernel-log",
		IDs:  []string{"xid-error", "gpu-fallen-off-bus", "amdgpu-error", "nvswitch-error"},
		Doc:  "NVIDIA Xid and SXid events, GPUs fallen off the bus, amdgpu errors and NVSwitch errors in the kernel and fabric manager logs, decoded.",
		Run:  checkEvents,
	})
}

type evKey struct {
	kind string
	code int
	dev  string
}

func checkEvents(in *Input) []Finding {
	groups := map[evKey][]snapshot.Event{}
	var keys []evKey
	for _, e := range in.Snapshot.Events {
		k := evKey{e.Kind, e.Code, e.Device}
		switch e.Kind {
		case snapshot.EventXid:
			if e.Code == 79 {
				k = evKey{snapshot.EventFallenOffBus, 0, e.Device}
			}
		case snapshot.EventFallenOffBus:
			k.code = 0
		case snapshot.EventAMDGPU:
			k.code = 0
		case snapshot.EventNVSwitch, snapshot.EventSXid:
		case snapshot.EventToolError:
			// nvidia-smi's "GPU is lost" is NVML's word for a GPU that fell
			// off the bus.
			if e.Reason != snapshot.ToolGPULost {
				continue
			}
			k = evKey{snapshot.EventFallenOffBus, 0, e.Device}
		default:
			continue
		}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], e)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.kind != b.kind {
			return a.kind < b.kind
		}
		if a.dev != b.dev {
			return a.dev < b.dev
		}
		return a.code < b.code
	})
	var out []Finding
	for _, k := range keys {
		evs := groups[k]
		switch k.kind {
		case snapshot.EventXid:
			out = append(out, xidFinding(in, k, evs))
		case snapshot.EventFallenOffBus:
			out = append(out, Finding{
				ID: "gpu-fallen-off-bus", Severity: Critical, Devices: nonEmpty(k.dev),
				Title:     fmt.Sprintf("%s fell off the PCIe bus (%s)", orNode(k.dev), countSpan(evs)),
				Evidence:  append(eventLines(evs, 5), eventLines(probeFailures(in.Snapshot), 2)...),
				Impact:    "the GPU stopped answering on PCIe: every job on it failed and the driver cannot use it until the node is rebooted (Xid 79 class)",
				Remedy:    "Drain the node and reboot it. If it recurs, check the GPU's power cables, slot and riser, PCIe AER errors and temperatures before; RMA a GPU that falls off repeatedly.",
				Reference: "NVIDIA Xid catalog: Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM)",
			})
		case snapshot.EventAMDGPU:
			out = append(out, Finding{
				ID: "amdgpu-error", Severity: amdSeverity(evs), Devices: nonEmpty(k.dev),
				Title:    fmt.Sprintf("amdgpu driver errors on %s (%s)", orNode(k.dev), countSpan(evs)),
				Evidence: eventLines(evs, 5),
				Impact:   "ring timeouts and GPU resets kill the jobs running on the GPU; RAS (ECC) errors mean failing memory",
				Remedy:   "Check the messages: a ring timeout after a job crash is an application fault; repeated resets or RAS errors need a driver/firmware update or service.",
			})
		case snapshot.EventNVSwitch, snapshot.EventSXid:
			sev := Warning
			for _, e := range evs {
				m := strings.ToLower(e.Message)
				if strings.Contains(m, "fatal") && !strings.Contains(m, "non-fatal") && !strings.Contains(m, "nonfatal") {
					sev = Critical
				}
			}
			title := fmt.Sprintf("NVSwitch %s reported error %d (%s)", orNode(k.dev), k.code, countSpan(evs))
			if k.kind == snapshot.EventSXid {
				title = fmt.Sprintf("NVSwitch %s reported SXid %d (%s)", orNode(k.dev), k.code, countSpan(evs))
			}
			out = append(out, Finding{
				ID: "nvswitch-error", Severity: sev, Devices: nonEmpty(k.dev), Code: k.code,
				Title:     title,
				Evidence:  eventLines(evs, 5),
				Impact:    "non-fatal NVSwitch errors are contained to a port and may slow or fail the NVLink traffic through it; fatal ones stop the fabric and every multi-GPU job on the node",
				Remedy:    "Read the fabric manager log around these times; for fatal errors drain the node, reset the GPUs and NVSwitches (or reboot) and contact support if they repeat.",
				Reference: "NVIDIA Fabric Manager user guide: NVSwitch errors (SXid)",
			})
		}
	}
	return out
}

func xidFinding(in *Input, k evKey, evs []snapshot.Event) Finding {
	f := Finding{
		ID: "xid-error", Devices: nonEmpty(k.dev), Code: k.code,
		Evidence: eventLines(evs, 5),
	}
	procs := map[string]bool{}
	for _, e := range evs {
		if e.Process != "" {
			procs[e.Process] = true
		}
	}
	var ps []string
	for p := range procs {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	if len(ps) > 0 {
		f.Evidence = append(f.Evidence, "processes: "+strings.Join(ps, ", "))
	}
	x, ok := in.KB.XIDInfo(k.code)
	if !ok {
		f.Severity = Warning
		f.Title = fmt.Sprintf("Xid %d on %s (%s): code not in kiln's catalog", k.code, orNode(k.dev), countSpan(evs))
		f.Impact = "an NVIDIA driver error kiln does not know; see NVIDIA's Xid catalog"
		f.Remedy = "Look the code up in NVIDIA's Xid catalog; drain the GPU if it repeats."
		f.Reference = "https://docs.nvidia.com/deploy/xid-errors/"
		return f
	}
	var sev Severity
	if err := sev.UnmarshalText([]byte(x.Severity)); err != nil {
		sev = Warning
	}
	f.Severity = sev
	f.Title = fmt.Sprintf("Xid %d %s on %s (%s)", k.code, x.Mnemonic, orNode(k.dev), countSpan(evs))
	f.Impact = x.Meaning
	f.Remedy = x.Remedy
	if x.Action != "" {
		f.Remedy += " (NVIDIA action: " + x.Action + ")"
	}
	f.Reference = x.Source
	return f
}

func amdSeverity(evs []snapshot.Event) Severity {
	for _, e := range evs {
		m := strings.ToLower(e.Message)
		if strings.Contains(m, "ras") || strings.Contains(m, "uncorrect") || strings.Contains(m, "fatal") {
			return Critical
		}
	}
	return Warning
}

// countSpan says "3 events, 12:01:02 to 12:05:00" or "1 event".
func countSpan(evs []snapshot.Event) string {
	n := fmt.Sprintf("%d %s", len(evs), plural(len(evs), "event", "events"))
	var first, last time.Time
	for _, e := range evs {
		if e.Time.IsZero() {
			continue
		}
		if first.IsZero() || e.Time.Before(first) {
			first = e.Time
		}
		if e.Time.After(last) {
			last = e.Time
		}
	}
	if first.IsZero() {
		if len(evs) > 1 && evs[0].RawTime != "" && evs[len(evs)-1].RawTime != "" {
			return n + ", " + evs[0].RawTime + " to " + evs[len(evs)-1].RawTime
		}
		return n
	}
	if first.Equal(last) {
		return n + ", " + first.Format("2006-01-02 15:04:05")
	}
	return n + ", " + first.Format("2006-01-02 15:04:05") + " to " + last.Format("2006-01-02 15:04:05")
}

func probeFailures(s *snapshot.Snapshot) []snapshot.Event {
	var out []snapshot.Event
	for _, e := range s.Events {
		if e.Kind == snapshot.EventProbeFailed {
			out = append(out, e)
		}
	}
	return out
}
