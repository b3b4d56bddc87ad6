package doctor

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/kb"
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
	first := map[evKey]int{}
	var keys []evKey
	for i, e := range in.Snapshot.Events {
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
			first[k] = i
		}
		groups[k] = append(groups[k], e)
	}
	keys = dropInferredDuplicates(keys, groups)
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
				// The switch says "Fatal"/"Non-fatal", and rates each SXid
				// "Severity 0" (non-fatal) or above (fatal).
				if strings.Contains(m, "fatal") && !strings.Contains(m, "non-fatal") && !strings.Contains(m, "nonfatal") {
					sev = Critical
				}
				if reSXidSeverity().MatchString(m) {
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
	markSecondary(in.KB, out, groups, first)
	return out
}

// dropInferredDuplicates leaves out the Xids kiln inferred from GSP messages
// without a GPU address when the log has real Xid lines: the GSP banner is
// then the prelude of those (an Xid 119, an Xid 154 asking for a reset),
// not another event. Alone, an inferred Xid stands.
func dropInferredDuplicates(keys []evKey, groups map[evKey][]snapshot.Event) []evKey {
	anyReal := false
	for _, k := range keys {
		if k.kind != snapshot.EventXid {
			continue
		}
		for _, e := range groups[k] {
			if e.Reason != snapshot.XidInferred {
				anyReal = true
			}
		}
	}
	if !anyReal {
		return keys
	}
	out := keys[:0]
	for _, k := range keys {
		if k.kind == snapshot.EventXid && k.dev == "" && allInferred(groups[k]) {
			continue
		}
		out = append(out, k)
	}
	return out
}

func allInferred(evs []snapshot.Event) bool {
	for _, e := range evs {
		if e.Reason != snapshot.XidInferred {
			return false
		}
	}
	return true
}

