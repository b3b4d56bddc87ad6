package kmsg

import (
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/unwrap"
)

// record is one kernel message: its first line and the continuation lines
// that belong to it.
type record struct {
	time   time.Time
	raw    string // time as printed when it is not a date
	source string // dmesg, journal, kmsg (snapshot.Event.Source)
	format string // Facts.Format
	// kernel is false for syslog lines written by other programs.
	kernel bool
	text   string
	more   []string
	// device is the DEVICE=+pci:... dictionary entry of a /dev/kmsg record.
	device string
}

// joined is the record's text with its continuation lines, each on the
// same line: "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5)
// installed in this system has fallen off the bus ...". A repeated "NVRM: "
// at the start of a continuation is dropped.
func (r *record) joined() string {
	if len(r.more) == 0 {
		return r.text
	}
	var b strings.Builder
	b.WriteString(r.text)
	nvrm := strings.HasPrefix(r.text, "NVRM:")
	for _, m := range r.more {
		if nvrm {
			m = strings.TrimPrefix(m, "NVRM: ")
		}
		if b.Len()+len(m)+1 > maxMessage {
			break
		}
		b.WriteByte(' ')
		b.WriteString(m)
	}
	return b.String()
}

func (r *record) addMore(s string) {
	s = strings.TrimSpace(s)
	if s == "" || len(r.more) >= maxParts {
		return
	}
	r.more = append(r.more, s)
}

type lineKind int

const (
	lineSkip lineKind = iota
	lineRecord
	lineCont // continuation of the previous record's text
	lineDict // /dev/kmsg dictionary entry (" DEVICE=+pci:0000:01:00.0")
)

// lazyRegexp compiles expr on its first use: most kiln commands never read
// a kernel log, and compiling the package's expressions when the program
// starts cost every command 0.7 ms and half a megabyte.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// Timestamps as kernel logs and their collectors print them: RFC 3339 and
// ISO 8601 with a T or a space, with or without fractions and zone;
// ctime ("Sun Feb 23 16:24:18 2025", any locale's words); seconds since
// boot; syslog's "Feb 27 15:10:02" with any locale's month ("Mär  5",
// "déc. 05", "12月 05").
const (
	isoTime   = `\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?: ?(?:[+-]\d\d:?\d\d|Z|UTC|GMT))?`
	monthWord = `(?:[^\s\d:\[\]<>,;=]{2,12}\.?|\d{1,2}月)`
	syslogDay = monthWord + ` {1,2}\d{1,2}(?:日)?,? \d\d:\d\d:\d\d(?:[.,]\d{1,9})?`
)

var (
	reKmsg       = lazyRegexp(`^(\d{1,4}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$`)
	reKmsgDict   = lazyRegexp(`^ ([A-Z_]+)=(.*)$`)
	rePRI        = lazyRegexp(`^<(\d{1,3})>(?:1 (` + isoTime + `|-) \S+ (\S+) \S+ \S+ (?:-|\[[^\]]*\])+ ?)?`)
	reDecode     = lazyRegexp(`^([a-z]+[0-9]?)\s*:\s*(emerg|alert|crit|err|warn|notice|info|debug)\s*: ?(.*)$`)
	reISO        = lazyRegexp(`^\[?(` + isoTime + `)\]?:? ?(.*)$`)
	reCtime      = lazyRegexp(`^\[?((?:[^\s\d\[\]]{2,10}\.?,? )?[^\s\d\[\]]{2,10}\.? {1,2}\d{1,2} \d\d:\d\d:\d\d(?: [A-Z]{3,4})? \d{4})\]? ?(.*)$`)
	reMono       = lazyRegexp(`^\[\s*[+<]?\s*(\d{1,12}[.,]\d{1,9})>?\] ?(.*)$`)
	reHuman      = lazyRegexp(`^\[(` + monthWord + `\s?\d{1,2} \d\d:\d\d(?::\d\d)?)\] ?(.*)$`)
	reSyslog     = lazyRegexp(`^(` + syslogDay + `|` + isoTime + `) (\S*[^\s:]) ([A-Za-z_][\w./@-]*)(?:\[\d+\])?: ?(.*)$`)
	// reSyslogNoHost: syslog without a host name ("Mar 27 17:40:36
	// kernel: ...", as some forwarders and journalctl -o short-monotonic
	// variants write it).
	reSyslogNoHost = lazyRegexp(`^(` + syslogDay + `|` + isoTime + `) (kernel)(?:\[\d+\])?: ?(.*)$`)
	reLevelTag   = lazyRegexp(`^(?:\[|<)?(?:kern(?:el)?)[.:](?:emerg|alert|crit|err|error|warn|warning|notice|info|debug)(?:\]|>)?:? ?(.*)$`)
	reInnerMono  = lazyRegexp(`^\[\s*\d{1,12}[.,]\d{1,9}\] ?`)
	reKmsgEscape = lazyRegexp(`\\x[0-9a-fA-F]{2}`)
	// reAnchor finds where a kernel message starts inside a wrapper kiln
	// does not know: the subsystems whose messages kiln reads, and any
	// driver's "<driver> <PCI address>: " prefix.
	reAnchor = lazyRegexp(`NVRM: |nvidia-nvswitch\d*: |nvidia-modeset: |nvidia-uvm: |nvidia-peermem |\[drm[:\]]|\bAER: |\{\d+\}\[Hardware Error\]|\b[a-z][\w-]{1,23} [0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]: |\bpci [0-9a-fA-F]{4}:[0-9a-fA-F]{2}:|\bpci_bus [0-9a-fA-F]{4}:|\bamdgpu: |\bLinux version \d`)
)

