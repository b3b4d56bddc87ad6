package sched

import (
	"context"
	"strings"
	"testing"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/sched/shapes"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

func nodeOf(t testing.TB, s *snapshot.Snapshot) *Node {
	t.Helper()
	m, err := topo.Build(s, kb.Default())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := doctor.Run(context.Background(), s, kb.Default())
	if err != nil {
		t.Fatal(err)
	}
	n, err := NodeFromSnapshot(s, m, rep)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestShapeLinks(t *testing.T) {
	cases := []struct {
		s     *snapshot.Snapshot
		pairs map[[2]int]string
	}{
		{shapes.NVLinkPairs8("a"), map[[2]int]string{{0, 1}: "NV12", {6, 7}: "NV12", {0, 2}: "PIX", {1, 3}: "PIX", {0, 4}: "SYS", {3, 7}: "SYS"}},
		{shapes.PCIeSwitches8("b"), map[[2]int]string{{0, 1}: "PIX", {0, 3}: "PIX", {4, 7}: "PIX", {0, 4}: "SYS"}},
		{shapes.NVSwitch8("c"), map[[2]int]string{{0, 1}: "NV18", {0, 7}: "NV18", {3, 4}: "NV18"}},
		{shapes.RootPorts4("d"), map[[2]int]string{{0, 1}: "PHB", {2, 3}: "PHB", {0, 2}: "SYS", {1, 3}: "SYS"}},
	}
	for _, c := range cases {
		n := nodeOf(t, c.s)
		if len(n.Devices) != len(c.s.GPUs) {
			t.Fatalf("%s: %d devices", n.Name, len(n.Devices))
		}
		for p, want := range c.pairs {
			if got := n.Links[p[0]][p[1]].Class; got != want {
				t.Errorf("%s: GPU%d-GPU%d is %s, want %s", n.Name, p[0], p[1], got, want)
			}
			if n.Links[p[0]][p[1]] != n.Links[p[1]][p[0]] {
				t.Errorf("%s: link matrix not symmetric at %v", n.Name, p)
			}
		}
		if n.CPUMilli <= 0 || n.MemoryBytes == 0 || n.Driver != "550.90.07" || n.CUDA != "12.4" {
			t.Errorf("%s: cpu %d mem %d driver %q cuda %q", n.Name, n.CPUMilli, n.MemoryBytes, n.Driver, n.CUDA)
		}
	}
	n := nodeOf(t, shapes.NVSwitch8("h"))
	d := n.Devices[3]
	if d.Model != "H100-SXM5-80GB" || d.ComputeCapability != "9.0" || d.Architecture != "hopper" || d.MemoryBytes < 79e9 || d.NUMA != 0 || d.MIG == nil || d.MIGEnabled {
		t.Errorf("H100 device = %+v", d)
	}
	if n.Devices[5].NUMA != 1 || n.Links[0][1].GBps != 450 {
		t.Errorf("GPU5 NUMA %d, NV18 %v GB/s", n.Devices[5].NUMA, n.Links[0][1].GBps)
	}
}

// The A100 80GB MIG capture holds four 1g.20gb-sized instances (14 SMs,
// about 20 GB each) and no start positions: they fill all eight memory
// slices at 0, 2, 4 and 6.
func TestNodeFromMIGCapture(t *testing.T) {
	s, err := capture.Load(context.Background(), "../testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml")
	if err != nil {
		t.Fatal(err)
	}
	n := nodeOf(t, s)
	if len(n.Devices) != 1 {
		t.Fatalf("%d devices", len(n.Devices))
	}
	d := n.Devices[0]
	if d.Model != "A100-SXM4-80GB" || d.PCI != "0000:01:00.0" || !d.MIGEnabled || d.MIG == nil || d.MIG.Name != "A100-80GB" {
		t.Fatalf("device = %+v", d)
	}
	if n.Driver != "535.54.03" || n.CUDA != "12.2" {
		t.Errorf("driver %q cuda %q", n.Driver, n.CUDA)
	}
	var starts []int
	for _, in := range d.MIGInstances {
		if in.Profile != "1g.20gb" || in.Size != 2 || in.Compute != 1 {
			t.Errorf("instance %+v, want 1g.20gb of 2 memory slices", in)
		}
		starts = append(starts, in.Start)
	}
	if len(starts) != 4 || starts[0] != 0 || starts[1] != 2 || starts[2] != 4 || starts[3] != 6 {
		t.Errorf("starts %v, want [0 2 4 6]", starts)
	}
	if !d.Healthy() {
		t.Errorf("unhealthy: %v", d.Unhealthy)
	}
}

// The HGX fixture merged with the kernel log of an Xid 119 on GPU
// 0000:9b:00.0: the doctor reports it critical, so that GPU is out.
func TestHealthFromDoctor(t *testing.T) {
	s, err := discover.Replay(context.Background(), "../testdata/fixtures/h100-hgx8-sysfs")
	if err != nil {
		t.Fatal(err)
	}
	k, err := capture.Load(context.Background(), "../testdata/captures/dmesg/h100-xid119-gsp-rpc-timeout.log")
	if err != nil {
		t.Fatal(err)
	}
	n := nodeOf(t, snapshot.Merge(s, k))
	if len(n.Devices) != 8 {
		t.Fatalf("%d devices", len(n.Devices))
	}
	for _, d := range n.Devices {
		sick := d.PCI == "0000:9b:00.0"
		if d.Healthy() == sick {
			t.Errorf("GPU %s healthy=%v, unhealthy reasons %v", d.PCI, d.Healthy(), d.Unhealthy)
		}
		if sick && !strings.Contains(strings.Join(d.Unhealthy, " "), "xid-error") {
			t.Errorf("GPU %s reasons %v do not name the Xid", d.PCI, d.Unhealthy)
		}
	}
	if len(n.Unhealthy) != 0 {
		t.Errorf("node unhealthy: %v", n.Unhealthy)
	}
	if c := n.Links[0][7].Class; c != "NV18" {
		t.Errorf("GPU0-GPU7 %s, want NV18", c)
	}
	// The engine never hands the sick GPU out: an 8-GPU request fails, a
	// 7-GPU request gets the other seven.
	c, err := NewCluster([]*Node{n})
	if err != nil {
		t.Fatal(err)
	}
	st := NewState(c)
	sch := Default(1)
	if _, err := sch.Place(st, Request{ID: "eight", GPUs: 8}); err == nil {
		t.Error("8 GPUs placed on a node with one unhealthy GPU")
	}
	a, err := sch.Place(st, Request{ID: "seven", GPUs: 7})
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range a.Devices {
		if sh.PCI == "0000:9b:00.0" {
			t.Errorf("unhealthy GPU allocated: %+v", a)
		}
	}
}
