package kmsg

import (
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

var (
	reXid  = lazyRegexp(`NVRM: Xid \((?:PCI:)?(` + pciAddr + `)\): (\d{1,6}),?\s*(.*)$`)
	reSXid = lazyRegexp(`nvidia-nvswitch\d*: SXid \((?:PCI:)?(` + pciAddr + `)\): (\d{1,6}),?\s*(.*)$`)
	rePID  = lazyRegexp(`^pid=('?<unknown>'?|\d+)(?:,\s*|$)`)
	reName = lazyRegexp(`^name=([^,]*)(?:,\s*|$)`)
	// reProcess reads the process of amdgpu's "Process information:
	// process X pid N thread ..." and " Process X pid N thread ...".
	reProcess = lazyRegexp(`[Pp]rocess (?:information: process )?(\S*) pid (\d+)`)

	reProbeFailed = lazyRegexp(`NVRM: The NVIDIA probe routine failed for (\d+) device`)
	reAnyAddr     = lazyRegexp(pciAddr)
	// reDevPrefix is the "<driver> <address>: " prefix of dev_printk lines.
	reDevPrefix = lazyRegexp(`^(\S+) ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):\s`)

	// reAMDPrimary starts an amdgpu event; reAMDSecondary starts one only
	// when it does not follow one on the same device (a GPU reset after a
	// ring timeout is part of the timeout's report).
	reAMDPrimary   = lazyRegexp(`(?i)\bring \S+ timeout|uncorrectable|correctable hardware error|\becc error|poison|page fault|protection fault`)
	reAMDSecondary = lazyRegexp(`(?i)timed out|\btimeout\b|gpu reset begin|reset failed|gpu reset\(\d+\) failed|\bgpu hang|\*ERROR\*`)
	reAMDDetail    = lazyRegexp(`(?i)^(?:\[drm:amdgpu_job_timedout \[amdgpu\]\] \*ERROR\* )?process information|^process \S* pid|in page starting at|_FAULT_STATUS|faulty utcl2|more_faults|walker_error|permission_faults|mapping_error|^\s*rw: |cid: `)

	reAERReceived = lazyRegexp(`AER: (?:Multiple )?(Corrected|Correctable|Uncorrected \((?:Non-Fatal|Fatal)\)|Uncorrectable \((?:Non-Fatal|Fatal)\)|Uncorrected|Uncorrectable|Fatal|Non-Fatal) error(?: message)? received(?::| from)? ?(` + pciAddr + `)?`)
	rePCIeBusErr  = lazyRegexp(`PCIe Bus Error: severity=([A-Za-z() -]+?)(?:,|$)`)
	reAERDetail   = lazyRegexp(`^\s*(?:device \[[0-9a-fA-F]{4}:[0-9a-fA-F]{4}\]|\[\s*\d+\] |aer_status:|aer_layer=|Error of this Agent|TLP Header|AER: +(?:\[|TLP|Error))`)
)

// builder turns records into events. An event stays open while the records
// after it are its details (an Xid's RPC history dump, the lines of an AER
// report); the first record that is not closes it.
type builder struct {
	open      *snapshot.Event
	openKind  string // nvrm, sxid, amdgpu, aer
	openLines int
	// nvrm collects an NVRM report that spans several records ("The
	// NVIDIA GPU X" / "(PCI ID: ...) installed in this system has" /
	// "fallen off the bus ...") until it says what it is.
	nvrm struct {
		active bool
		device string
		parts  []string
		rec    *record
	}
	// amdDev is the only amdgpu device seen so far; amdMany is set once a
	// second one appears, after which lines without an address get none.
	amdDev  string
	amdMany bool
}

func (b *builder) close(out *[]snapshot.Event) {
	if b.open != nil {
		*out = append(*out, *b.open)
	}
	b.open, b.openKind, b.openLines = nil, "", 0
}

func (b *builder) start(out *[]snapshot.Event, ev snapshot.Event, kind string) {
	b.close(out)
	b.open, b.openKind = &ev, kind
}

// attach joins a detail line to the open event; it reports false when the
// event is full.
func (b *builder) attach(text string) bool {
	if b.open == nil || b.openLines >= maxDetail {
		return false
	}
	b.openLines++
	if len(b.open.Message)+len(text)+1 <= maxMessage {
		b.open.Message += "\n" + text
	}
	return true
}

func (b *builder) resetNVRM() {
	b.nvrm.active, b.nvrm.device, b.nvrm.parts, b.nvrm.rec = false, "", nil, nil
}

func newEvent(rec *record, kind, msg string) snapshot.Event {
	return snapshot.Event{Time: rec.time, RawTime: rec.raw, Source: rec.source, Kind: kind, Device: rec.device, Message: msg}
}

func canonical(addr string) string {
	a, err := snapshot.CanonicalPCI(addr)
	if err != nil {
		return ""
	}
	return a
}

func (b *builder) process(rec *record, text string, out *[]snapshot.Event) {
	if strings.Contains(text, "NVRM") {
		b.nvrmRecord(rec, text, out)
		return
	}
	if strings.Contains(text, "SXid") && b.sxid(rec, text, out) {
		return
	}
	if (strings.Contains(text, "AER") || strings.Contains(text, "PCIe Bus Error") || b.openKind == "aer") && b.aer(rec, text, out) {
		return
	}
	if strings.Contains(text, "amdgpu") && b.amdgpu(rec, text, out) {
		return
	}
	b.close(out)
	b.resetNVRM()
}

func (b *builder) nvrmRecord(rec *record, text string, out *[]snapshot.Event) {
	if m := reXid().FindStringSubmatch(text); m != nil {
		code, _ := strconv.Atoi(m[2])
		ev := newEvent(rec, snapshot.EventXid, text)
		ev.Code = code
		if d := canonical(m[1]); d != "" {
			ev.Device = d
		}
		ev.PID, ev.Process = pidName(m[3])
		b.resetNVRM()
		b.start(out, ev, "nvrm")
		return
	}
	if reProbeFailed().MatchString(text) {
		b.close(out)
		b.resetNVRM()
		*out = append(*out, newEvent(rec, snapshot.EventProbeFailed, text))
		return
	}
	starter := ""
	if m := reGPUAt().FindStringSubmatch(text); m != nil {
		starter = m[1]
	} else if m := reTheGPU().FindStringSubmatch(text); m != nil {
		starter = m[1]
	}
	if starter != "" {
		b.close(out)
		b.resetNVRM()
		b.nvrm.active, b.nvrm.device, b.nvrm.rec = true, canonical(starter), rec
	}
	if strings.Contains(strings.ToLower(text), "fallen off the bus") {
		if b.openKind == "nvrm" && b.open.Kind == snapshot.EventXid && b.open.Code == 79 {
			b.attach(text)
			return
		}
		dev := ""
		if a := reAnyAddr().FindString(text); a != "" {
			dev = canonical(a)
		}
		if dev == "" {
			dev = b.nvrm.device
		}
		first := rec
		msg := text
		if b.nvrm.active && starter == "" {
			first = b.nvrm.rec
			msg = strings.Join(append(b.nvrm.parts, strings.TrimPrefix(text, "NVRM: ")), " ")
		}
		ev := newEvent(first, snapshot.EventFallenOffBus, msg)
		if dev != "" {
			ev.Device = dev
		}
		b.resetNVRM()
		b.start(out, ev, "nvrm")
		return
	}
	if b.nvrm.active {
		part := text
		if len(b.nvrm.parts) > 0 {
			part = strings.TrimPrefix(text, "NVRM: ")
		}
		if len(b.nvrm.parts) >= maxParts {
			b.resetNVRM()
			return
		}
		b.nvrm.parts = append(b.nvrm.parts, part)
		return
	}
	if b.openKind == "nvrm" && !strings.Contains(text, "NVIDIA UNIX") && b.attach(text) {
		return
	}
	b.close(out)
}

// pidName reads "pid=2024380, name=nvidia-smi, ..." at the start of an Xid's
// text. "<unknown>" stays unknown.
func pidName(s string) (int, string) {
	pid, name := 0, ""
	if m := rePID().FindStringSubmatch(s); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil && n > 0 {
			pid = n
		}
		s = s[len(m[0]):]
		if m := reName().FindStringSubmatch(s); m != nil {
			if v := strings.TrimSpace(m[1]); v != "" && !strings.Contains(v, "<unknown>") {
				name = v
			}
		}
	}
	return pid, name
}

