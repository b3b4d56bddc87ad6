package kmsg

import (
	"fmt"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/unwrap"
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
	// reInitFailed: the driver could not bring a GPU up ("NVRM: GPU
	// 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)").
	reInitFailed = lazyRegexp(`NVRM: (?:GPU (` + pciAddr + `): )?(?:GPU\d+ )?(?:RmInitAdapter failed|rm_init_adapter failed|RmInitAdapter: Cannot initialize)`)
	// reGSPTimeout and reGSPError: the GSP firmware's own reports, which
	// come with an Xid 119 or 120 line on most drivers and alone on some.
	reGSPTimeout = lazyRegexp(`(?i)GSP (?:RPC )?timeout|heartbeat timed out|_kgspLogXid119|_kgspLogRpcTimeout|waiting for RPC response from GPU\d* ?GSP|rpcRecvPoll timedout`)
	reGSPError   = lazyRegexp(`(?i)GSP-CrashCat|kgspHealthCheck|GSP (?:has )?crashed|GSP error`)
	reGPUIndex   = lazyRegexp(`NVRM: GPU(\d{1,3}) `)
	reRPCFromGPU = lazyRegexp(`response from GPU(\d{1,3}) GSP`)
	reGPUAddr    = lazyRegexp(`NVRM: GPU (` + pciAddr + `): `)
	reAnyAddr    = lazyRegexp(pciAddr)
	// reDevPrefix is the "<driver> <address>: " prefix of dev_printk lines.
	reDevPrefix = lazyRegexp(`^(\S+) ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):\s`)

	// reAMDPrimary starts an amdgpu event; reAMDSecondary starts one only
	// when it does not follow one on the same device (a GPU reset after a
	// ring timeout is part of the timeout's report).
	reAMDPrimary   = lazyRegexp(`(?i)\bring \S+ timeout|uncorrectable|correctable hardware error|\becc error|poison|page fault|protection fault|mes failed|failed to remove hardware queue|ring \S+ test failed`)
	reAMDSecondary = lazyRegexp(`(?i)timed out|\btimeout\b|\bmode[12] reset\b|\bbaco reset\b|gpu reset begin|gpu recovery failed|asic reset failed|reset failed|reset succeeded|gpu reset\(\d+\) (?:failed|succeeded)|\bgpu hang|vram is lost|\*ERROR\*`)
	// reAMDInitFailed: the driver gave the GPU up while bringing it up.
	reAMDInitFailed = lazyRegexp(`(?i)fatal error during gpu init|amdgpu_device_ip_init failed|amdgpu: finishing device`)
	reAMDDetail     = lazyRegexp(`(?i)^(?:\[drm:amdgpu_job_timedout \[amdgpu\]\] \*ERROR\* )?process information|^process \S* pid|in page starting at|_FAULT_STATUS|faulty utcl2|more_faults|walker_error|permission_faults|mapping_error|^\s*rw: |cid: `)

	reAERID       = lazyRegexp(`id=([0-9a-fA-F]{4})\b`)
	reGHESStart   = lazyRegexp(`\{(\d{1,12})\}\[Hardware Error\]: Hardware error from APEI`)
	reGHES        = lazyRegexp(`^\{(\d{1,12})\}\[Hardware Error\]: ?(.*)$`)
	reGHESDevice  = lazyRegexp(`^\s*device_id: (` + pciAddr + `)\s*$`)
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
	// ghesRec is the firmware-first error record being read.
	ghesRec *ghesRecord
	// gpuIndex maps NVRM's "GPUn" to addresses it learnt; lastIndex is
	// the index the previous NVRM line named (-1: none).
	gpuIndex  map[int]string
	lastIndex int
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
	if strings.Contains(text, "[Hardware Error]") && b.ghes(rec, text, out) {
		return
	}
	if (strings.Contains(text, "AER") || strings.Contains(text, "PCIe Bus Error") || b.openKind == "aer") && b.aer(rec, text, out) {
		return
	}
	if strings.Contains(text, "amdgpu") && b.amdgpu(rec, text, out) {
		return
	}
	if b.openKind == "amdgpu" && strings.HasPrefix(text, "[drm] ") && reAMDSecondary().MatchString(text) && b.attach(text) {
		// "[drm] VRAM is lost due to GPU reset!" belongs to the reset.
		return
	}
	b.close(out)
	b.resetNVRM()
}

