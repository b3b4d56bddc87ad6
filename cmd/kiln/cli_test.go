package main

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"kiln.dev/kiln/doctor"
)

func TestNoGPUSaysSoAndExits3(t *testing.T) {
	root := t.TempDir()
	// A machine with a PCI bus but no GPU: one network card.
	dev := filepath.Join(root, "sys/devices/pci0000:00/0000:00:03.0")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, v := range map[string]string{"vendor": "0x8086\n", "device": "0x100e\n", "class": "0x020000\n"} {
		if err := os.WriteFile(filepath.Join(dev, f), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "sys/bus/pci/devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:00/0000:00:03.0", filepath.Join(root, "sys/bus/pci/devices/0000:00:03.0")); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := kiln(t, "doctor", "--root", root, "--no-nvml", "--kernel-log", os.DevNull)
	if code != doctor.ExitCannot {
		t.Fatalf("exit %d, want %d; stdout %s", code, doctor.ExitCannot, out)
	}
	for _, want := range []string{"found no GPU", "It looked at", root} {
		if !strings.Contains(stderr, want) {
			t.Errorf("message lacks %q:\n%s", want, stderr)
		}
	}
}

func TestBadInputGivesClearErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "notes.txt")
	os.WriteFile(garbage, []byte("shopping list: eggs, milk\n"), 0o644)
	empty := filepath.Join(dir, "empty.txt")
	os.WriteFile(empty, nil, 0o644)
	badjson := filepath.Join(dir, "snap.json")
	os.WriteFile(badjson, []byte(`{"schema_version": 99, "gpus": []}`), 0o644)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"doctor", "--from", filepath.Join(dir, "missing.txt")}, "no such file"},
		{[]string{"doctor", "--from", garbage}, "not a capture format"},
		{[]string{"inventory", "--from", empty}, "empty"},
		{[]string{"topo", "--from", badjson}, "newer than this kiln"},
		{[]string{"doctor", "-o", "xml", "--from", garbage}, "-o xml"},
		{[]string{"topo", "--format", "png"}, "--format"},
	}
	for _, c := range cases {
		_, stderr, code := kiln(t, c.args...)
		if code != 3 {
			t.Errorf("%v: exit %d, want 3", c.args, code)
		}
		if !strings.Contains(stderr, c.want) {
			t.Errorf("%v: error %q lacks %q", c.args, stderr, c.want)
		}
		if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine") {
			t.Errorf("%v: panicked: %s", c.args, stderr)
		}
	}
}

const (
	h100q    = capturesDir + "/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"
	topo4090 = capturesDir + "/nvidia-smi-topo/rtx4090x8-all-sys-topo-m.txt"
	hgxLspci = capturesDir + "/lspci/h100-hgx-x8-lspci-vvv.txt"
)

func TestDoctorTextAndYAML(t *testing.T) {
	out, _, code := kiln(t, "doctor", "--from", h100q)
	if code != doctor.ExitWarning {
		t.Fatalf("exit %d", code)
	}
	txt := string(out)
	for _, want := range []string{"WARNING", "[hw-slowdown]", "0000:75:00.0", "fix:", "evidence:"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text report lacks %q:\n%s", want, txt)
		}
	}
	if strings.Contains(txt, "\x1b[") {
		t.Error("colour codes written to a non-terminal")
	}
	out, _, _ = kiln(t, "doctor", "--from", h100q, "-o", "yaml")
	var rep doctor.Report
	if err := yaml.Unmarshal(out, &rep); err != nil || len(rep.Findings) == 0 || rep.GPUs != 8 {
		t.Fatalf("yaml: %v %+v", err, rep)
	}
}

func TestDoctorList(t *testing.T) {
	out, _, code := kiln(t, "doctor", "--list")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, id := range []string{"pcie-link-downtrained", "xid-error", "mig-stranded", "no-p2p-path", "capture-incomplete"} {
		if !strings.Contains(string(out), id) {
			t.Errorf("--list lacks %s", id)
		}
	}
}

func TestTopoOutputs(t *testing.T) {
	out, stderr, code := kiln(t, "topo", "--from", topo4090)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	txt := string(out)
	if !strings.Contains(txt, "SYS") || !strings.Contains(txt, "GPU7") {
		t.Errorf("matrix lacks classes:\n%s", txt)
	}
	// Every GB/s is labelled.
	for _, line := range strings.Split(txt, "\n") {
		rest := line
		for {
			i := strings.Index(rest, "GB/s")
			if i < 0 {
				break
			}
			after := rest[i+4:]
			if !strings.HasPrefix(after, " (uni)") && !strings.HasPrefix(after, " (bidi)") {
				t.Errorf("bare GB/s in %q", line)
			}
			rest = after
		}
	}
	out, _, code = kiln(t, "topo", "--from", hgxLspci, "-o", "json")
	if code != 0 {
		t.Fatal(code)
	}
	var m struct {
		Devices []struct{ Kind string } `json:"devices"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	gpus := 0
	for _, d := range m.Devices {
		if d.Kind == "gpu" {
			gpus++
		}
	}
	if gpus != 8 {
		t.Errorf("topo json has %d GPUs", gpus)
	}
	out, _, code = kiln(t, "topo", "--from", hgxLspci, "--format", "svg")
	if code != 0 || xml.Unmarshal(out, new(struct{ XMLName xml.Name })) != nil || !strings.Contains(string(out), "<svg") {
		t.Errorf("svg: exit %d, %.200s", code, out)
	}
	out, _, code = kiln(t, "topo", "--from", hgxLspci, "--format", "dot")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(string(out)), "graph") && !strings.Contains(string(out), "graph ") {
		t.Errorf("dot: exit %d, %.200s", code, out)
	}
}

func TestInventoryMergesCaptures(t *testing.T) {
	out, stderr, code := kiln(t, "inventory", "--from", h100q, "--from", capturesDir+"/fabricmanager/hgx-fabricmanager-nvswitch-nonfatal.log", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var s struct {
		GPUs []struct {
			PCIAddress string `json:"pci_address"`
		} `json:"gpus"`
		Events []struct{ Code int } `json:"events"`
	}
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 8 || len(s.Events) != 1 || s.Events[0].Code != 12028 {
		t.Fatalf("merged: %d GPUs, %d events", len(s.GPUs), len(s.Events))
	}
	txt, _, _ := kiln(t, "inventory", "--from", h100q)
	if !strings.Contains(string(txt), "0000:75:00.0") || !strings.Contains(string(txt), "Gen5 x16") {
		t.Errorf("inventory text:\n%s", txt)
	}
}