func (b *builder) sxid(rec *record, text string, out *[]snapshot.Event) bool {
	m := reSXid().FindStringSubmatch(text)
	if m == nil {
		return false
	}
	code, _ := strconv.Atoi(m[2])
	dev := canonical(m[1])
	rest := strings.TrimSpace(m[3])
	// NVSwitch reports one SXid in several lines: the error, then
	// "Severity ..." and "Data {...}" lines with the same code.
	if b.openKind == "sxid" && b.open.Code == code && b.open.Device == dev &&
		(strings.HasPrefix(rest, "Severity") || strings.HasPrefix(rest, "Data")) {
		b.attach(text)
		return true
	}
	ev := newEvent(rec, snapshot.EventSXid, text)
	ev.Code = code
	if dev != "" {
		ev.Device = dev
	}
	b.start(out, ev, "sxid")
	return true
}

func (b *builder) amdgpu(rec *record, text string, out *[]snapshot.Event) bool {
	dev := ""
	if m := reDevPrefix().FindStringSubmatch(text); m != nil && m[1] == "amdgpu" {
		dev = canonical(m[2])
	} else if !strings.HasPrefix(text, "amdgpu:") && !strings.Contains(text, "[amdgpu]]") &&
		!strings.HasPrefix(text, "[drm:amdgpu_") {
		return false
	}
	if dev != "" {
		if b.amdDev == "" {
			b.amdDev = dev
		} else if b.amdDev != dev {
			b.amdMany = true
		}
	}
	// The message after "amdgpu 0000:03:00.0: amdgpu: ".
	body := text
	if i := strings.Index(text, "amdgpu: "); i >= 0 {
		body = text[i+len("amdgpu: "):]
	}
	if b.openKind == "amdgpu" && (dev == "" || dev == b.open.Device) && reAMDDetail().MatchString(strings.TrimSpace(body)) {
		if m := reProcess().FindStringSubmatch(body); m != nil && b.open.PID == 0 {
			b.open.Process = m[1]
			b.open.PID, _ = strconv.Atoi(m[2])
		}
		b.attach(text)
		return true
	}
	primary := reAMDPrimary().MatchString(text)
	if !primary && !reAMDSecondary().MatchString(text) {
		return false
	}
	if !primary && b.openKind == "amdgpu" && (dev == "" || dev == b.open.Device) && b.attach(text) {
		return true
	}
	ev := newEvent(rec, snapshot.EventAMDGPU, text)
	switch {
	case dev != "":
		ev.Device = dev
	case ev.Device == "" && !b.amdMany:
		ev.Device = b.amdDev
	}
	b.resetNVRM()
	b.start(out, ev, "amdgpu")
	return true
}

