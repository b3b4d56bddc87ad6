package capture

import (
	"bytes"
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/unwrap"
)

// nvidia-bug-report.sh writes one log of the whole machine: nvidia-smi -q,
// lspci, the kernel log, journal excerpts, /proc/driver/nvidia, module
// parameters, X and installer logs, each in a section that starts after a
// ruler of underscores with "*** /path" (a file) or the command line. kiln
// reads every section in a format it knows as a capture of one machine.

// hasBugReportHeader: the log's first lines name it.
func hasBugReportHeader(data []byte) bool {
	head := data[:min(len(data), 4096)]
	return bytes.Contains(head, []byte("nvidia-bug-report.sh")) || bytes.Contains(head, []byte("Start of NVIDIA bug report log file"))
}

type bugSection struct {
	header string
	body   []byte
}

// maxSections bounds the sections read from one log.
const maxSections = 10000

func splitBugReport(data []byte) []bugSection {
	var out []bugSection
	var cur *bugSection
	var body []byte
	flush := func() {
		if cur != nil {
			cur.body = body
			out = append(out, *cur)
		}
		cur, body = nil, nil
	}
	wantHeader := false
	forEachLine(data, func(line []byte) bool {
		t := bytes.TrimSpace(line)
		if len(t) >= 20 && len(bytes.Trim(t, "_")) == 0 {
			flush()
			if len(out) >= maxSections {
				return false
			}
			cur, wantHeader = &bugSection{}, true
			return true
		}
		if cur == nil {
			return true
		}
		if wantHeader {
			if len(t) == 0 {
				return true
			}
			wantHeader = false
			cur.header = string(bytes.TrimPrefix(t, []byte("*** ")))
			return true
		}
		if bytes.HasPrefix(t, []byte("*** ls: ")) && len(body) == 0 {
			return true
		}
		body = append(body, line...)
		body = append(body, '\n')
		return true
	})
	flush()
	return out
}

// forEachLine calls fn with each line of data (without its end of line)
// until fn returns false.
func forEachLine(data []byte, fn func([]byte) bool) {
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if !fn(bytes.TrimRight(line, "\r")) {
			return
		}
	}
}

var (
	reBugUname      = lazy(`(?m)^uname: \S+ (\S+) `)
	reProcNVVersion = lazy(`NVRM version: NVIDIA UNIX (Open )?\S* ?Kernel Module(?: for \S+)?\s+(\d{2,4}\.\d{1,3}(?:\.\d{1,3})?)`)
)

// kernelLogSection says whether a section holds the kernel log or the
// system journal (not an X server's journal).
func kernelLogSection(h string) bool {
	l := strings.ToLower(h)
	if strings.Contains(l, "_comm=") || strings.Contains(l, "xorg") {
		return false
	}
	for _, k := range []string{"dmesg", "journalctl", "kern.log", "/var/log/messages", "/var/log/syslog", "scanning kernel log"} {
		if strings.Contains(l, k) {
			return true
		}
	}
	return false
}

func readBugReport(name string, data []byte) []Part {
	data = unwrap.Clean(data).Data
	if stripped, _, ok := unwrap.StripPrefix(data); ok {
		// A report that went through a collector: every line carries its
		// prefix, the section rulers too.
		data = stripped
	}
	secs := splitBugReport(data)
	host := ""
	if m := reBugUname().FindSubmatch(data[:min(len(data), 8192)]); m != nil {
		host = string(m[1])
	}
	var parts []Part
	seen := map[string]bool{}
	base := snapshot.New()
	base.Host.Hostname = host
	for _, sec := range secs {
		h := sec.header
		if h == "" || strings.HasSuffix(h, "does not exist") || len(bytes.TrimSpace(sec.body)) == 0 {
			continue
		}
		member := name + ": " + h
		if strings.Contains(h, "/proc/driver/nvidia") && strings.HasSuffix(h, "/version") {
			if m := reProcNVVersion().FindSubmatch(sec.body); m != nil {
				base.Drivers.NVIDIAKernel = string(m[2])
				base.Drivers.NVIDIAOpenKernel = snapshot.Ptr(len(m[1]) > 0)
			}
			continue
		}
		s, err := parseBytes(member, sec.body, kernelLogSection(h))
		if err != nil {
			continue
		}
		if s.Sources[0].Kind == "dmesg" {
			// The same kernel lines are in dmesg, the journal and
			// kern.log: each event counts once.
			kept := s.Events[:0]
			for _, e := range s.Events {
				k := fmt.Sprintf("%s|%d|%s|%s", e.Kind, e.Code, e.Device, e.Message)
				if seen[k] {
					continue
				}
				seen[k] = true
				kept = append(kept, e)
			}
			s.Events = kept
		}
		if s.Host.Hostname == "" {
			s.Host.Hostname = host
		}
		parts = append(parts, Part{Path: member, Kind: s.Sources[0].Kind, Bundle: name, Snapshot: s})
	}
	// base comes first: the driver /proc/driver/nvidia/version names is the
	// one loaded now, where the log's older boots may have run another.
	base.Sources = []snapshot.Source{{Kind: "nvidia-bug-report", Path: name}}
	base.SchemaVersion = snapshot.SchemaVersion
	if len(parts) == 0 && base.Drivers.NVIDIAKernel == "" {
		return []Part{{Path: name, Err: fmt.Errorf("%s: an nvidia-bug-report log with no section in a format kiln reads (%d sections)", name, len(secs))}}
	}
	base.Notes = append(base.Notes, snapshot.Note{Source: "nvidia-bug-report",
		Message: fmt.Sprintf("read %d of its %d sections as captures of one machine", len(parts), len(secs))})
	return append([]Part{{Path: name, Kind: "nvidia-bug-report", Bundle: name, Snapshot: base}}, parts...)
}
