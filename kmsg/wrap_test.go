package kmsg

import (
	"os"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/snapshot"
)

// TestWrappers: the same kernel message inside every wrapper admins and
// their tools put around it is read as the same event, with the time where
// the wrapper gives one.
func TestWrappers(t *testing.T) {
	const msg = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
	at := time.Date(2025, 2, 27, 15, 10, 2, 0, time.UTC)
	tests := []struct {
		name, line string
		source     string
		raw        string
		time       time.Time
	}{
		{"dmesg", "[ 1843.308145] " + msg, "dmesg", "1843.308145", time.Time{}},
		{"dmesg -r", "<4>[ 1843.308145] " + msg, "dmesg", "1843.308145", time.Time{}},
		{"dmesg -T", "[Thu Feb 27 15:10:02 2025] " + msg, "dmesg", "", at},
		{"dmesg -T, German", "[Do Feb 27 15:10:02 2025] " + msg, "dmesg", "Do Feb 27 15:10:02 2025", time.Time{}},
		{"dmesg -H", "[Feb27 15:10] " + msg, "dmesg", "Feb27 15:10", time.Time{}},
		{"dmesg -d delta", "[<    0.000123>] " + msg, "dmesg", "0.000123", time.Time{}},
		{"dmesg --time-format iso", "2025-02-27T15:10:02,000000+00:00 " + msg, "dmesg", "", at},
		{"dmesg -x --time-format iso", "kern  :warn  : 2025-02-27T15:10:02,000000+00:00 " + msg, "dmesg", "", at},
		{"journalctl -k", "Feb 27 15:10:02 gpu-07 kernel: " + msg, "journal", "Feb 27 15:10:02", time.Time{}},
		{"journalctl -k, single-digit day", "Mar  5 15:10:02 gpu-07 kernel: " + msg, "journal", "Mar  5 15:10:02", time.Time{}},
		{"journalctl -k, French", "févr. 27 15:10:02 gpu-07 kernel: " + msg, "journal", "févr. 27 15:10:02", time.Time{}},
		{"journalctl -k, Chinese", "2月 27 15:10:02 gpu-07 kernel: " + msg, "journal", "2月 27 15:10:02", time.Time{}},
		{"journalctl -o short-precise", "Feb 27 15:10:02.123456 gpu-07 kernel: " + msg, "journal", "Feb 27 15:10:02.123456", time.Time{}},
		{"journalctl -o short-iso", "2025-02-27T15:10:02+0000 gpu-07 kernel: " + msg, "journal", "", at},
		{"journalctl -o short-iso-precise", "2025-02-27T15:10:02.000000+00:00 gpu-07 kernel: " + msg, "journal", "", at},
		{"syslog without a host name", "Feb 27 15:10:02 kernel: " + msg, "journal", "Feb 27 15:10:02", time.Time{}},
		{"grep -H of a syslog file", "/var/log/syslog:Feb 27 15:10:02 gpu-07 kernel: [ 1843.308145] " + msg, "journal", "1843.308145", time.Time{}},
		{"syslog with printk time", "Feb 27 15:10:02 gpu-07 kernel: [ 1843.308145] " + msg, "journal", "Feb 27 15:10:02", time.Time{}},
		{"RFC 5424", "<4>1 2025-02-27T15:10:02Z gpu-07 kernel - - - " + msg, "journal", "", at},
		{"collector: node, facility, level", "gpu-07 10.0.3.17 kern warning " + msg, "dmesg", "", time.Time{}},
		{"collector: time, node, kern.warn", "2025-02-27T15:10:02.000000000Z gpu-07 kern.warn kernel: [ 1843.308145] " + msg, "journal", "", at},
		{"collector: bracketed node", "[gpu-07] [ 1843.308145] " + msg, "dmesg", "1843.308145", time.Time{}},
		{"collector: CRI wrapper", "2025-02-27T15:10:02Z stdout F [ 1843.308145] " + msg, "dmesg", "", at},
		{"pasted indented", "    [ 1843.308145] " + msg, "dmesg", "1843.308145", time.Time{}},
		{"ANSI colour and CR", "\x1b[32m[ 1843.308145]\x1b[0m \x1b[1m" + msg + "\x1b[0m\r", "dmesg", "1843.308145", time.Time{}},
		{"kern.warn level tag", "kern.warn: " + msg, "dmesg", "", time.Time{}},
		{"no time at all", msg, "dmesg", "", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := parseString(t, tt.line+"\n")
			if len(l.Events) != 1 {
				t.Fatalf("%d events, want 1: %+v", len(l.Events), l.Events)
			}
			e := l.Events[0]
			if e.Kind != snapshot.EventXid || e.Code != 79 || e.Device != "0000:3b:00.0" || e.Process != "python3" {
				t.Errorf("event %+v", e)
			}
			if e.Source != tt.source || e.RawTime != tt.raw || !e.Time.Equal(tt.time) {
				t.Errorf("source %q raw %q time %v, want %q %q %v", e.Source, e.RawTime, e.Time, tt.source, tt.raw, tt.time)
			}
		})
	}
}

