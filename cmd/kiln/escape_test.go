package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
)

// evil holds what a member or an agent could put in a string the server
// stores: a terminal title and clipboard write (OSC), a cursor move that
// overwrites the line above, a bell, a carriage return, a C1 control
// character, a tab that would open a new table column, invalid UTF-8.
const evil = "x\x1b]0;owned\x07\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b[1A\x1b[2Ksafe\rok\u009b31m\tcol\xff"

// checkEscaped fails when out holds a control character other than the
// newlines it writes itself and, outside tables (which pad with spaces, so
// a tab there would open a column), tabs.
func checkEscaped(t *testing.T, what, out string) {
	t.Helper()
	table := strings.Contains(what, "table")
	for i := 0; i < len(out); i++ {
		c := out[i]
		if c < 0x20 && c != '\n' && (c != '\t' || table) || c == 0x7f {
			t.Errorf("%s: raw control character 0x%02x at %d in:\n%q", what, c, i, out)
			return
		}
	}
	if strings.Contains(out, "\u009b") || strings.Contains(out, "\xff") {
		t.Errorf("%s: a C1 control or invalid UTF-8 byte reaches the terminal:\n%q", what, out)
	}
	if !strings.Contains(out, `\x1b]0;owned\x07`) {
		t.Errorf("%s: the escaped form is not shown:\n%q", what, out)
	}
}

func TestTextOutputEscapesControlCharacters(t *testing.T) {
	now := time.Now()
	lease := api.Lease{ID: "l-1", Project: "vision", User: "ana", State: api.LeaseRefused, Reason: "image " + evil + " runs nowhere",
		Request: api.LeaseRequest{GPUs: 1, Job: &api.JobSpec{Image: evil}}, CreatedAt: now}
	granted := api.Lease{ID: "l-2", Project: "vision", User: "ana", State: api.LeaseStopping, Reason: evil,
		Request: api.LeaseRequest{MIG: evil}, Isolation: evil, EndsAt: &now,
		Allocations: []api.Allocation{{Node: "n1", Devices: []api.DeviceGrant{{ID: "gpu0", Model: evil, PCIAddress: evil, Isolation: api.IsolationMPS}}}}}
	node := api.Node{ID: "n1", State: api.NodeReady, Driver: evil, Hostname: evil, LastSeen: now,
		Devices:  []api.Device{{ID: "gpu0", Model: evil, PCIAddress: evil, Island: evil, Isolation: evil, Drained: true, DrainReason: evil, Leases: []string{evil}}},
		Findings: []api.Finding{{ID: evil, Severity: "critical", Title: evil}}}

	var b bytes.Buffer
	writeLeaseTable(&b, []api.Lease{lease, granted})
	checkEscaped(t, "kiln ls table", b.String())
	if strings.Count(b.String(), "\n") != 3 {
		t.Errorf("kiln ls table: a value made extra lines:\n%s", b.String())
	}
	b.Reset()
	writeLeaseText(&b, &granted)
	checkEscaped(t, "kiln lease", b.String())
	b.Reset()
	writeNodeTable(&b, []api.Node{node})
	checkEscaped(t, "kiln nodes table", b.String())
	b.Reset()
	writeNodeDevices(&b, node)
	checkEscaped(t, "kiln nodes NODE (a table)", b.String())
	b.Reset()
	writeGrantLine(&b, &granted)
	checkEscaped(t, "kiln run's grant line", b.String())
	b.Reset()
	sm := 61.5
	exitErr := jobExit(&api.Job{ID: "j-1", State: api.JobFailed, Reason: evil,
		Tasks: []api.Task{{Node: evil, GPU: &api.GPUUse{PeakMemoryBytes: 12 << 30, MeanSMPercent: &sm, Samples: 30, SampleSeconds: 5}}}}, &b)
	if exitErr == nil {
		t.Error("a failed job exits 0")
	}
	if !strings.Contains(b.String(), "used at most 12 GiB of GPU memory, mean SM use 62% (30 samples, every 5s)") {
		t.Errorf("kiln run's GPU use line: %q", b.String())
	}
	checkEscaped(t, "kiln run's job line", b.String())
	b.Reset()
	writeTokenTable(&b, []api.Token{{ID: "t1", User: "ana", Name: evil, Created: now}})
	checkEscaped(t, "kiln token ls table", b.String())
	b.Reset()
	writeProjectTable(&b, []api.Project{{Name: "p", Members: []string{evil}}})
	checkEscaped(t, "kiln token project table", b.String())
}

// TestLogsToTerminal: a job's output shown on a terminal keeps newlines,
// tabs, carriage returns and colours, and loses what could take over the
// terminal (titles, clipboard writes, cursor moves, C1 controls).
func TestLogsToTerminal(t *testing.T) {
	var b bytes.Buffer
	w := &termSafe{w: &b}
	in := "step 1\r\x1b[32mok\x1b[0m\tdone\n" + evil + "\n\x1b]0;t"
	// Written in pieces, split inside the escape sequences.
	for i := 0; i < len(in); i += 3 {
		if _, err := w.Write([]byte(in[i:min(i+3, len(in))])); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	got := b.String()
	if !strings.HasPrefix(got, "step 1\r\x1b[32mok\x1b[0m\tdone\n") {
		t.Errorf("ordinary output changed: %q", got)
	}
	for _, bad := range []string{"\x1b]", "\x07", "\x1b[1A", "\x1b[2K", "\u009b", "\xff"} {
		if strings.Contains(got, bad) {
			t.Errorf("%q reaches the terminal: %q", bad, got)
		}
	}
	if !strings.Contains(got, `\x1b]0;owned\x07`) {
		t.Errorf("the escaped form is not shown: %q", got)
	}
}

// An error of several lines keeps its line breaks; what is in the lines is
// still escaped.
func TestPrintableLines(t *testing.T) {
	got := printableLines("no GPU found\nchecked: /sys/bus/pci\x1b]0;x\x07\r\nlast")
	want := "no GPU found\nchecked: /sys/bus/pci\\x1b]0;x\\x07\nlast"
	if got != want {
		t.Errorf("printableLines = %q, want %q", got, want)
	}
}