func xidFinding(in *Input, k evKey, evs []snapshot.Event) Finding {
	f := Finding{
		ID: "xid-error", Devices: nonEmpty(k.dev), Code: k.code,
		Evidence: eventLines(evs, 5),
	}
	procs := map[string]bool{}
	inferred := 0
	for _, e := range evs {
		if e.Process != "" {
			procs[e.Process] = true
		}
		if e.Reason == snapshot.XidInferred {
			inferred++
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
	if inferred == len(evs) {
		f.Evidence = append(f.Evidence, fmt.Sprintf("no Xid line in the log: read as Xid %d from the driver's GSP messages", k.code))
	}
	x, ok := in.KB.XIDInfo(k.code)
	if !ok {
		f.Severity = Warning
		f.Title = fmt.Sprintf("Xid %d on %s (%s): code not in kiln's catalog", k.code, orNode(k.dev), countSpan(evs))
		f.Impact = "an NVIDIA driver error kiln does not know; see NVIDIA's Xid catalog"
		f.Remedy = "Look the code up in NVIDIA's Xid catalog; drain the GPU if it repeats."
		f.Reference = "https://docs.nvidia.com/deploy/xid-errors/"
	} else {
		var sev Severity
		if err := sev.UnmarshalText([]byte(x.Severity)); err != nil {
			sev = Warning
		}
		f.Severity = sev
		f.Title = fmt.Sprintf("Xid %d %s on %s (%s)", k.code, x.Mnemonic, orNode(k.dev), countSpan(evs))
		f.Impact = x.Meaning
		f.Remedy = x.Remedy
		if x.Action != "" && x.Action != "NOT_PUBLISHED" {
			f.Remedy += " (NVIDIA action: " + x.Action + ")"
		}
		f.Reference = x.Source
	}
	// The driver's own words win over the catalogue: Xid 154 names the
	// recovery it wants, and other messages ask for a reset or a reboot
	// ("Row Remapper: New row marked for remapping, reset gpu to
	// activate").
	if k.code == 154 {
		best, named := Info, false
		for _, e := range evs {
			if a, ok := kb.XIDRecoveryActionFor(e.Message); ok {
				var s Severity
				if s.UnmarshalText([]byte(a.Severity)) == nil && (s > best || !named) {
					best = s
				}
				named = true
				f.Evidence = append(f.Evidence, "recovery action: "+a.Name)
			}
		}
		if named {
			f.Severity = best
		}
	} else {
		for _, e := range evs {
			if act, ok := kb.XIDResetRequest(e.Message); ok {
				if f.Severity < Critical {
					f.Evidence = append(f.Evidence, "the driver asks for "+strings.ToLower(strings.ReplaceAll(act, "_", " "))+" in the message itself")
				}
				f.Severity = Critical
				break
			}
		}
	}
	return f
}

// markSecondary marks Xid findings that another event caused: an Xid 45
// (a channel torn down after an error) beside another Xid on its GPU, a
// message that says "caused by previous Xid N", and an Xid that follows
// application errors of the same process on its GPU (a context-switch
// timeout after the job's own exceptions). A secondary finding keeps the
// severity of its cause at most; Xid 45, NVIDIA's "follow the other Xid",
// becomes info.
func markSecondary(k *kb.KB, fs []Finding, evs map[evKey][]snapshot.Event, first map[evKey]int) {
	for i := range fs {
		f := &fs[i]
		if f.ID != "xid-error" || f.Code == 154 {
			continue
		}
		dev := ""
		if len(f.Devices) > 0 {
			dev = f.Devices[0]
		}
		mine := evs[evKey{snapshot.EventXid, f.Code, dev}]
		if c := causedByXid(mine); c != 0 {
			f.Secondary, f.CausedBy = true, fmt.Sprintf("Xid %d", c)
			f.Severity = Info
			continue
		}
		var other []Finding
		for _, g := range fs {
			if !sameDevices(g.Devices, f.Devices) {
				continue
			}
			if g.ID == "xid-error" && g.Code != f.Code && g.Code != 154 {
				other = append(other, g)
			}
			if g.ID == "gpu-fallen-off-bus" {
				g.Code = 79
				other = append(other, g)
			}
		}
		if len(other) == 0 {
			continue
		}
		if f.Code == 45 {
			f.Secondary, f.CausedBy = true, fmt.Sprintf("Xid %d", other[0].Code)
			f.Severity = Info
			continue
		}
		// An application-class Xid of the same job before this one.
		for _, g := range other {
			if g.Code == 45 || !appClass(k, g.Code) {
				continue
			}
			gk, fk := evKey{snapshot.EventXid, g.Code, dev}, evKey{snapshot.EventXid, f.Code, dev}
			if first[gk] <= first[fk] && sameJob(evs[gk], mine) {
				f.Secondary, f.CausedBy = true, fmt.Sprintf("Xid %d", g.Code)
				if f.Severity > g.Severity {
					f.Severity = g.Severity
				}
				break
			}
		}
	}
}

// causedByXid reads "caused by previous Xid N" (NVRM's wording for Xid
// 45 since R550) from any of evs.
func causedByXid(evs []snapshot.Event) int {
	for _, e := range evs {
		l := strings.ToLower(e.Message)
		i := strings.Index(l, "caused by previous xid")
		if i < 0 {
			continue
		}
		rest := strings.TrimLeft(l[i+len("caused by previous xid"):], " :")
		n := 0
		for _, c := range rest {
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int(c-'0')
			if n > 1<<16 {
				break
			}
		}
		if n > 0 {
			return n
		}
	}
	return 0
}

// appClass: NVIDIA's first action for the code is to restart the
// application (or its application workflow).
func appClass(k *kb.KB, code int) bool {
	x, ok := k.XIDInfo(code)
	if !ok {
		return false
	}
	switch x.Action {
	case "RESTART_APP", "WORKFLOW_XID_13", "WORKFLOW_XID_31":
		return true
	}
	return false
}

// sameJob: some event of a and some of b name the same process or pid, or
// the driver could not name the process of one of them ("pid='<unknown>'")
// and they are at most a minute apart.
func sameJob(a, b []snapshot.Event) bool {
	// A storm of one Xid repeats the same few jobs: the first ones tell.
	a, b = a[:min(len(a), 64)], b[:min(len(b), 64)]
	for _, x := range a {
		for _, y := range b {
			if (x.PID != 0 && x.PID == y.PID) || (x.Process != "" && x.Process == y.Process) {
				return true
			}
			if (x.PID == 0 && x.Process == "") || (y.PID == 0 && y.Process == "") {
				if x.Time.IsZero() || y.Time.IsZero() {
					return true
				}
				if d := y.Time.Sub(x.Time); d >= -time.Minute && d <= time.Minute {
					return true
				}
			}
		}
	}
	return false
}

func sameDevices(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// amdSeverity: uncorrectable RAS (ECC) errors and poison, and a GPU reset
// that failed as a whole, are critical; ring timeouts, page faults, a ring
// reset that failed but a GPU reset that worked, successful resets and
// correctable errors are warnings.
func amdSeverity(evs []snapshot.Event) Severity {
	failed, recovered := false, false
	for _, e := range evs {
		m := strings.ToLower(e.Message)
		if strings.Contains(m, "uncorrect") || strings.Contains(m, "poison") {
			return Critical
		}
		for _, w := range []string{"gpu recovery failed", "asic reset failed", "mode1 reset failed", "mode2 reset failed", "baco reset failed", "gpu reset failed"} {
			if strings.Contains(m, w) {
				failed = true
			}
		}
		if reAMDResetN().MatchString(m) {
			failed = true
		}
		if strings.Contains(m, "gpu reset succeeded") || strings.Contains(m, "recovery succeeded") {
			recovered = true
		}
	}
	if failed && !recovered {
		return Critical
	}
	return Warning
}

var reSXidSeverity = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`sxid \([^)]*\): \d+, severity [1-9]`) })

var reAMDResetN = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`gpu reset\(\d+\) failed`) })

// countSpan says "3 events, 12:01:02 to 12:05:00" or "1 event".
func countSpan(evs []snapshot.Event) string {
	total := 0
	for _, e := range evs {
		total += 1 + e.Repeats
	}
	n := fmt.Sprintf("%d %s", total, plural(total, "event", "events"))
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