func (b *builder) nvrmRecord(rec *record, text string, out *[]snapshot.Event) {
	b.learnGPUIndex(text)
	if m := reXid().FindStringSubmatch(text); m != nil {
		code, _ := strconv.Atoi(m[2])
		ev := newEvent(rec, snapshot.EventXid, text)
		ev.Code = code
		if d := canonical(m[1]); d != "" {
			ev.Device = d
		}
		ev.PID, ev.Process = pidName(m[3])
		if g := reRPCFromGPU().FindStringSubmatch(text); g != nil {
			n, _ := strconv.Atoi(g[1])
			b.pairIndex(n, ev.Device)
		}
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
	if m := reInitFailed().FindStringSubmatch(text); m != nil {
		dev := canonical(m[1])
		if dev == "" {
			dev = b.gpuIndex[gpuIndexOf(text)]
		}
		// "rm_init_adapter failed" follows "RmInitAdapter failed!" for the
		// same GPU: one failure.
		if b.openKind == "init" && (dev == "" || dev == b.open.Device || b.open.Device == "") && b.attach(text) {
			// "RmInitAdapter: Cannot initialize GSP firmware RM" comes
			// before the line that names the GPU.
			if b.open.Device == "" {
				b.open.Device = dev
			}
			return
		}
		b.resetNVRM()
		ev := newEvent(rec, snapshot.EventInitFailed, text)
		ev.Device = dev
		b.start(out, ev, "init")
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
	if (b.openKind == "nvrm" || b.openKind == "init") && !strings.Contains(text, "NVIDIA UNIX") && b.attach(text) {
		return
	}
	// A GSP timeout or crash reported without its Xid line (older open
	// modules print the GSP banner alone): kiln reads it as the Xid the
	// driver assigns to it, marked inferred.
	code := 0
	switch {
	case reGSPTimeout().MatchString(text):
		code = 119
	case reGSPError().MatchString(text):
		code = 120
	}
	if code != 0 {
		ev := newEvent(rec, snapshot.EventXid, text)
		ev.Code, ev.Reason = code, snapshot.XidInferred
		if a := reAnyAddr().FindString(text); a != "" {
			ev.Device = canonical(a)
		} else {
			ev.Device = b.gpuIndex[gpuIndexOf(text)]
		}
		b.start(out, ev, "nvrm")
		return
	}
	b.close(out)
}

// gpuIndexOf reads the n of "NVRM: GPUn ...", or -1.
func gpuIndexOf(text string) int {
	m := reGPUIndex().FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// learnGPUIndex pairs NVRM's "GPUn" with an address when one line names
// both, or when a line naming an address follows one naming an index.
func (b *builder) learnGPUIndex(text string) {
	if !strings.HasPrefix(text, "NVRM: GPU") {
		return
	}
	if n := gpuIndexOf(text); n >= 0 {
		b.lastIndex = n
		return
	}
	if m := reGPUAddr().FindStringSubmatch(text); m != nil && b.lastIndex >= 0 {
		b.pairIndex(b.lastIndex, canonical(m[1]))
	}
	b.lastIndex = -1
}

func (b *builder) pairIndex(n int, addr string) {
	if addr == "" || n < 0 {
		return
	}
	if b.gpuIndex == nil {
		b.gpuIndex = map[int]string{}
	}
	if _, ok := b.gpuIndex[n]; !ok && len(b.gpuIndex) < maxFacts {
		b.gpuIndex[n] = addr
	}
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
	if reAMDInitFailed().MatchString(body) {
		if b.openKind == "init" && (dev == "" || dev == b.open.Device) && b.attach(text) {
			return true
		}
		ev := newEvent(rec, snapshot.EventInitFailed, text)
		ev.Device = dev
		if dev == "" && !b.amdMany {
			ev.Device = b.amdDev
		}
		b.resetNVRM()
		b.start(out, ev, "init")
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
		port := dev
		src := ""
		if m[2] != "" {
			src = canonical(m[2])
		} else if id := reAERID().FindStringSubmatch(text); id != nil && port != "" {
			// "error received: id=0010": the requester id, bus 0x00,
			// device 0x02, function 0, in the port's domain.
			src = requesterAddr(port, id[1])
		}
		ev := newEvent(rec, snapshot.EventAER, text+" (severity="+aerSeverity(m[1])+")")
		ev.Port = port
		switch {
		case src != "" && src != "0000:00:00.0":
			ev.Device = src
		case port != "":
			// Source id 0 is what Transmitter-ID correctable errors
			// often carry: the port itself logged the error.
			ev.Device = port
		}
		b.start(out, ev, "aer")
		return true
	}
	if m := rePCIeBusErr().FindStringSubmatch(text); m != nil {
		if b.openKind == "aer" && !strings.Contains(b.open.Message, "PCIe Bus Error") {
			// The device that prints the error status is the one that
			// logged it.
			if dev != "" {
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

// requesterAddr turns a 16-bit requester id (bus, device, function) into
// an address in the port's PCI domain.
func requesterAddr(port, id string) string {
	v, err := strconv.ParseUint(id, 16, 16)
	if err != nil {
		return ""
	}
	dom, _, _ := strings.Cut(port, ":")
	return canonical(fmt.Sprintf("%s:%02x:%02x.%x", dom, v>>8, (v>>3)&0x1f, v&7))
}

// ghes reads firmware-first error records ("{359}[Hardware Error]: ..."):
// a record whose section is a PCIe error is an AER event on the device it
// names, with the record's sequence number as its code. Records of other
// sections (memory, processor) are not GPU events.
func (b *builder) ghes(rec *record, text string, out *[]snapshot.Event) bool {
	m := reGHES().FindStringSubmatch(text)
	if m == nil {
		return false
	}
	seq, _ := strconv.Atoi(m[1])
	body := m[2]
	if reGHESStart().MatchString(text) {
		b.close(out)
		b.ghesRec = &ghesRecord{seq: seq, first: rec, lines: []string{text}}
		return true
	}
	g := b.ghesRec
	if g == nil || g.seq != seq {
		return false
	}
	if len(g.lines) < maxDetail {
		g.lines = append(g.lines, text)
	}
	l := unwrap.ASCIILower(body)
	switch {
	case strings.Contains(l, "event severity:"):
		g.severity = strings.TrimSpace(body[strings.Index(l, "event severity:")+len("event severity:"):])
	case strings.Contains(l, "section_type:"):
		g.pcie = g.pcie || strings.Contains(l, "pcie error")
	}
	if d := reGHESDevice().FindStringSubmatch(body); d != nil && g.dev == "" {
		g.dev = canonical(d[1])
	}
	if g.pcie && g.dev != "" && !g.emitted {
		g.emitted = true
		sev := "Corrected"
		if !strings.HasPrefix(strings.ToLower(g.severity), "corrected") {
			sev = "Uncorrected (" + g.severity + ")"
		}
		ev := newEvent(g.first, snapshot.EventAER, g.lines[0]+" (severity="+sev+")")
		ev.Device, ev.Code = g.dev, g.seq
		for _, l := range g.lines[1:] {
			ev.Message += "\n" + l
		}
		b.start(out, ev, "aer")
	} else if g.emitted && b.openKind == "aer" {
		b.attach(text)
	}
	return true
}

type ghesRecord struct {
	seq      int
	first    *record
	lines    []string
	severity string
	pcie     bool
	dev      string
	emitted  bool
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
