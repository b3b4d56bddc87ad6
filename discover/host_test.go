package discover

import (
	"reflect"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func TestParseOSRelease(t *testing.T) {
	in := "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\n# comment\nID=ubuntu\nID_LIKE=debian\nBROKEN\nX='single quoted'\n"
	got := ParseOSRelease(in)
	for k, want := range map[string]string{"PRETTY_NAME": "Ubuntu 22.04.4 LTS", "VERSION_ID": "22.04", "ID": "ubuntu", "X": "single quoted"} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	if _, ok := got["BROKEN"]; ok {
		t.Error("a line without = must be skipped")
	}
}

func TestParseCPUInfo(t *testing.T) {
	in := strings.Repeat("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n\n", 3) +
		"processor\t: x\n"
	model, n := ParseCPUInfo(in)
	if model != "AMD EPYC 9654 96-Core Processor" || n != 3 {
		t.Errorf("got %q %d", model, n)
	}
	// aarch64 has no model name.
	if model, n := ParseCPUInfo("processor\t: 0\nBogoMIPS\t: 2000.00\nCPU part\t: 0xd4f\n"); model != "" || n != 1 {
		t.Errorf("arm: %q %d", model, n)
	}
}

func TestCPUListCount(t *testing.T) {
	for in, want := range map[string]int{"0-63": 64, "0-31,64-95": 64, "0-55,112-167": 112, "5": 1, "0,2,4-5": 4, "": 0} {
		got, err := CPUListCount(in)
		if err != nil || got != want {
			t.Errorf("CPUListCount(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"a-b", "5-1", "0-", "-3", "0-99999999"} {
		if _, err := CPUListCount(bad); err == nil {
			t.Errorf("CPUListCount(%q): want an error", bad)
		}
	}
}

func TestParseMemTotal(t *testing.T) {
	if got := parseMemTotal("MemTotal:       527958280 kB\nMemFree: 1 kB\n", "MemTotal:"); got != 527958280*1024 {
		t.Errorf("meminfo: %d", got)
	}
	if got := parseMemTotal("Node 1 MemTotal:       264135888 kB\n", "MemTotal:"); got != 264135888*1024 {
		t.Errorf("node meminfo: %d", got)
	}
	if got := parseMemTotal("MemTotal: lots\n", "MemTotal:"); got != 0 {
		t.Errorf("bad value: %d", got)
	}
}

func TestParseNVIDIAProcVersion(t *testing.T) {
	tests := []struct {
		in       string
		ver      string
		open, ok bool
	}{
		{"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.154.05  Release Build  (dvs-builder@U16-T02-35-3)  Thu Dec 28 18:44:45 UTC 2023\nGCC version:  gcc 12\n", "535.154.05", true, true},
		{"NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024\n", "550.90.07", false, true},
		{"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  560.35.03\n", "560.35.03", true, true},
		{"GCC version: 12\n", "", false, false},
	}
	for _, tt := range tests {
		v, open, ok := ParseNVIDIAProcVersion(tt.in)
		if v != tt.ver || open != tt.open || ok != tt.ok {
			t.Errorf("%q: got %q %v %v", tt.in, v, open, ok)
		}
	}
}

func TestParseCUDAVersionJSON(t *testing.T) {
	if v := ParseCUDAVersionJSON([]byte(cudaVersionJSON("12.4.131"))); v != "12.4.131" {
		t.Errorf("got %q", v)
	}
	if v := ParseCUDAVersionJSON([]byte("{not json")); v != "" {
		t.Errorf("bad json: %q", v)
	}
}

func TestStatusField(t *testing.T) {
	in := "Name:\tkiln\nCpus_allowed:\tff\nCpus_allowed_list:\t0-7\n"
	if got := statusField(in, "Cpus_allowed_list"); got != "0-7" {
		t.Errorf("got %q", got)
	}
	if got := statusField(in, "Missing"); got != "" {
		t.Errorf("got %q", got)
	}
}

func TestCPUSetNote(t *testing.T) {
	m := consumer2NoP2P()
	m.cpuset = "0-7"
	r := &reader{root: t.TempDir()}
	m.writeTree(t, r.root)
	s := newTestSnapshot()
	readHost(r, s)
	if s.Host.CPUSet != "0-7" || s.Host.OnlineCPUs != "0-63" {
		t.Errorf("cpuset %q online %q", s.Host.CPUSet, s.Host.OnlineCPUs)
	}
	var msgs []string
	for _, n := range s.Notes {
		msgs = append(msgs, n.Message)
	}
	if !reflect.DeepEqual(len(msgs), 1) || !strings.Contains(msgs[0], "8 of the host's 64 online CPUs") {
		t.Errorf("notes = %v", msgs)
	}
}

func newTestSnapshot() *snapshot.Snapshot { return snapshot.New() }
