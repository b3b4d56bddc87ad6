package kmsg

import (
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
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

const isoTime = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)`

var (
	reKmsg       = lazyRegexp(`^(\d{1,4}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$`)
	reKmsgDict   = lazyRegexp(`^ ([A-Z_]+)=(.*)$`)
	reDecode     = lazyRegexp(`^([a-z]+[0-9]?)\s*:\s*(emerg|alert|crit|err|warn|notice|info|debug)\s*: ?(.*)$`)
	reISO        = lazyRegexp(`^(` + isoTime + `) ?(.*)$`)
	reCtime      = lazyRegexp(`^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d \d{4})\] ?(.*)$`)
	reMono       = lazyRegexp(`^\[\s*(\d{1,12}\.\d{1,9})\] ?(.*)$`)
	reSyslog     = lazyRegexp(`^([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d) (\S+) ([^\s:\[]+)(?:\[\d+\])?: ?(.*)$`)
	reSyslogISO  = lazyRegexp(`^(` + isoTime + `) (\S+) kernel: ?(.*)$`)
	reInnerMono  = lazyRegexp(`^\[\s*\d{1,12}\.\d{1,9}\] ?`)
	reKmsgEscape = lazyRegexp(`\\x[0-9a-fA-F]{2}`)
)

// parseLine reads the prefix of one line. prevKmsg says whether the
// previous record came from /dev/kmsg, where lines that start with a space
// are dictionary entries.
func parseLine(line string, prevKmsg bool) (lineKind, record) {
	if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "-- ") {
		return lineSkip, record{}
	}
	if line[0] == ' ' || line[0] == '\t' {
		if prevKmsg && reKmsgDict().MatchString(line) {
			return lineDict, record{text: line}
		}
		return lineCont, record{text: line}
	}
	// The first byte tells which prefixes can match; the regular
	// expressions only run where one can.
	c := line[0]
	digit, upper, lower := c >= '0' && c <= '9', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z'
	if digit {
		if m := reKmsg().FindStringSubmatch(line); m != nil {
			return lineRecord, kmsgRecord(m)
		}
		if m := reSyslogISO().FindStringSubmatch(line); m != nil {
			r := record{source: "journal", format: "journal", kernel: true, text: m[3]}
			r.time, r.raw = parseISO(m[1])
			r.text = reInnerMono().ReplaceAllString(r.text, "")
			return lineRecord, r
		}
	}
	if upper {
		if m := reSyslog().FindStringSubmatch(line); m != nil {
			r := record{raw: m[1], source: "journal", format: "journal", kernel: m[3] == "kernel", text: m[4]}
			r.text = reInnerMono().ReplaceAllString(r.text, "")
			return lineRecord, r
		}
	}
	decoded := false
	if lower {
		if m := reDecode().FindStringSubmatch(line); m != nil {
			line, decoded = m[3], true
			if line == "" {
				return lineRecord, record{source: "dmesg", format: "dmesg-iso", kernel: true}
			}
			c = line[0]
		}
	}
	if c >= '0' && c <= '9' {
		if m := reISO().FindStringSubmatch(line); m != nil {
			r := record{source: "dmesg", format: "dmesg-iso", kernel: true, text: m[2]}
			r.time, r.raw = parseISO(m[1])
			return lineRecord, r
		}
	}
	if c != '[' {
		r := record{source: "dmesg", kernel: true, text: line}
		if decoded {
			r.format = "dmesg-iso"
		}
		return lineRecord, r
	}
	if m := reCtime().FindStringSubmatch(line); m != nil {
		r := record{source: "dmesg", format: "dmesg-ctime", kernel: true, text: m[2]}
		if t, err := time.Parse("Mon Jan _2 15:04:05 2006", m[1]); err == nil {
			// dmesg -T prints local time without a zone; kiln keeps the
			// clock reading as UTC.
			r.time = t
		} else {
			r.raw = m[1]
		}
		return lineRecord, r
	}
	if m := reMono().FindStringSubmatch(line); m != nil {
		return lineRecord, record{raw: m[1], source: "dmesg", format: "dmesg", kernel: true, text: m[2]}
	}
	r := record{source: "dmesg", kernel: true, text: line}
	if decoded {
		r.format = "dmesg-iso"
	}
	return lineRecord, r
}

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

// parseISO reads "2025-01-17T15:36:15,345059+00:00"; when it cannot, the
// text is returned as the raw time.
func parseISO(s string) (time.Time, string) {
	v := strings.Replace(s, ",", ".", 1)
	for _, layout := range []string{"2006-01-02T15:04:05Z07:00", "2006-01-02T15:04:05Z0700"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, ""
		}
	}
	return time.Time{}, s
}

// Sniff says whether data looks like a kernel log: among its first lines,
// lines with a kernel-log prefix are at least as many as lines without.
// Lines of other programs in a syslog file count against it.
func Sniff(data []byte) bool {
	kernel, other, nvrm := 0, 0, 0
	s := string(data[:min(len(data), 256<<10)])
	for i := 0; i < 200 && s != ""; i++ {
		var line string
		line, s, _ = strings.Cut(s, "\n")
		line = strings.TrimRight(line, "\r")
		kind, r := parseLine(line, false)
		switch kind {
		case lineSkip, lineCont, lineDict:
			continue
		}
		if strings.HasPrefix(r.text, "NVRM: ") {
			nvrm++
		}
		if r.format != "" && r.kernel {
			kernel++
		} else {
			other++
		}
	}
	if kernel == 0 {
		// dmesg -t (no timestamps): accept it when NVRM lines make up most
		// of it.
		return nvrm > 0 && nvrm*2 >= other
	}
	return kernel >= other
}