// parseLine reads the prefix of one line. prevKmsg says whether the
// previous record came from /dev/kmsg, where lines that start with a space
// are dictionary entries.
//
// A line is read from the left: the headers kiln knows (a /dev/kmsg record,
// a syslog priority, dmesg's level and time forms, a syslog or journal
// header) are taken off one after the other, so that a collector's header
// in front of dmesg's own works too. When what is left does not start a
// kernel message, kiln looks for where one starts (NVRM:, a driver and
// its PCI address, ...) and takes everything before it as a wrapper.
func parseLine(line string, prevKmsg bool) (lineKind, record) {
	line = unwrap.Line(line)
	t := strings.TrimSpace(line)
	if t == "" || strings.HasPrefix(t, "-- ") {
		// journalctl's "-- Logs begin at ...", "-- Boot ... --", "-- No entries --".
		return lineSkip, record{}
	}
	if line[0] == ' ' || line[0] == '\t' {
		if prevKmsg && reKmsgDict().MatchString(line) {
			return lineDict, record{text: line}
		}
		// An indented line is a continuation unless a header follows the
		// indent (a pasted log indented as a code block).
		if r, ok := readHeaders(t); ok {
			return lineRecord, r
		}
		return lineCont, record{text: line}
	}
	r, _ := readHeaders(line)
	return lineRecord, r
}

