package sched

import (
	"context"
	"errors"
	"strings"
	"testing"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/sched/shapes"
)

func cluster(t testing.TB, nodes ...*Node) (*Cluster, *State) {
	t.Helper()
	c, err := NewCluster(nodes)
	if err != nil {
		t.Fatal(err)
	}
	return c, NewState(c)
}

func place(t *testing.T, s *Scheduler, st *State, r Request) Allocation {
	t.Helper()
	a, err := s.Place(st, r)
	if err != nil {
		t.Fatalf("place %s: %v", r.ID, err)
	}
	if err := st.CommitOne(a); err != nil {
		t.Fatalf("commit %s: %v", r.ID, err)
	}
	if err := st.Verify(); err != nil {
		t.Fatalf("after %s: %v", r.ID, err)
	}
	return a
}

func devsOf(a Allocation) []int {
	var out []int
	for _, s := range a.Devices {
		out = append(out, s.Device)
	}
	return out
}

func TestPlaceWholeByTopology(t *testing.T) {
	_, st := cluster(t, nodeOf(t, shapes.NVLinkPairs8("pairs")))
	s := Default(1)
	a := place(t, s, st, Request{ID: "one", GPUs: 1})
	b := place(t, s, st, Request{ID: "two", GPUs: 1})
	// The second single GPU completes the pair the first one broke.
	if a.Devices[0].Device^1 != b.Devices[0].Device {
		t.Errorf("single GPUs on %v and %v, want the two GPUs of one NVLink pair", devsOf(a), devsOf(b))
	}
	p := place(t, s, st, Request{ID: "pair", GPUs: 2})
	if p.WorstLink != "NV12" {
		t.Errorf("2-GPU request got %v over %s, want an NVLink pair", devsOf(p), p.WorstLink)
	}
	q := place(t, s, st, Request{ID: "quad", GPUs: 4})
	if q.WorstLink != "PIX" {
		t.Errorf("4-GPU request got %v over %s, want one switch (PIX)", devsOf(q), q.WorstLink)
	}
	if _, err := s.Place(st, Request{ID: "too-many", GPUs: 1}); err == nil {
		t.Error("a ninth GPU was placed on an 8-GPU node")
	}
	if err := st.Release("quad"); err != nil {
		t.Fatal(err)
	}
	if err := st.Verify(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Place(st, Request{ID: "again", GPUs: 4}); err != nil {
		t.Errorf("after release: %v", err)
	}
}

func TestPlacePrefersFullerNodeAndKeepsEmptyOnes(t *testing.T) {
	_, st := cluster(t, nodeOf(t, shapes.PCIeSwitches8("n0")), nodeOf(t, shapes.PCIeSwitches8("n1")), nodeOf(t, shapes.PCIeSwitches8("n2")))
	s := Default(7)
	first := place(t, s, st, Request{ID: "a", GPUs: 2})
	for i := 0; i < 6; i++ {
		a := place(t, s, st, Request{ID: "b" + string(rune('0'+i)), GPUs: 1})
		if a.Node != first.Node {
			t.Errorf("single GPU %d went to %s, want %s (the used node)", i, a.Node, first.Node)
		}
	}
	// Two empty nodes are left for 8-GPU requests.
	for _, id := range []string{"x", "y"} {
		if a := place(t, s, st, Request{ID: id, GPUs: 8}); a.Node == first.Node {
			t.Errorf("8 GPUs on the used node")
		}
	}
}

func TestFractions(t *testing.T) {
	_, st := cluster(t, nodeOf(t, shapes.NVLinkPairs8("pairs")))
	s := Default(3)
	gib := uint64(1 << 30)
	a := place(t, s, st, Request{ID: "f1", GPUMilli: 500, GPUMemoryBytes: 20 * gib})
	b := place(t, s, st, Request{ID: "f2", GPUMilli: 300, GPUMemoryBytes: 20 * gib})
	if a.Devices[0].Device != b.Devices[0].Device {
		t.Errorf("fractions on GPUs %v and %v, want the same (best fit)", devsOf(a), devsOf(b))
	}
	// 300 milli no longer fits next to 800; 200 does.
	c := place(t, s, st, Request{ID: "f3", GPUMilli: 300})
	if c.Devices[0].Device == a.Devices[0].Device {
		t.Errorf("300 milli placed on a GPU with 200 free")
	}
	d := place(t, s, st, Request{ID: "f4", GPUMilli: 200})
	if d.Devices[0].Device != a.Devices[0].Device {
		t.Errorf("200 milli on GPU %v, want the tightest GPU %v", devsOf(d), devsOf(a))
	}
	// Memory is a limit of its own: 70 GiB does not fit next to 40.
	e := place(t, s, st, Request{ID: "f5", GPUMilli: 100, GPUMemoryBytes: 70 * gib})
	// It goes to the GPU of f3, which holds no memory yet.
	if e.Devices[0].Device != c.Devices[0].Device {
		t.Errorf("70 GiB on GPU %v, want %v (next to 300 milli and no memory)", devsOf(e), devsOf(c))
	}
	if e.Devices[0].MemoryBytes != 70*gib || e.Devices[0].Milli != 100 {
		t.Errorf("share %+v", e.Devices[0])
	}
	// A whole GPU is never given a shared one.
	w := place(t, s, st, Request{ID: "w", GPUs: 6})
	for _, sh := range w.Devices {
		for _, used := range []Allocation{a, c} {
			if sh.Device == used.Devices[0].Device {
				t.Errorf("whole GPU %d is shared with %s", sh.Device, used.RequestID)
			}
		}
	}
	if _, err := s.Place(st, Request{ID: "w2", GPUs: 1}); err == nil {
		t.Error("a whole GPU placed with none free")
	}
}

func TestConstraintsAndReasons(t *testing.T) {
	_, st := cluster(t, nodeOf(t, shapes.NVSwitch8("hgx")), nodeOf(t, shapes.PCIeSwitches8("l40s")), nodeOf(t, shapes.RootPorts4("rtx")))
	s := Default(1)
	cases := []struct {
		c    Constraints
		node string // "" = unschedulable
		why  string
	}{
		{Constraints{Models: []string{"H100"}}, "hgx", ""},
		{Constraints{Models: []string{"L40S"}}, "l40s", ""},
		{Constraints{Models: []string{"A100"}}, "", "have no GPU of model A100"},
		{Constraints{MinComputeCapability: "9.0"}, "hgx", ""},
		{Constraints{MinComputeCapability: "10.0"}, "", "compute capability 10.0"},
		{Constraints{Architecture: "Ada", MinMemoryBytes: 40 << 30}, "l40s", ""},
		{Constraints{MinDriver: "560"}, "", "driver 560"},
		{Constraints{MinCUDA: "12.4", Vendor: "nvidia", Models: []string{"RTX 4090"}}, "rtx", ""},
		{Constraints{Vendor: "amd"}, "", "have no amd GPU"},
	}
	for i, c := range cases {
		a, err := s.Place(st, Request{ID: "r" + string(rune('a'+i)), GPUs: 2, Constraints: c.c})
		if c.node == "" {
			var ue *UnschedulableError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.why) || !strings.Contains(err.Error(), "0/3 nodes") {
				t.Errorf("%+v: err %v, want unschedulable saying %q", c.c, err, c.why)
			}
			continue
		}
		if err != nil || a.Node != c.node {
			t.Errorf("%+v: node %q err %v, want %s", c.c, a.Node, err, c.node)
		}
	}
	// Host resources.
	if _, err := s.Place(st, Request{ID: "cpu", GPUs: 1, CPUMilli: 1 << 40}); err == nil || !strings.Contains(err.Error(), "too little free CPU") {
		t.Errorf("huge CPU request: %v", err)
	}
}

