package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

// The five machine shapes kiln is tested on: three record bundles in
// testdata/fixtures (derived from real machines, see their READMEs) and two
// real captures.
const (
	fxHGX      = "../../testdata/fixtures/h100-hgx8-sysfs"
	fxPCIe4    = "../../testdata/fixtures/pcie4-downtrained-acs"
	fxConsumer = "../../testdata/fixtures/consumer2-nop2p"
	fxMI300X   = capturesDir + "/kfd-topology/mi300x-x8-cpx.tar.gz"
	fxMIGA100  = capturesDir + "/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml"
)

func inventoryOf(t *testing.T, from string) *snapshot.Snapshot {
	t.Helper()
	out, stderr, code := kiln(t, "inventory", "--from", from, "-o", "json")
	if code != 0 {
		t.Fatalf("inventory exit %d: %s", code, stderr)
	}
	s, err := snapshot.Decode(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func topoOf(t *testing.T, from string) *topo.Matrix {
	t.Helper()
	out, stderr, code := kiln(t, "topo", "--from", from, "-o", "json")
	if code != 0 {
		t.Fatalf("topo exit %d: %s", code, stderr)
	}
	var m topo.Matrix
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

func doctorOf(t *testing.T, from string) (*doctor.Report, int) {
	t.Helper()
	out, stderr, code := kiln(t, "doctor", "--from", from, "-o", "json")
	if code == doctor.ExitCannot {
		t.Fatalf("doctor exit %d: %s", code, stderr)
	}
	var rep doctor.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	return &rep, code
}

func findings(rep *doctor.Report, id string) []doctor.Finding {
	var out []doctor.Finding
	for _, f := range rep.Findings {
		if f.ID == id {
			out = append(out, f)
		}
	}
	return out
}

// gpuPairs returns the classes of every GPU pair.
func gpuPairs(m *topo.Matrix) map[string]int {
	classes := map[string]int{}
	var gi []int
	for i, d := range m.Devices {
		if d.Kind == "gpu" {
			gi = append(gi, i)
		}
	}
	for a := 0; a < len(gi); a++ {
		for b := a + 1; b < len(gi); b++ {
			classes[m.Cells[gi[a]][gi[b]].Class]++
		}
	}
	return classes
}

func TestFixtureHGXH100(t *testing.T) {
	s := inventoryOf(t, fxHGX)
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	for _, g := range s.GPUs {
		if len(g.NVLinks) != 18 || g.PCIe == nil || g.PCIe.MaxGen != 5 || len(g.Upstream) != 3 {
			t.Errorf("%s: %d NVLinks, link %+v, upstream %v", g.PCIAddress, len(g.NVLinks), g.PCIe, g.Upstream)
		}
	}
	m := topoOf(t, fxHGX)
	if c := gpuPairs(m); c["NV18"] != 28 {
		t.Errorf("GPU pairs %v, want 28 x NV18", c)
	}
	cell := m.Cells[0][1]
	if cell.GBpsUni != 450 || cell.GBpsBidi != 900 {
		t.Errorf("NV18 H100 pair rated %v uni / %v bidi, want 450 / 900", cell.GBpsUni, cell.GBpsBidi)
	}
	rep, code := doctorOf(t, fxHGX)
	if code != doctor.ExitWarning {
		t.Errorf("exit %d", code)
	}
	if f := findings(rep, "pcie-aer-errors"); len(f) != 1 || f[0].Devices[0] != "0000:19:00.0" {
		t.Errorf("pcie-aer-errors: %+v", f)
	}
	for _, quiet := range []string{"no-p2p-path", "fabric-manager-missing", "nvlink-inactive", "pcie-link-downtrained/warning", "nic-locality", "firmware-mismatch"} {
		id, sev, _ := strings.Cut(quiet, "/")
		for _, f := range findings(rep, id) {
			if sev == "" || f.Severity.String() == sev {
				t.Errorf("healthy HGX reported %s: %s", id, f.Title)
			}
		}
	}
}

func TestFixturePCIe4DowntrainedACS(t *testing.T) {
	s := inventoryOf(t, fxPCIe4)
	if len(s.GPUs) != 4 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	m := topoOf(t, fxPCIe4)
	if c := gpuPairs(m); c["PIX"] != 2 || c["SYS"] != 4 {
		t.Errorf("pairs %v, want 2 PIX (within a switch) and 4 SYS (across sockets)", c)
	}
	rep, code := doctorOf(t, fxPCIe4)
	if code != doctor.ExitWarning {
		t.Errorf("exit %d", code)
	}
	dt := findings(rep, "pcie-link-downtrained")
	var gpuFinding *doctor.Finding
	for i := range dt {
		if len(dt[i].Devices) == 1 && dt[i].Devices[0] == "0000:41:00.0" {
			gpuFinding = &dt[i]
		} else if dt[i].Severity == doctor.Warning {
			t.Errorf("other downtrained warning: %s", dt[i].Title)
		}
	}
	if gpuFinding == nil || gpuFinding.Severity != doctor.Warning || gpuFinding.ImpactPercent == nil || *gpuFinding.ImpactPercent != 50 {
		t.Fatalf("downtrained GPU finding: %+v", gpuFinding)
	}
	if !strings.Contains(gpuFinding.Impact, "50% of rated bandwidth") {
		t.Errorf("impact %q", gpuFinding.Impact)
	}
	acs := findings(rep, "pcie-acs-blocks-p2p")
	if len(acs) != 1 || acs[0].Severity != doctor.Warning {
		t.Fatalf("acs: %+v", acs)
	}
	for _, want := range []string{"0000:41:00.0", "0000:42:00.0", "0000:c1:00.0", "0000:c2:00.0"} {
		if !strings.Contains(strings.Join(acs[0].Devices, " "), want) {
			t.Errorf("acs finding lacks %s: %v", want, acs[0].Devices)
		}
	}
	if len(findings(rep, "pcie-replays")) != 1 || len(findings(rep, "no-p2p-path")) != 0 {
		t.Errorf("replays/no-p2p: %v", rep.Findings)
	}
}

func TestFixtureConsumerNoP2P(t *testing.T) {
	s := inventoryOf(t, fxConsumer)
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs (audio functions are not GPUs)", len(s.GPUs))
	}
	m := topoOf(t, fxConsumer)
	if c := gpuPairs(m); c["NODE"]+c["PHB"]+c["SYS"] != 1 {
		t.Errorf("pair %v, want one pair across host bridges", c)
	}
	rep, _ := doctorOf(t, fxConsumer)
	if f := findings(rep, "no-p2p-path"); len(f) != 1 || f[0].Severity != doctor.Warning {
		t.Errorf("no-p2p-path: %+v", f)
	}
	// Both GPUs idle at Gen1 of Gen4: power saving, not a fault.
	if f := findings(rep, "pcie-link-downtrained"); len(f) != 0 {
		t.Errorf("idle Gen1 reported as downtrained: %+v", f)
	}
}

func TestFixtureMI300X(t *testing.T) {
	s := inventoryOf(t, fxMI300X)
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8 physical (63 partitions)", len(s.GPUs))
	}
	parts := 0
	for _, g := range s.GPUs {
		if g.GFXTarget != "gfx942" || g.Partition == nil || g.Partition.Compute != "CPX" {
			t.Errorf("%s: gfx %q partition %+v", g.PCIAddress, g.GFXTarget, g.Partition)
		}
		parts += len(g.KFDNodes)
	}
	if parts != 63 {
		t.Errorf("%d partitions", parts)
	}
	m := topoOf(t, fxMI300X)
	if c := gpuPairs(m); c["XGMI"] != 28 {
		t.Errorf("pairs %v, want 28 XGMI", c)
	}
	rep, code := doctorOf(t, fxMI300X)
	if code != 0 || len(findings(rep, "no-p2p-path")) != 0 {
		t.Errorf("exit %d, findings %v", code, rep.Findings)
	}
}

func TestFixtureMIGA100(t *testing.T) {
	s := inventoryOf(t, fxMIGA100)
	if len(s.GPUs) != 1 || s.GPUs[0].MIG == nil || !s.GPUs[0].MIG.Enabled || len(s.GPUs[0].MIG.Instances) != 4 {
		t.Fatalf("MIG A100: %+v", s.GPUs)
	}
	rep, _ := doctorOf(t, fxMIGA100)
	f := findings(rep, "mig-stranded")
	if len(f) != 1 || f[0].ImpactPercent == nil || int(*f[0].ImpactPercent+0.5) != 43 {
		t.Fatalf("mig-stranded: %+v", f)
	}
	if !strings.Contains(f[0].Title, "3 of 7") {
		t.Errorf("title %q", f[0].Title)
	}
}