// readHeaders takes the known headers off the front of line; ok says
// whether there was one.
func readHeaders(line string) (record, bool) {
	r := record{source: "dmesg", kernel: true}
	text := line
	found := false
	// inKernel is set once a header that only the kernel's own log has
	// (dmesg's time, a kmsg record, a "kernel:" tag) was read: the text
	// after it is the message itself.
	inKernel := false
	setFormat := func(f string) {
		if r.format == "" {
			r.format = f
		}
	}
	for step := 0; step < 8 && text != ""; step++ {
		c := text[0]
		if c >= '0' && c <= '9' && step == 0 {
			if m := reKmsg().FindStringSubmatch(text); m != nil {
				k := kmsgRecord(m)
				return k, true
			}
		}
		if c == '<' {
			if m := rePRI().FindStringSubmatch(text); m != nil && m[0] != "" {
				text = text[len(m[0]):]
				found = true
				if m[2] != "" && m[2] != "-" && r.time.IsZero() {
					r.time, r.raw = parseISO(m[2])
					r.source = "journal"
					setFormat("journal")
					r.kernel = m[3] == "kernel"
					if !r.kernel {
						return r.withText(text), true
					}
				}
				continue
			}
		}
		if c >= 'a' && c <= 'z' {
			if m := reDecode().FindStringSubmatch(text); m != nil {
				text, found = m[3], true
				setFormat("dmesg-iso")
				continue
			}
			if m := reLevelTag().FindStringSubmatch(text); m != nil {
				text, found = m[1], true
				continue
			}
		}
		if m := reSyslogNoHost().FindStringSubmatch(text); m != nil && !inKernel {
			// Same shape as reSyslog's submatches, with no host.
			m = []string{m[0], m[1], "", m[2], m[3]}
			found = true
			if r.time.IsZero() && r.raw == "" {
				if strings.Contains(m[1], "-") {
					r.time, r.raw = parseISO(m[1])
				} else {
					r.raw = m[1]
				}
			}
			r.source = "journal"
			setFormat("journal")
			text = reInnerMono().ReplaceAllString(m[4], "")
			inKernel = true
			continue
		}
		if m := reSyslog().FindStringSubmatch(text); m != nil && !inKernel {
			found = true
			if r.time.IsZero() && r.raw == "" {
				if strings.Contains(m[1], "-") {
					r.time, r.raw = parseISO(m[1])
				} else {
					r.raw = m[1]
				}
			}
			r.source = "journal"
			setFormat("journal")
			tag := m[3]
			if tag != "kernel" {
				r.kernel = false
				return r.withText(m[4]), true
			}
			text = reInnerMono().ReplaceAllString(m[4], "")
			inKernel = true
			continue
		}
		if c >= '0' && c <= '9' || c == '[' {
			if m := reISO().FindStringSubmatch(text); m != nil {
				found = true
				if r.time.IsZero() {
					r.time, r.raw = parseISO(m[1])
					if r.source != "journal" {
						setFormat("dmesg-iso")
					}
				}
				text = m[2]
				continue
			}
		}
		if c == '[' {
			if m := reMono().FindStringSubmatch(text); m != nil {
				found, inKernel = true, true
				if r.time.IsZero() && r.raw == "" {
					r.raw = strings.Replace(m[1], ",", ".", 1)
				}
				setFormat("dmesg")
				text = m[2]
				continue
			}
			if m := reHuman().FindStringSubmatch(text); m != nil {
				found, inKernel = true, true
				if r.time.IsZero() && r.raw == "" {
					r.raw = m[1]
				}
				setFormat("dmesg")
				text = m[2]
				continue
			}
		}
		if m := reCtime().FindStringSubmatch(text); m != nil {
			found, inKernel = true, true
			if r.time.IsZero() && r.raw == "" {
				if t, err := time.Parse("Mon Jan _2 15:04:05 2006", m[1]); err == nil {
					// dmesg -T prints local time without a zone; kiln keeps
					// the clock reading as UTC.
					r.time = t
				} else {
					r.raw = m[1]
				}
			}
			setFormat("dmesg-ctime")
			text = m[2]
			continue
		}
		if rest, ok := strings.CutPrefix(text, "kernel:"); ok {
			text, found, inKernel = strings.TrimLeft(rest, " "), true, true
			text = reInnerMono().ReplaceAllString(text, "")
			continue
		}
		break
	}
	if !inKernel {
		// A wrapper kiln does not know: a collector's node name, address,
		// facility and level. The message starts at "kernel: " or at the
		// first thing only a kernel message starts with.
		if i := strings.Index(text, " kernel: "); i >= 0 && i < 160 {
			pre := text[:i]
			text = text[i+len(" kernel: "):]
			if m := reMono().FindStringSubmatch(text); m != nil {
				if r.time.IsZero() && r.raw == "" {
					r.raw = strings.Replace(m[1], ",", ".", 1)
				}
				text = m[2]
			}
			r.findTime(pre)
			r.source = "journal"
			if r.format == "" {
				r.format = "journal"
			}
			found = true
		} else if loc := anchorAt(text); loc > 0 {
			r.findTime(text[:loc])
			text = text[loc:]
			found = true
		}
	}
	return r.withText(text), found
}

func (r record) withText(s string) record {
	r.text = s
	return r
}

// anchorAt is where a kernel message starts in s past its first byte, or
// -1. A cheap scan for the bytes every anchor holds keeps the expression
// off most lines.
func anchorAt(s string) int {
	if len(s) < 6 || !strings.ContainsAny(s, ":[{") {
		return -1
	}
	if !strings.Contains(s, ": ") && !strings.Contains(s, "[drm") && !strings.Contains(s, "Hardware Error") && !strings.Contains(s, "Linux version") {
		return -1
	}
	loc := reAnchor().FindStringIndex(s)
	if loc == nil {
		return -1
	}
	return loc[0]
}