func (b *builder) aer(rec *record, text string, out *[]snapshot.Event) bool {
	dev := ""
	if m := reDevPrefix().FindStringSubmatch(text); m != nil {
		dev = canonical(m[2])
	}
	if m := reAERReceived().FindStringSubmatch(text); m != nil {
		if m[2] != "" {
			dev = canonical(m[2])
		}
		ev := newEvent(rec, snapshot.EventAER, text+" (severity="+aerSeverity(m[1])+")")
		if dev != "" {
			ev.Device = dev
		}
		b.start(out, ev, "aer")
		return true
	}
	if m := rePCIeBusErr().FindStringSubmatch(text); m != nil {
		if b.openKind == "aer" && (dev == "" || b.open.Device == "" || b.open.Device == dev) &&
			!strings.Contains(b.open.Message, "PCIe Bus Error") {
			if b.open.Device == "" {
				b.open.Device = dev
			}
			b.attach(text)
			return true
		}
		ev := newEvent(rec, snapshot.EventAER, text)
		if dev != "" {
			ev.Device = dev
		}
		b.start(out, ev, "aer")
		return true
	}
	if b.openKind == "aer" {
		body := text
		if m := reDevPrefix().FindStringSubmatch(text); m != nil {
			body = text[len(m[0]):]
		}
		if reAERDetail().MatchString(body) && b.attach(text) {
			return true
		}
	}
	return false
}

// aerSeverity names an AER severity the way "PCIe Bus Error: severity=" does.
func aerSeverity(s string) string {
	switch {
	case strings.HasPrefix(s, "Correct"):
		return "Corrected"
	case strings.Contains(s, "Non-Fatal"):
		return "Uncorrected (Non-Fatal)"
	case strings.Contains(s, "Fatal"):
		return "Uncorrected (Fatal)"
	}
	return "Uncorrected"
}
