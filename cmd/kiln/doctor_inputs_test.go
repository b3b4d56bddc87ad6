package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/doctor"
	"sigs.k8s.io/yaml"
)

// TestDoctorLogWithoutGPU: a kernel log that names no GPU is read, and the
// report says what was read and that no GPU event was found, exit 0, in
// every output format.
func TestDoctorLogWithoutGPU(t *testing.T) {
	path := filepath.Join(capturesDir, "dmesg", "a800-host-journalctl-short-iso-docker-no-gpu.log")
	for _, format := range []string{"text", "json", "yaml"} {
		out, stderr, code := kiln(t, "doctor", "--from", path, "-o", format)
		if code != 0 {
			t.Fatalf("-o %s: exit %d (%s)", format, code, stderr)
		}
		var rep doctor.Report
		switch format {
		case "json":
			if err := json.Unmarshal(out, &rep); err != nil {
				t.Fatal(err)
			}
		case "yaml":
			if err := yaml.Unmarshal(out, &rep); err != nil {
				t.Fatal(err)
			}
		default:
			if !strings.Contains(string(out), "No problems found.") || !strings.Contains(string(out), "no GPU event") {
				t.Errorf("-o text:\n%s", out)
			}
			continue
		}
		if len(rep.Sources) != 1 || rep.Findings == nil || len(rep.Findings) != 0 {
			t.Errorf("-o %s: sources %v findings %v", format, rep.Sources, rep.Findings)
		}
		if !strings.Contains(strings.Join(rep.Notes, "\n"), "no GPU event") {
			t.Errorf("-o %s: notes %q do not say that no GPU event was found", format, rep.Notes)
		}
	}
}

// TestDoctorJSONAlwaysReports: with an input that cannot be read, -o json
// still prints a report (exit 3) with the error inside; with one readable
// input beside it, the report covers that one.
func TestDoctorJSONAlwaysReports(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(junk, []byte("what I did today\nnothing much\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "gone.log")
	out, _, code := kiln(t, "doctor", "--from", junk, "--from", missing, "-o", "json")
	if code != doctor.ExitCannot {
		t.Errorf("exit %d, want %d", code, doctor.ExitCannot)
	}
	var rep doctor.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("no report on stdout: %v\n%s", err, out)
	}
	if len(rep.Errors) != 2 || rep.Findings == nil {
		t.Errorf("errors %q findings %v, want both inputs' errors and an empty list", rep.Errors, rep.Findings)
	}
	good := filepath.Join(capturesDir, "dmesg", "h100-xid119-gsp-rpc-timeout.log")
	out, _, code = kiln(t, "doctor", "--from", junk, "--from", good, "-o", "json")
	rep = doctor.Report{}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if code != doctor.ExitCannot || len(rep.Errors) != 1 || len(rep.Findings) == 0 {
		t.Errorf("exit %d errors %q findings %d: want the readable log's findings and the other's error", code, rep.Errors, len(rep.Findings))
	}
}

// TestDoctorTwoMachines: captures of two machines are audited apart, each
// finding naming its machine; inventory refuses to merge them.
func TestDoctorTwoMachines(t *testing.T) {
	a := filepath.Join(capturesDir, "nvidia-smi-q", "h100x8-535.183.01-gpu75-slowdown.txt")
	b := filepath.Join(capturesDir, "dmesg", "h100-xid119-gsp-rpc-timeout.log")
	out, stderr, code := kiln(t, "doctor", "--from", a, "--from", b, "-o", "json")
	var rep doctor.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v (%s)", err, stderr)
	}
	if len(rep.Machines) != 2 {
		t.Fatalf("%d machines, want 2", len(rep.Machines))
	}
	if code != doctor.ExitCritical {
		t.Errorf("exit %d, want 2 (the Xid 119 on the second machine)", code)
	}
	for _, f := range rep.Findings {
		if f.Machine == "" {
			t.Errorf("finding %s names no machine", f.ID)
		}
		if f.ID == "xid-error" && f.Machine != rep.Machines[1].Label {
			t.Errorf("Xid 119 is on %q, want the kernel log's machine %q", f.Machine, rep.Machines[1].Label)
		}
	}
	text, _, _ := kiln(t, "doctor", "--from", a, "--from", b)
	if !strings.Contains(string(text), "These inputs are of 2 machines") {
		t.Errorf("text output does not say there are two machines:\n%s", text)
	}
	_, stderr, code = kiln(t, "inventory", "--from", a, "--from", b)
	if code == 0 || !strings.Contains(stderr, "look like 2 machines") {
		t.Errorf("inventory of two machines: exit %d, %s", code, stderr)
	}
}

// TestDoctorTextEscapesCaptureStrings: strings that come from a capture (a
// host name file in an sosreport, tar member names) cannot drive the
// reader's terminal: control characters are printed escaped.
func TestDoctorTextEscapesCaptureStrings(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	log, err := os.ReadFile(filepath.Join(capturesDir, "dmesg", "h100-xid119-gsp-rpc-timeout.log"))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"sos/sos_commands/kernel/dmesg\x1b[2J": string(log),
		"sos/hostname":                         "\x1b]0;pwned\x07gpu01\x1b[31m\n",
	} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	zw.Close()
	p := filepath.Join(dir, "sosreport.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, _ := kiln(t, "doctor", "--from", p)
	if bytes.ContainsAny(out, "\x1b\x07") || strings.ContainsAny(stderr, "\x1b\x07") {
		t.Errorf("control characters reach the terminal:\n%q\n%q", out, stderr)
	}
	if !bytes.Contains(out, []byte(`\x1b`)) {
		t.Errorf("the escaped host name is not shown:\n%s", out)
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"GPU 0 (0000:3b:00.0)":  "GPU 0 (0000:3b:00.0)",
		"Température\t45 °C":    "Température\t45 °C",
		"\x1b]0;x\x07host":      `\x1b]0;x\x07host`,
		"a\u009bb":              `a\x9bb`,
		"bad \xff byte, \uFFFD": `bad \xff byte, ` + "\uFFFD",
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}