// findTime reads a time out of a wrapper kiln does not know, when the
// record has none yet.
func (r *record) findTime(pre string) {
	if !r.time.IsZero() || r.raw != "" {
		return
	}
	if m := reFindISO().FindString(pre); m != "" {
		r.time, r.raw = parseISO(strings.Trim(m, "[]"))
		return
	}
	if m := reFindMono().FindStringSubmatch(pre); m != nil {
		r.raw = m[1]
	}
}

var (
	reFindISO  = lazyRegexp(isoTime)
	reFindMono = lazyRegexp(`\[\s*(\d{1,12}\.\d{1,9})\]`)
)

func kmsgRecord(m []string) record {
	r := record{source: "kmsg", format: "kmsg", kernel: true}
	if us, err := strconv.ParseUint(m[3], 10, 64); err == nil {
		r.raw = strconv.FormatUint(us/1e6, 10) + "." + leftPad(strconv.FormatUint(us%1e6, 10), 6)
	}
	text := reKmsgEscape().ReplaceAllStringFunc(m[4], func(s string) string {
		b, err := strconv.ParseUint(s[2:], 16, 8)
		if err != nil {
			return s
		}
		return string(rune(b))
	})
	parts := strings.Split(text, "\n")
	r.text = parts[0]
	for _, p := range parts[1:] {
		r.addMore(p)
	}
	return r
}

func leftPad(s string, n int) string {
	for len(s) < n {
		s = "0" + s
	}
	return s
}

// parseISO reads "2025-01-17T15:36:15,345059+00:00", "2025-01-17
// 15:36:15.123 UTC", "2025-01-17T15:36:15Z" and the same without a zone
// (taken as UTC); when it cannot, the text is returned as the raw time.
func parseISO(s string) (time.Time, string) {
	v := strings.Replace(s, ",", ".", 1)
	if len(v) > 10 && v[10] == ' ' {
		v = v[:10] + "T" + v[11:]
	}
	for _, z := range []string{" UTC", " GMT", "UTC", "GMT"} {
		if strings.HasSuffix(v, z) {
			v = strings.TrimSuffix(v, z) + "Z"
			break
		}
	}
	v = strings.Replace(v, " +", "+", 1)
	v = strings.Replace(v, " -", "-", 1)
	for _, layout := range []string{"2006-01-02T15:04:05Z07:00", "2006-01-02T15:04:05Z0700", "2006-01-02T15:04:05"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, ""
		}
	}
	return time.Time{}, s
}

// Sniff says whether data looks like a kernel log or a system journal:
// among its first lines, those with a kernel-log or journal header, or that
// start a kernel message, are at least as many as the others. It is the
// most general format kiln reads, so it is tried after every other one.
func Sniff(data []byte) bool {
	kernel, journal, other, strong := 0, 0, 0, 0
	s := string(data[:min(len(data), 256<<10)])
	for i := 0; i < 400 && s != ""; i++ {
		var line string
		line, s, _ = strings.Cut(s, "\n")
		kind, r := parseLine(line, false)
		switch kind {
		case lineSkip, lineCont, lineDict:
			continue
		}
		if r.kernel && strongLine(r.text) {
			strong++
		}
		switch {
		case r.kernel && (r.format != "" || anchorAt(" "+r.text) == 1):
			kernel++
		case r.source == "journal":
			journal++
		default:
			other++
		}
	}
	// A text that quotes the kernel's GPU reports (a collector's output, a
	// tool's log) is read for them too: it is tried last.
	return (kernel+journal > 0 && kernel+journal >= other) || strong > 0
}

// strongLine: a message only the kernel's GPU and PCIe reporting prints.
func strongLine(t string) bool {
	return strings.HasPrefix(t, "NVRM: Xid") || strings.HasPrefix(t, "NVRM: GPU") || strings.HasPrefix(t, "NVRM: The NVIDIA GPU") ||
		(strings.HasPrefix(t, "nvidia-nvswitch") && strings.Contains(t, "SXid")) ||
		strings.Contains(t, ": AER: ") || strings.Contains(t, "PCIe Bus Error") ||
		(strings.HasPrefix(t, "amdgpu ") && strings.Contains(t, ": amdgpu: ")) || strings.Contains(t, "[Hardware Error]")
}
