package kmsg

import (
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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
)

var (
	reKmsg       = lazyRegexp(`^(\d{1,4}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$`)
	reKmsgDict   = lazyRegexp(`^ ([A-Z_]+)=(.*)$`)
	rePRI        = lazyRegexp(`^<(\d{1,3})>(?:1 (` + isoTime + `|-) \S+ (\S+) \S+ \S+ (?:-|\[[^\]]*\])+ ?)?`)
	reCtime      = lazyRegexp(`^\[?((?:[^\s\d\[\]]{2,10}\.?,? )?[^\s\d\[\]]{2,10}\.? {1,2}\d{1,2} \d\d:\d\d:\d\d(?: [A-Z]{3,4})? \d{4})\]? ?(.*)$`)
	reMono       = lazyRegexp(`^\[\s*[+<]?\s*(\d{1,12}[.,]\d{1,9})>?\] ?(.*)$`)
	reHuman      = lazyRegexp(`^\[(` + monthWord + `\s?\d{1,2} \d\d:\d\d(?::\d\d)?)\] ?(.*)$`)
	reLevelTag   = lazyRegexp(`^(?:\[|<)?(?:kern(?:el)?)[.:](?:emerg|alert|crit|err|error|warn|warning|notice|info|debug)(?:\]|>)?:? ?(.*)$`)
	reInnerMono  = lazyRegexp(`^\[\s*\d{1,12}[.,]\d{1,9}\] ?`)
	reKmsgEscape = lazyRegexp(`\\x[0-9a-fA-F]{2}`)
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
		// The most common header by far, dmesg's "[ 1234.567890] ", is read
		// without an expression.
		if c == '[' {
			if raw, rest, ok := monoPrefix(text); ok {
				found, inKernel = true, true
				if r.time.IsZero() && r.raw == "" {
					r.raw = raw
				}
				setFormat("dmesg")
				text = rest
				continue
			}
		}
		// Every other header holds a clock ("15:10:02"), a date
		// ("2025-02-27"), a kmsg record's commas or a syslog priority: the
		// expressions run only where one of those is.
		clock := hasClock(text)
		if c >= '0' && c <= '9' && step == 0 && strings.IndexByte(text[:min(len(text), 48)], ';') > 0 {
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
		if c >= 'a' && c <= 'z' && !inKernel && isFacility(text) {
			if rest, ok := decodePrefix(text); ok {
				text, found = rest, true
				setFormat("dmesg-iso")
				continue
			}
			if m := reLevelTag().FindStringSubmatch(text); m != nil {
				text, found = m[1], true
				continue
			}
		}
		if !clock {
			if rest, ok := strings.CutPrefix(text, "kernel:"); ok {
				text, found, inKernel = strings.TrimLeft(rest, " "), true, true
				text = reInnerMono().ReplaceAllString(text, "")
				continue
			}
			break
		}
		if inKernel {
			break
		}
		if when, _, tag, rest, ok := syslogHead(text); ok {
			found = true
			if r.time.IsZero() && r.raw == "" {
				if strings.Contains(when, "-") {
					r.time, r.raw = parseISO(when)
				} else {
					r.raw = when
				}
			}
			r.source = "journal"
			setFormat("journal")
			if tag != "kernel" {
				r.kernel = false
				return r.withText(rest), true
			}
			text = reInnerMono().ReplaceAllString(rest, "")
			inKernel = true
			continue
		}
		if c >= '0' && c <= '9' || c == '[' {
			if when, rest, ok := isoPrefix(text); ok {
				found = true
				if r.time.IsZero() {
					r.time, r.raw = parseISO(when)
					if r.source != "journal" {
						setFormat("dmesg-iso")
					}
				}
				// dmesg's own --time-format iso ("2025-01-17T15:36:15,345059
				// +00:00", a comma and microseconds) is followed by the
				// message; any other ISO time may be a collector's.
				if len(when) == 32 && when[19] == ',' {
					inKernel = true
				}
				text = rest
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
// -1: the first of the subsystems' own prefixes (NVRM:, nvidia-nvswitch,
// [drm, AER:, amdgpu:, ...) or of a driver's "<driver> <PCI address>: ".
// It is a scan for literals, not an expression: it runs on every line a
// wrapper kiln does not know comes in.
func anchorAt(s string) int {
	if len(s) < 6 {
		return -1
	}
	best := -1
	take := func(i int) {
		if i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	for _, lit := range literalAnchors {
		i := strings.Index(s, lit)
		if i < 0 {
			continue
		}
		if lit == "pci " || lit == "pci_bus " {
			// "pci 0000:19:00.0: ...", not the word inside a sentence.
			rest := s[i+len(lit):]
			if len(rest) < 8 || !isHexString(rest[:4]) || rest[4] != ':' {
				continue
			}
		}
		if i > 0 && isWordByte(s[i-1]) && lit[0] != '[' && lit[0] != '{' {
			continue
		}
		take(i)
	}
	take(devPrintkAt(s))
	return best
}

var literalAnchors = []string{
	"NVRM: ", "nvidia-nvswitch", "nvidia-modeset: ", "nvidia-uvm: ", "nvidia-peermem ", "[drm:", "[drm] ",
	"AER: ", "[Hardware Error]", "amdgpu: ", "Linux version ", "pci ", "pci_bus ",
}

// devPrintkAt finds "<driver> dddd:bb:dd.f: " (a lower-case driver name and
// a PCI address), the prefix of every driver's device messages.
func devPrintkAt(s string) int {
	for off := 0; off < len(s); {
		j := strings.Index(s[off:], ": ")
		if j < 0 {
			return -1
		}
		end := off + j // index of ':' after the address
		off = end + 2
		if end < 12 || s[end-2] != '.' || !isDigit(s[end-1]) || s[end-5] != ':' || s[end-8] != ':' {
			continue
		}
		a := end - 12
		if !isHexString(s[a:a+4]) || !isHexString(s[a+5:a+7]) || !isHexString(s[a+8:a+10]) || a < 3 || s[a-1] != ' ' {
			continue
		}
		d := a - 1
		for d > 0 && (isWordByte(s[d-1]) || s[d-1] == '-') {
			d--
		}
		if d == a-1 || s[d] < 'a' || s[d] > 'z' || a-1-d > 24 {
			continue
		}
		if d > 0 && s[d-1] != ' ' && s[d-1] != ']' && s[d-1] != ':' && s[d-1] != '"' {
			continue
		}
		return d
	}
	return -1
}

func isHexString(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return len(s) > 0
}

func isWordByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
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
		case r.kernel && (r.format != "" || anchorAt(" "+r.text) == 1 || bootLine(r.text)):
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

// bootPrefixes start messages every kernel prints at boot: dmesg -t (no
// times at all) is still recognised by them.
var bootPrefixes = []string{
	"Linux version ", "Command line:", "Kernel command line:", "BIOS-e820:", "BIOS-provided physical RAM map",
	"DMI:", "ACPI:", "ACPI BIOS", "PCI:", "PCI host bridge", "pci_bus ", "pci ", "pcieport ", "usb ", "usbcore:", "x86/", "tsc:",
	"Memory:", "CPU:", "smpboot:", "clocksource:", "random:", "audit:", "EXT4-fs", "XFS (", "nvme ", "NET:", "Freeing unused",
	"Booting paravirtualized", "e820:", "efi:", "SMBIOS ", "Hypervisor detected", "rcu:", "Zone ranges", "Built 1 zonelists",
	"Mount-cache hash", "iommu:", "DMAR:", "AMD-Vi:", "microcode:", "Run /init", "systemd[1]:", "ahci ", "scsi ", "sd ", "ata",
	// and what a kernel prints when it crashes (pstore and ERST dumps).
	"Kernel panic", "sysrq:", "BUG:", "Oops:", "Call Trace:", "<TASK>", "</TASK>", "RIP:", "RSP:", "RAX:", "RBX:", "RDX:", "RBP:",
	"R10:", "R13:", "FS:", "CS:", "CR2:", "Modules linked in:", "Hardware name:", "Code:", "---[ end", "WARNING: CPU:", "Workqueue:",
	"CPU: ", "Tainted:", "Panic#", "Oops#",
}

func bootLine(t string) bool {
	for _, p := range bootPrefixes {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// strongLine: a message only the kernel's GPU and PCIe reporting prints.
func strongLine(t string) bool {
	return strings.HasPrefix(t, "NVRM: Xid") || strings.HasPrefix(t, "NVRM: GPU") || strings.HasPrefix(t, "NVRM: The NVIDIA GPU") ||
		(strings.HasPrefix(t, "nvidia-nvswitch") && strings.Contains(t, "SXid")) ||
		strings.Contains(t, ": AER: ") || strings.Contains(t, "PCIe Bus Error") ||
		(strings.HasPrefix(t, "amdgpu ") && strings.Contains(t, ": amdgpu: ")) || strings.Contains(t, "[Hardware Error]")
}

// monoPrefix reads dmesg's seconds since boot at the start of s: "[
// 1234.567890] ", and the -d/-x delta forms "[  +0.000844] " and
// "[<    0.000123>] ". It returns the seconds as printed (a comma made a
// point) and the text after the header.
func monoPrefix(s string) (raw, rest string, ok bool) {
	i := 1
	for i < len(s) && s[i] == ' ' {
		i++
	}
	if i < len(s) && (s[i] == '+' || s[i] == '<') {
		i++
		for i < len(s) && s[i] == ' ' {
			i++
		}
	}
	start := i
	for i < len(s) && i-start <= 12 && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == start || i >= len(s) || (s[i] != '.' && s[i] != ',') {
		return "", "", false
	}
	dot := i
	i++
	fracStart := i
	for i < len(s) && i-fracStart <= 9 && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == fracStart || i >= len(s) {
		return "", "", false
	}
	end := i
	if s[i] == '>' {
		i++
	}
	if i >= len(s) || s[i] != ']' {
		return "", "", false
	}
	i++
	if i < len(s) && s[i] == ' ' {
		i++
	}
	return s[start:dot] + "." + s[fracStart:end], s[i:], true
}

// hasClock says whether the start of s holds "hh:mm", which every header
// with a time of day has.
func hasClock(s string) bool {
	s = s[:min(len(s), 48)]
	for i := 2; i+2 < len(s); i++ {
		if s[i] == ':' && isDigit(s[i-1]) && isDigit(s[i-2]) && isDigit(s[i+1]) && isDigit(s[i+2]) {
			return true
		}
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isFacility: s starts with a syslog facility name and a colon or a dot
// ("kern  :err   : ", "kern.warn"), as dmesg -x and collectors print them.
func isFacility(s string) bool {
	i := 0
	for i < len(s) && i < 9 && s[i] >= 'a' && s[i] <= 'z' {
		i++
	}
	if i < len(s) && s[i] >= '0' && s[i] <= '7' {
		i++ // local0..local7
	}
	switch s[:i] {
	case "kern", "kernel", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "authpriv", "ftp",
		"local0", "local1", "local2", "local3", "local4", "local5", "local6", "local7":
	default:
		return false
	}
	for i < len(s) && s[i] == ' ' {
		i++
	}
	return i < len(s) && (s[i] == ':' || s[i] == '.')
}

// syslogHead reads a syslog or journal header: a time (syslog's "Feb 27
// 15:10:02" with any locale's month word, optional fractions; or an ISO
// time), then a host and a program ("gpu-07 kernel:", "n1 gpud[77]:"), or
// the program alone ("kernel:"). It is the hand-written form of the
// header's grammar: journals are read a line at a time, and an expression
// per line cost more than the rest of the reader.
func syslogHead(s string) (when, host, tag, rest string, ok bool) {
	i := syslogTime(s)
	if i <= 0 || i >= len(s) || s[i] != ' ' {
		return "", "", "", "", false
	}
	when = s[:i]
	j := i + 1
	tok := j
	for tok < len(s) && s[tok] != ' ' && s[tok] != '\t' {
		tok++
	}
	first := s[j:tok]
	if t, r, ok := programTag(first, s[tok:]); ok && t == "kernel" {
		return when, "", t, r, true
	}
	if first == "" || first[len(first)-1] == ':' || tok >= len(s) {
		return "", "", "", "", false
	}
	host = first
	k := tok + 1
	e := k
	for e < len(s) && s[e] != ' ' && s[e] != '\t' {
		e++
	}
	t, r, ok := programTag(s[k:e], s[e:])
	if !ok {
		return "", "", "", "", false
	}
	return when, host, t, r, true
}

// programTag reads "name:" or "name[pid]:" (tok) and returns the name and
// the text after the colon and one space. A name starts with a letter or _.
func programTag(tok, after string) (name, rest string, ok bool) {
	if tok == "" || tok[len(tok)-1] != ':' {
		// "name:text" with no space is a tag too.
		c := strings.IndexByte(tok, ':')
		if c <= 0 {
			return "", "", false
		}
		after = tok[c+1:] + after
		tok = tok[:c+1]
	}
	tok = tok[:len(tok)-1]
	if b := strings.IndexByte(tok, '['); b > 0 {
		pid := tok[b+1:]
		if len(pid) < 2 || pid[len(pid)-1] != ']' || !allDigits(pid[:len(pid)-1]) {
			return "", "", false
		}
		tok = tok[:b]
	}
	if tok == "" {
		return "", "", false
	}
	if c := tok[0]; !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
		return "", "", false
	}
	for k := 1; k < len(tok); k++ {
		c := tok[k]
		if !(isWordByte(c) || c == '.' || c == '/' || c == '@' || c == '-') {
			return "", "", false
		}
	}
	return tok, strings.TrimPrefix(after, " "), true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

// syslogTime returns the length of the time at the start of s (0: none).
func syslogTime(s string) int {
	if n := isoLen(s); n > 0 {
		return n
	}
	// The month: 2 to 13 characters that are not blanks, digits or
	// separators, or "12月".
	i := 0
	runes := 0
	for i < len(s) && runes < 14 {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == ' ' || r == '\t' || (r >= '0' && r <= '9') || strings.ContainsRune(":[]<>,;=", r) {
			break
		}
		i += size
		runes++
	}
	if runes < 2 || runes > 13 {
		// "12月"
		d := 0
		for d < len(s) && d < 2 && isDigit(s[d]) {
			d++
		}
		if d == 0 || !strings.HasPrefix(s[d:], "月") {
			return 0
		}
		i = d + len("月")
	}
	sp := 0
	for i < len(s) && s[i] == ' ' && sp < 3 {
		i++
		sp++
	}
	if sp < 1 || sp > 2 {
		return 0
	}
	d := 0
	for i < len(s) && d < 3 && isDigit(s[i]) {
		i++
		d++
	}
	if d < 1 || d > 2 {
		return 0
	}
	if strings.HasPrefix(s[i:], "日") {
		i += len("日")
	}
	if i < len(s) && s[i] == ',' {
		i++
	}
	if i >= len(s) || s[i] != ' ' {
		return 0
	}
	i++
	n := clockLen(s[i:])
	if n == 0 {
		return 0
	}
	return i + n
}

// clockLen: "15:10:02" with optional fractions ("15:10:02.123456").
func clockLen(s string) int {
	if len(s) < 8 || !isDigit(s[0]) || !isDigit(s[1]) || s[2] != ':' || !isDigit(s[3]) || !isDigit(s[4]) || s[5] != ':' || !isDigit(s[6]) || !isDigit(s[7]) {
		return 0
	}
	i := 8
	if i < len(s) && (s[i] == '.' || s[i] == ',') {
		j := i + 1
		for j < len(s) && j-i <= 9 && isDigit(s[j]) {
			j++
		}
		if j > i+1 {
			i = j
		}
	}
	return i
}

// isoLen: "2025-01-17T15:36:15,345059+00:00", with a T or a space, optional
// fractions and an optional zone (+hh:mm, +hhmm, Z, UTC, GMT, after an
// optional space).
func isoLen(s string) int {
	if len(s) < 19 || !allDigits(s[0:4]) || s[4] != '-' || !allDigits(s[5:7]) || s[7] != '-' || !allDigits(s[8:10]) || (s[10] != 'T' && s[10] != ' ') {
		return 0
	}
	n := clockLen(s[11:])
	if n == 0 {
		return 0
	}
	i := 11 + n
	z := i
	if z < len(s) && s[z] == ' ' {
		z++
	}
	switch {
	case z+5 <= len(s) && (s[z] == '+' || s[z] == '-') && allDigits(s[z+1:z+3]):
		if z+6 <= len(s) && s[z+3] == ':' && allDigits(s[z+4:z+6]) {
			return z + 6
		}
		if allDigits(s[z+3 : z+5]) {
			return z + 5
		}
	case strings.HasPrefix(s[z:], "UTC"), strings.HasPrefix(s[z:], "GMT"):
		return z + 3
	case z < len(s) && s[z] == 'Z' && z == i:
		return z + 1
	}
	return i
}

// isoPrefix reads an ISO time at the start of s, bracketed or not, with the
// ": " or " " after it.
func isoPrefix(s string) (when, rest string, ok bool) {
	b := 0
	if strings.HasPrefix(s, "[") {
		b = 1
	}
	n := isoLen(s[b:])
	if n == 0 {
		return "", "", false
	}
	when = s[b : b+n]
	i := b + n
	if b == 1 {
		if i >= len(s) || s[i] != ']' {
			return "", "", false
		}
		i++
	}
	if i < len(s) && s[i] == ':' {
		i++
	}
	if i < len(s) && s[i] == ' ' {
		i++
	}
	return when, s[i:], true
}

// decodePrefix reads dmesg -x's "kern  :err   : " (facility, level).
func decodePrefix(s string) (string, bool) {
	i := 0
	for i < len(s) && s[i] >= 'a' && s[i] <= 'z' {
		i++
	}
	if i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return "", false
	}
	for i < len(s) && s[i] == ' ' {
		i++
	}
	if i >= len(s) || s[i] != ':' {
		return "", false
	}
	i++
	for i < len(s) && s[i] == ' ' {
		i++
	}
	l := i
	for i < len(s) && s[i] >= 'a' && s[i] <= 'z' {
		i++
	}
	switch s[l:i] {
	case "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug":
	default:
		return "", false
	}
	for i < len(s) && s[i] == ' ' {
		i++
	}
	if i >= len(s) || s[i] != ':' {
		return "", false
	}
	i++
	if i < len(s) && s[i] == ' ' {
		i++
	}
	return s[i:], true
}