// TestISOLinesAreKernel: dmesg --time-format iso lines whose message starts
// with a driver and an address are the kernel's, not a program's syslog
// line ("pcieport" is no host, "0000" no program).
func TestISOLinesAreKernel(t *testing.T) {
	l := parseString(t, "2025-02-28T11:46:25,000000+00:00 pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010\n"+
		"2025-02-28T11:46:25,000000+00:00 pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=0010(Receiver ID)\n")
	n := parseString(t, "2025-02-28T11:46:25,000000+00:00 NVRM: RmInitAdapter: Cannot initialize GSP firmware RM\n"+
		"2025-02-28T11:46:25,000000+00:00 NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)\n")
	if len(n.Events) != 1 || n.Events[0].Kind != snapshot.EventInitFailed || n.Events[0].Device != "0000:98:00.0" {
		t.Errorf("init failure: events %+v", n.Events)
	}
	if len(l.Events) != 1 || l.Events[0].Kind != snapshot.EventAER || l.Events[0].Port != "0000:00:02.0" || l.Events[0].Device != "0000:00:02.0" {
		t.Errorf("events %+v", l.Events)
	}
}

// TestWrappedNotKernel: a program's line that quotes a kernel message is not
// the kernel's event.
func TestWrappedNotKernel(t *testing.T) {
	for _, line := range []string{
		"Feb 27 15:10:02 n1 nv-fabricmanager[29850]: NVRM: Xid (PCI:0000:9b:00): 79, quoted",
		"2025-02-27T15:10:02+0000 n1 gpud[77]: NVRM: Xid (PCI:0000:9b:00): 79, quoted",
		"<30>1 2025-02-27T15:10:02Z n1 gpud 77 - - NVRM: Xid (PCI:0000:9b:00): 79, quoted",
	} {
		if l := parseString(t, line+"\n"); len(l.Events) != 0 {
			t.Errorf("%q: events %+v, want none", line, l.Events)
		}
	}
}

// TestSniffWithoutTimes: dmesg -t prints no time at all; a log is still a
// kernel log by its messages (here a crash, as pstore keeps it).
func TestSniffWithoutTimes(t *testing.T) {
	b, err := os.ReadFile(captures + "supermicro-sysrq-crash-erst-raw.log")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		r, ok := readHeaders(line)
		if ok {
			line = r.text
		}
		out = append(out, line)
	}
	plain := strings.Join(out, "\n")
	if strings.Contains(plain, "kern  :") || strings.Contains(plain, "\n2025-01-17T") {
		t.Fatal("times left in the stripped log")
	}
	if !Sniff([]byte(plain)) {
		t.Error("a kernel log without times is not taken for one")
	}
}
