package topo

import (
	"math"
	"strings"
	"testing"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

func build(t *testing.T, s *snapshot.Snapshot) *Matrix {
	t.Helper()
	m, err := Build(s, kb.Default())
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if len(m.Cells) != len(m.Devices) {
		t.Fatalf("%d rows for %d devices", len(m.Cells), len(m.Devices))
	}
	for i := range m.Cells {
		if m.Cells[i][i].Class != ClassSelf {
			t.Errorf("diagonal %d is %q", i, m.Cells[i][i].Class)
		}
		for j := range m.Cells[i] {
			if m.Cells[i][j] != m.Cells[j][i] {
				t.Errorf("matrix not symmetric at %d,%d", i, j)
			}
			if c := m.Cells[i][j]; c.GBpsBidi != 2*c.GBpsUni {
				t.Errorf("%d,%d: bidi %v is not twice uni %v", i, j, c.GBpsBidi, c.GBpsUni)
			}
		}
	}
	return m
}

type want struct {
	a, b  string
	class string
	kind  string
	uni   float64 // -1: do not check
	basis string  // substring
}

func check(t *testing.T, m *Matrix, ws []want) {
	t.Helper()
	for _, w := range ws {
		c, ok := m.Cell(w.a, w.b)
		if !ok {
			t.Errorf("%s-%s: no such devices in %v", w.a, w.b, names(m))
			continue
		}
		if c.Class != w.class {
			t.Errorf("%s-%s: class %q, want %q (basis %q)", w.a, w.b, c.Class, w.class, c.Basis)
		}
		if w.kind != "" && c.Kind != w.kind {
			t.Errorf("%s-%s: kind %q, want %q", w.a, w.b, c.Kind, w.kind)
		}
		if w.uni >= 0 && math.Abs(c.GBpsUni-w.uni) > 0.01 {
			t.Errorf("%s-%s: %v GB/s per direction, want %v (basis %q)", w.a, w.b, c.GBpsUni, w.uni, c.Basis)
		}
		if w.basis != "" && !strings.Contains(c.Basis, w.basis) {
			t.Errorf("%s-%s: basis %q does not say %q", w.a, w.b, c.Basis, w.basis)
		}
	}
}

func names(m *Matrix) []string {
	var out []string
	for _, d := range m.Devices {
		out = append(out, d.Name)
	}
	return out
}

const (
	gen4x16 = 16 * 1.96923
	gen4x8  = 8 * 1.96923
	gen4x4  = 4 * 1.96923
	gen5x16 = 16 * 3.93846
)

func TestHGXH100AllPairsNV18(t *testing.T) {
	m := build(t, hgxH100())
	if got := len(m.GPUs()); got != 8 {
		t.Fatalf("%d GPUs, want 8", got)
	}
	gpus := m.GPUs()
	for a := range gpus {
		for b := a + 1; b < len(gpus); b++ {
			c := m.Cells[gpus[a]][gpus[b]]
			if c.Class != "NV18" || c.Kind != LinkNVLink || c.Links != 18 || c.GBpsUni != 450 || c.GBpsBidi != 900 {
				t.Errorf("GPU%d-GPU%d = %+v, want NV18 at 450 GB/s per direction, 900 both", a, b, c)
			}
		}
	}
	check(t, m, []want{
		{"GPU0", "GPU7", "NV18", LinkNVLink, 450, "18 x NVLink4 at 25 GB/s (uni) per link"},
		{"GPU0", "GPU1", "NV18", LinkNVLink, 450, "through NVSwitch"},
		{"GPU0", "NIC0", "PIX", LinkPCIe, gen5x16, "PCIe Gen5 x16"},
		{"GPU0", "NIC1", "NODE", LinkPCIe, gen5x16, "within NUMA node 0"},
		{"GPU0", "NIC4", "SYS", LinkPCIe, gen5x16, "across NUMA nodes 0 and 1"},
		// The NVMe drive is Gen4 x4: the slowest hop of the path.
		{"GPU3", "NVME3", "PIX", LinkPCIe, gen4x4, "PCIe Gen4 x4"},
		{"NIC0", "NIC4", "SYS", LinkPCIe, gen5x16, ""},
	})
	c, _ := m.Cell("GPU3", "NVME3")
	if c.Bottleneck != "0000:5c:00.0" {
		t.Errorf("GPU3-NVME3 bottleneck %q, want the NVMe drive 0000:5c:00.0", c.Bottleneck)
	}
	for g, wantNIC := range map[string]string{"GPU0": "NIC0", "GPU5": "NIC5"} {
		nic, class := m.NearestNIC(m.Index(g))
		if nic < 0 || m.Devices[nic].Name != wantNIC || class != ClassPIX {
			t.Errorf("NearestNIC(%s) = %d %q, want %s PIX", g, nic, class, wantNIC)
		}
	}
	d := m.Devices[m.Index("NIC4")]
	if d.Interface != "mlx5_4" || d.NUMANode == nil || *d.NUMANode != 1 || d.CPUAffinity != "56-111,168-223" || d.PCI != "0000:9c:00.0" {
		t.Errorf("NIC4 = %+v", d)
	}
}

// One GPU with a link down reaches the fabric with 17 links: its pairs are
// NV17, the others stay NV18.
func TestHGXOneLinkDown(t *testing.T) {
	s := hgxH100()
	s.GPUs[2].NVLinks[5].State = "inactive"
	m := build(t, s)
	check(t, m, []want{
		{"GPU2", "GPU5", "NV17", LinkNVLink, 425, ""},
		{"GPU0", "GPU5", "NV18", LinkNVLink, 450, ""},
	})
	if !strings.Contains(strings.Join(m.Notes, "\n"), "fewer") {
		t.Errorf("notes do not explain the NV17 pairs: %q", m.Notes)
	}
}

// Without NVLinks the fabric is gone and GPU pairs fall back to PCIe.
func TestHGXFabricDown(t *testing.T) {
	s := hgxH100()
	for i := range s.GPUs {
		s.GPUs[i].NVLinks = nil
	}
	m := build(t, s)
	check(t, m, []want{
		{"GPU0", "GPU1", "NODE", LinkPCIe, gen5x16, ""},
		{"GPU0", "GPU4", "SYS", LinkPCIe, gen5x16, ""},
	})
}

func TestTwoSwitchesTwoSockets(t *testing.T) {
	m := build(t, twoSwitches())
	check(t, m, []want{
		// GPU0 and GPU1: first-level switch plus the nested one.
		{"GPU0", "GPU1", "PXB", LinkPCIe, gen4x16, "through 2 PCIe switches"},
		{"GPU0", "NIC0", "PIX", LinkPCIe, gen4x16, "through one PCIe switch"},
		{"GPU1", "NIC0", "PXB", LinkPCIe, gen4x16, ""},
		// GPU2 and GPU3 share one switch; GPU3 sits behind an x8 port.
		{"GPU2", "GPU3", "PIX", LinkPCIe, gen4x8, "PCIe Gen4 x8"},
		{"GPU0", "GPU3", "SYS", LinkPCIe, gen4x8, "across NUMA nodes 0 and 1"},
		{"GPU0", "GPU2", "SYS", LinkPCIe, gen4x16, ""},
		{"GPU3", "NIC0", "SYS", LinkPCIe, gen4x8, ""},
	})
	c, _ := m.Cell("GPU2", "GPU3")
	if c.Bottleneck != "0000:84:00.0" {
		t.Errorf("GPU2-GPU3 bottleneck %q, want GPU3 0000:84:00.0", c.Bottleneck)
	}
	// GPU2 is rated x16 but trained at x8 now.
	c, _ = m.Cell("GPU0", "GPU2")
	if math.Abs(c.NowGBpsUni-gen4x8) > 0.01 || !strings.Contains(c.Basis, "now Gen4 x8") {
		t.Errorf("GPU0-GPU2 now %v GB/s per direction, basis %q; want Gen4 x8 now", c.NowGBpsUni, c.Basis)
	}
	nic, class := m.NearestNIC(m.Index("GPU3"))
	if m.Devices[nic].Name != "NIC0" || class != "SYS" {
		t.Errorf("NearestNIC(GPU3) = %d %q", nic, class)
	}
}

func TestConsumerGPUsOnRootPorts(t *testing.T) {
	// One root bus: both root ports hang off one host bridge.
	m := build(t, consumerPair(true, 0))
	// Rated Gen4 x16: the GPU's Gen4 cap limits the Gen5 slot.
	check(t, m, []want{{"GPU0", "GPU1", "PHB", LinkPCIe, gen4x16, "through host bridge 0000:00"}})
	c, _ := m.Cell("GPU0", "GPU1")
	if c.NowGBpsUni != 16*0.25 {
		t.Errorf("now %v GB/s per direction, want Gen1 x16 = 4", c.NowGBpsUni)
	}

	// Two root buses of one NUMA node.
	m = build(t, consumerPair(false, 0))
	check(t, m, []want{{"GPU0", "GPU1", "NODE", LinkPCIe, gen4x16, "within NUMA node 0"}})

	// Two root buses and no NUMA information on a two-node host: unknown.
	m = build(t, consumerPair(false, -1))
	check(t, m, []want{{"GPU0", "GPU1", "?", "", 0, ""}})
	if !strings.Contains(strings.Join(m.Notes, "\n"), "NUMA node of a device is unknown") {
		t.Errorf("notes do not explain the unknown: %q", m.Notes)
	}
}

func TestMI210TwoHives(t *testing.T) {
	m := build(t, mi210Hives())
	check(t, m, []want{
		{"GPU0", "GPU1", "XGMI", LinkXGMI, 50, ""},
		{"GPU4", "GPU7", "XGMI", LinkXGMI, 50, ""},
		// Cross-hive pairs have no xGMI path and sit on different sockets.
		{"GPU0", "GPU4", "SYS", LinkPCIe, gen4x16, "across NUMA nodes 0 and 1"},
		{"GPU3", "GPU7", "SYS", LinkPCIe, gen4x16, ""},
	})
	// Order: XGMI beats any PCIe class.
	x, _ := m.Cell("GPU0", "GPU1")
	s, _ := m.Cell("GPU0", "GPU4")
	if x.Rank() >= s.Rank() {
		t.Errorf("XGMI rank %d not better than SYS rank %d", x.Rank(), s.Rank())
	}
}

// Without a generation, xGMI takes the bandwidth the source states.
func TestXGMIStatedBandwidth(t *testing.T) {
	s := mi210Hives()
	for i := range s.Links {
		s.Links[i].Version = 0
	}
	for i := range s.GPUs {
		s.GPUs[i].Model, s.GPUs[i].DeviceID = "Unlisted accelerator", ""
	}
	m := build(t, s)
	check(t, m, []want{{"GPU0", "GPU1", "XGMI", LinkXGMI, 50, "xGMI at 50 GB/s (uni) as the source states it"}})
	for i := range s.Links {
		s.Links[i].BandwidthGBpsUni = 0
	}
	m = build(t, s)
	check(t, m, []want{{"GPU0", "GPU1", "XGMI", LinkXGMI, 0, "not rated"}})
}

// xGMI rated from the knowledge base when the generation is known.
func TestXGMIRatedByGeneration(t *testing.T) {
	s := mi210Hives()
	for i := range s.Links {
		s.Links[i].Version = 4
		s.Links[i].Count = 2
		s.Links[i].BandwidthGBpsUni = 0
	}
	m := build(t, s)
	check(t, m, []want{{"GPU0", "GPU1", "XGMI", LinkXGMI, 128, "2 x xGMI gen4 at 64 GB/s (uni) per link"}})
}

func TestImportedTopoM(t *testing.T) {
	m := build(t, b300TopoM())
	if len(m.GPUs()) != 8 || len(m.Devices) != 16 {
		t.Fatalf("devices %v", names(m))
	}
	check(t, m, []want{
		{"GPU0", "GPU5", "NV18", LinkNVLink, -1, "NV18 as printed by nvidia-smi-topo"},
		{"GPU0", "NIC0", "PXB", LinkPCIe, 0, ""},
		{"GPU0", "NIC1", "NODE", LinkPCIe, 0, ""},
		{"GPU2", "NIC6", "SYS", LinkPCIe, 0, ""},
		{"NIC0", "NIC1", "NODE", LinkPCIe, 0, ""},
	})
	g4 := m.Devices[m.Index("GPU4")]
	if g4.NUMANode == nil || *g4.NUMANode != 1 || g4.CPUAffinity != "64-127,192-255" {
		t.Errorf("GPU4 = %+v, want NUMA 1, CPUs 64-127,192-255", g4)
	}
	if n := m.Devices[m.Index("NIC3")]; n.Interface != "mlx5_bond_3" {
		t.Errorf("NIC3 interface %q", n.Interface)
	}
	for g := 0; g < 8; g++ {
		nic, class := m.NearestNIC(m.GPUs()[g])
		if nic < 0 || m.Devices[nic].Interface != "mlx5_bond_"+string(rune('0'+g)) || class != "PXB" {
			t.Errorf("NearestNIC(GPU%d) = %d %q", g, nic, class)
		}
	}
	// Knowing the model rates the NVLinks: B200 is NVLink5.
	s := b300TopoM()
	for i := range s.GPUs {
		s.GPUs[i].Model = "NVIDIA B200"
	}
	k := kb.Default()
	if mdl, ok := k.GPUByName("NVIDIA B200"); ok && mdl.Interconnect == "nvlink" && mdl.InterconnectGen == 5 {
		m = build(t, s)
		check(t, m, []want{{"GPU0", "GPU5", "NV18", LinkNVLink, 900, "18 x NVLink5"}})
	}
}

// All SYS, as an RTX 4090 server with one root complex per GPU prints it.
func TestImportedAllSYS(t *testing.T) {
	s := snapshot.New()
	mx := &snapshot.TopoMatrix{Source: "nvidia-smi-topo"}
	devs := []string{"GPU0", "GPU1", "GPU2", "NIC0", "NIC1"}
	mx.Devices = devs
	cells := [][]string{
		{"X", "SYS", "SYS", "SYS", "SYS"},
		{"SYS", "X", "SYS", "PHB", "PHB"},
		{"SYS", "SYS", "X", "SYS", "SYS"},
		{"SYS", "PHB", "SYS", "X", "PIX"},
		{"SYS", "PHB", "SYS", "PIX", "X"},
	}
	mx.Cells = cells
	s.Matrix = mx
	for i := 0; i < 3; i++ {
		s.GPUs = append(s.GPUs, snapshot.GPU{Index: i, MatrixName: devs[i],
			PCIe: &snapshot.PCIeLink{MaxGen: 4, MaxWidth: 16}})
	}
	m := build(t, s)
	check(t, m, []want{
		{"GPU0", "GPU1", "SYS", LinkPCIe, gen4x16, "the bridges between are not known"},
		{"GPU1", "NIC0", "PHB", LinkPCIe, gen4x16, ""},
		{"NIC0", "NIC1", "PIX", LinkPCIe, 0, ""},
	})
	nic, class := m.NearestNIC(m.Index("GPU1"))
	if nic != m.Index("NIC0") || class != "PHB" {
		t.Errorf("NearestNIC(GPU1) = %d %q, want NIC0 PHB", nic, class)
	}
	nic, class = m.NearestNIC(m.Index("GPU0"))
	if nic != m.Index("NIC0") || class != "SYS" {
		t.Errorf("NearestNIC(GPU0) = %d %q, want NIC0 SYS", nic, class)
	}
}

// Nothing known: every pair is "?" with a note, nothing is guessed.
func TestUnknownStaysUnknown(t *testing.T) {
	s := snapshot.New()
	s.GPUs = []snapshot.GPU{{Index: 0, PCIAddress: "0000:01:00.0"}, {Index: 1, PCIAddress: "0000:02:00.0"}}
	m := build(t, s)
	check(t, m, []want{{"GPU0", "GPU1", "?", "", 0, ""}})
	if len(m.Notes) == 0 {
		t.Error("no note for the unknown pair")
	}
	if nic, class := m.NearestNIC(0); nic != -1 || class != "" {
		t.Errorf("NearestNIC with no NICs = %d %q", nic, class)
	}
}

// Direct NVLinks between GPU pairs (no NVSwitch), as on 4-GPU boards.
func TestDirectNVLinks(t *testing.T) {
	s := snapshot.New()
	addrs := []string{"0000:07:00.0", "0000:0b:00.0", "0000:48:00.0", "0000:4c:00.0"}
	for i, a := range addrs {
		s.GPUs = append(s.GPUs, snapshot.GPU{Index: i, Vendor: snapshot.VendorNVIDIA, PCIAddress: a})
	}
	// GPU0-GPU1 with 4 links, GPU0-GPU2 with 2, from both GPUs' views.
	add := func(g, peer, n int) {
		for l := 0; l < n; l++ {
			s.GPUs[g].NVLinks = append(s.GPUs[g].NVLinks, snapshot.NVLink{Link: len(s.GPUs[g].NVLinks), State: "active", RemotePCI: addrs[peer], RemoteKind: "gpu"})
		}
	}
	add(0, 1, 4)
	add(1, 0, 4)
	add(0, 2, 2)
	add(2, 0, 2)
	s.Links = append(s.Links, snapshot.Link{A: addrs[2], B: addrs[3], Kind: snapshot.LinkNVLink, Count: 6, Version: 3})
	m := build(t, s)
	check(t, m, []want{
		{"GPU0", "GPU1", "NV4", LinkNVLink, 0, "generation unknown"},
		{"GPU0", "GPU2", "NV2", LinkNVLink, 0, ""},
		{"GPU2", "GPU3", "NV6", LinkNVLink, 150, "6 x NVLink3"},
		{"GPU1", "GPU3", "?", "", 0, ""},
	})
	a, _ := m.Cell("GPU2", "GPU3")
	b, _ := m.Cell("GPU0", "GPU1")
	c, _ := m.Cell("GPU0", "GPU2")
	if !(a.Rank() < b.Rank() && b.Rank() < c.Rank()) {
		t.Errorf("ranks NV6 %d, NV4 %d, NV2 %d: want more links first", a.Rank(), b.Rank(), c.Rank())
	}
}

// GPU.Upstream alone (no PCI entries for the bridges) gives the path.
func TestUpstreamHint(t *testing.T) {
	s := snapshot.New()
	s.GPUs = []snapshot.GPU{
		{Index: 0, PCIAddress: "0000:03:00.0", Upstream: []string{"0000:02:00.0", "0000:01:00.0", "0000:00:01.0"}, PCIe: lnk(4, 16, 4, 16)},
		{Index: 1, PCIAddress: "0000:04:00.0", Upstream: []string{"0000:02:01.0", "0000:01:00.0", "0000:00:01.0"}, PCIe: lnk(4, 16, 4, 16)},
		{Index: 2, PCIAddress: "0000:21:00.0", Upstream: []string{"0000:20:01.0"}, PCIe: lnk(4, 16, 4, 16)},
	}
	m := build(t, s)
	// Bridge kinds are unknown, so each counts as one bridge.
	check(t, m, []want{
		{"GPU0", "GPU1", "PXB", LinkPCIe, gen4x16, ""},
		{"GPU0", "GPU2", "?", "", 0, ""},
	})
}

func TestRank(t *testing.T) {
	order := []Cell{{Class: "X"}, {Class: "NV18", Links: 18}, {Class: "NV12"}, {Class: "NV1"}, {Class: "XGMI"},
		{Class: "PIX"}, {Class: "PXB"}, {Class: "PHB"}, {Class: "NODE"}, {Class: "SYS"}, {Class: "?"}}
	for i := 1; i < len(order); i++ {
		if order[i-1].Rank() >= order[i].Rank() {
			t.Errorf("%s (rank %d) should rank before %s (rank %d)", order[i-1].Class, order[i-1].Rank(), order[i].Class, order[i].Rank())
		}
	}
	if (Cell{Class: "SOC"}).Rank() != (Cell{Class: "SYS"}).Rank() {
		t.Error("SOC should rank as SYS")
	}
}

func TestBuildRejectsNil(t *testing.T) {
	if _, err := Build(nil, kb.Default()); err == nil {
		t.Error("Build(nil) gave no error")
	}
	if _, err := Build(snapshot.New(), nil); err == nil {
		t.Error("Build without a knowledge base gave no error")
	}
	m, err := Build(snapshot.New(), kb.Default())
	if err != nil || len(m.Devices) != 0 {
		t.Errorf("empty snapshot: %v, %v", m, err)
	}
}