func TestCommitChecksAgain(t *testing.T) {
	_, st := cluster(t, nodeOf(t, shapes.RootPorts4("rtx")))
	s := Default(1)
	a, err := s.Place(st, Request{ID: "a", GPUs: 4})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Place(st, Request{ID: "b", GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CommitOne(a); err != nil {
		t.Fatal(err)
	}
	if err := st.CommitOne(b); err == nil {
		t.Fatal("a stale placement was committed over a full node")
	}
	if err := st.CommitOne(a); err == nil {
		t.Fatal("the same request committed twice")
	}
	if st.Len() != 1 {
		t.Errorf("%d allocations, want 1", st.Len())
	}
	if err := st.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestGangAllOrNothing(t *testing.T) {
	_, st := cluster(t, nodeOf(t, shapes.NVSwitch8("a")), nodeOf(t, shapes.NVSwitch8("b")))
	s := Default(1)
	place(t, s, st, Request{ID: "small", GPUs: 1})
	// Three 8-GPU members cannot all fit: nothing is placed.
	g := Gang{ID: "big", Members: []Request{{ID: "m1", GPUs: 8}, {ID: "m2", GPUs: 4}, {ID: "m3", GPUs: 4}}}
	if _, err := s.PlaceGang(st, g); err == nil {
		t.Fatal("gang of 16 GPUs placed beside a used GPU on 16")
	}
	if st.Len() != 1 {
		t.Fatalf("failed gang left %d allocations", st.Len())
	}
	// Members see each other: 8 + 4 + 3 fits 15 free GPUs only together.
	g = Gang{ID: "fits", Members: []Request{{ID: "m1", GPUs: 3}, {ID: "m2", GPUs: 8}, {ID: "m3", GPUs: 4}}}
	p, err := s.PlaceGang(st, g)
	if err != nil {
		t.Fatal(err)
	}
	if st.Len() != 1 {
		t.Fatal("PlaceGang changed the state")
	}
	if err := st.Commit(p); err != nil {
		t.Fatal(err)
	}
	if st.Len() != 4 || p.Allocations[0].RequestID != "m1" || p.Allocations[1].Gang != "fits" {
		t.Errorf("plan %+v", p)
	}
	if err := st.Verify(); err != nil {
		t.Fatal(err)
	}
	// A plan with one stale member is refused whole.
	st2 := st.Clone()
	for _, id := range []string{"m1", "m2", "m3"} {
		if err := st2.Release(id); err != nil {
			t.Fatal(err)
		}
	}
	p2, err := s.PlaceGang(st2, Gang{ID: "g2", Members: []Request{{ID: "x1", GPUs: 8}, {ID: "x2", GPUs: 7}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := st2.CommitOne(Allocation{RequestID: "thief", Node: p2.Allocations[1].Node, NodeIndex: p2.Allocations[1].NodeIndex, Devices: p2.Allocations[1].Devices[:1]}); err != nil {
		t.Fatal(err)
	}
	before := st2.Len()
	if err := st2.Commit(p2); err == nil {
		t.Fatal("a gang plan with a conflicting member was committed")
	}
	if st2.Len() != before {
		t.Errorf("failed commit changed the allocations: %d -> %d", before, st2.Len())
	}
	if err := st2.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestMIGOnCapture(t *testing.T) {
	s, err := capture.Load(context.Background(), "../testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml")
	if err != nil {
		t.Fatal(err)
	}
	_, st := cluster(t, nodeOf(t, s))
	sch := Default(1)
	if _, err := sch.Place(st, Request{ID: "whole", GPUs: 1}); err == nil || !strings.Contains(err.Error(), "MIG mode") {
		t.Errorf("whole GPU on a MIG GPU: %v", err)
	}
	seen := map[int]bool{}
	for i := 0; i < 4; i++ {
		a := place(t, sch, st, Request{ID: "m" + string(rune('0'+i)), MIGProfile: "1g.20gb"})
		slot := a.Devices[0].MIG
		if slot == nil || slot.Existing < 3 || slot.Existing > 6 || seen[slot.Existing] {
			t.Fatalf("slot %+v, want an unclaimed existing instance 3-6", slot)
		}
		seen[slot.Existing] = true
	}
	if _, err := sch.Place(st, Request{ID: "fifth", MIGProfile: "1g.20gb"}); err == nil {
		t.Error("a fifth 1g.20gb placed on a GPU with four")
	}
	if _, err := sch.Place(st, Request{ID: "small", MIGProfile: "1g.10gb"}); err == nil {
		t.Error("1g.10gb placed while every memory slice is taken")
	}
	if _, err := sch.Place(st, Request{ID: "bad", MIGProfile: "9g.1tb"}); err == nil || !strings.Contains(err.Error(), "profile 9g.1tb") {
		t.Errorf("unknown profile: %v", err)
	}
}

func migNode(name string, n int) *Node {
	geo, _ := kb.Default().MIGProfiles("A100-SXM4-80GB")
	nd := &Node{Name: name, CPUMilli: 64000, MemoryBytes: 512 << 30}
	for i := 0; i < n; i++ {
		g := geo
		nd.Devices = append(nd.Devices, Device{Index: i, Vendor: "nvidia", Model: "A100-SXM4-80GB", MemoryBytes: 80 << 30, MIG: &g, MIGEnabled: true, NUMA: 0})
	}
	return nd
}

func TestMIGStartsThatStrandLeast(t *testing.T) {
	_, st := cluster(t, migNode("mig", 1))
	s := Default(1)
	// 3g.40gb may start at 0 or 4; at 4 it leaves room for 4g.40gb at 0,
	// at 0 it would strand a compute slice.
	a := place(t, s, st, Request{ID: "3g", MIGProfile: "3g.40gb"})
	if sl := a.Devices[0].MIG; sl.Start != 4 || sl.Existing != -1 || sl.Size != 4 || sl.Compute != 3 {
		t.Errorf("3g.40gb slot %+v, want new at memory slice 4", sl)
	}
	b := place(t, s, st, Request{ID: "4g", MIGProfile: "4g.40gb"})
	if sl := b.Devices[0].MIG; sl.Start != 0 {
		t.Errorf("4g.40gb slot %+v, want 0", sl)
	}
	if _, err := s.Place(st, Request{ID: "1g", MIGProfile: "1g.10gb"}); err == nil {
		t.Error("1g.10gb placed on a full GPU")
	}
	if err := st.Release("3g"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		c := place(t, s, st, Request{ID: "1g" + string(rune('0'+i)), MIGProfile: "1g.10gb"})
		if sl := c.Devices[0].MIG; sl.Start < 4 || sl.Start > 6 {
			t.Errorf("1g.10gb at %d, want 4-6", sl.Start)
		}
	}
	// 3 x 1g + 4g = 7 compute slices: full even though slice 7 is free.
	if _, err := s.Place(st, Request{ID: "1g-more", MIGProfile: "1g.10gb"}); err == nil {
		t.Error("an eighth compute slice was handed out")
	}
}

// The MI210 KFD copy has two xGMI hives of four GPUs (SYS between them):
// four GPUs asked as one island land in one hive; two such requests fill
// both; five in one island do not exist.
func TestXGMIHivesFromKFD(t *testing.T) {
	s, err := capture.Load(context.Background(), "../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie")
	if err != nil {
		t.Fatal(err)
	}
	n := nodeOf(t, s)
	if d := n.Devices[0]; d.Vendor != "amd" || d.GFXTarget != "gfx90a" || d.PCI != "0000:03:00.0" {
		t.Fatalf("device 0 = %+v", d)
	}
	_, st := cluster(t, n)
	sch := Default(1)
	island := Locality{SameNVLinkIsland: true}
	if _, err := sch.Place(st, Request{ID: "five", GPUs: 5, Locality: island}); err == nil {
		t.Error("five GPUs placed in one xGMI hive of four")
	}
	p, err := sch.PlaceGang(st, Gang{ID: "g", Members: []Request{
		{ID: "a", GPUs: 4, Locality: island, Constraints: Constraints{GFXTargets: []string{"gfx90a"}}},
		{ID: "b", GPUs: 4, Locality: island},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range p.Allocations {
		if a.WorstLink != "XGMI" {
			t.Errorf("%s got %v over %s, want one hive", a.RequestID, devsOf(a), a.WorstLink)
		}
	}
	if err := st.Commit(p); err != nil {
		t.Fatal(err)
	}
	if _, err := sch.Place(st, Request{ID: "cdna3", GPUs: 1, Constraints: Constraints{GFXTargets: []string{"gfx942"}}}); err == nil {
		t.Error("gfx942 request placed on MI210s")
	}
}
