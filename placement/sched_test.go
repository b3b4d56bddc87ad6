package placement

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"testing"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

var (
	placerSnapsOnce sync.Once
	placerSnaps     map[string]*snapshot.Snapshot
	placerSnapsErr  error
)

// recorded loads the machines of the placement tests: the 8-GPU HGX H100
// (NVSwitch), the 4-GPU L40S box (GPU0-1 and GPU2-3 each under one PCIe
// switch, the pairs on different sockets), the MI300X in CPX mode and an
// A100 80GB with four MIG instances.
func recorded(t *testing.T) map[string]*snapshot.Snapshot {
	t.Helper()
	placerSnapsOnce.Do(func() {
		ctx := context.Background()
		placerSnaps = map[string]*snapshot.Snapshot{}
		for name, p := range map[string]string{"hgx": "../testdata/fixtures/h100-hgx8-sysfs", "pcie": "../testdata/fixtures/pcie4-downtrained-acs"} {
			s, err := discover.Replay(ctx, p)
			if err != nil {
				placerSnapsErr = err
				return
			}
			kb.Default().Annotate(s)
			placerSnaps[name] = s
		}
		for name, p := range map[string]string{"mi300x": "../testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz", "a100mig": "../testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml"} {
			s, err := capture.Load(ctx, p)
			if err != nil {
				placerSnapsErr = err
				return
			}
			kb.Default().Annotate(s)
			placerSnaps[name] = s
		}
	})
	if placerSnapsErr != nil {
		t.Fatal(placerSnapsErr)
	}
	return placerSnaps
}

// fleet is a small model of the server's bookkeeping: the units of each
// node and what leases hold of them, turned into views the way the server
// builds them.
type fleet struct {
	snaps  map[string]*snapshot.Snapshot
	units  map[string][]*unitState
	leases map[string]Placement
	cache  map[string]*NodeView // views kept until their node changes
}

func newFleet(snaps map[string]*snapshot.Snapshot) *fleet {
	f := &fleet{snaps: snaps, units: map[string][]*unitState{}, leases: map[string]Placement{}, cache: map[string]*NodeView{}}
	for id, s := range snaps {
		for _, d := range Devices(s, kb.Default()) {
			f.units[id] = append(f.units[id], &unitState{dev: d, holders: map[string]int{}, mem: map[string]uint64{}})
		}
	}
	return f
}

func (f *fleet) unit(node, id string) *unitState {
	for _, u := range f.units[node] {
		if u.dev.ID == id {
			return u
		}
	}
	return nil
}

// views are the nodes' views, in id order; adjust (when set) changes
// every device of a fresh copy, the way hypothetical views are made.
func (f *fleet) views(adjust func(node string, u *unitState, d *DeviceView)) []*NodeView {
	ids := make([]string, 0, len(f.units))
	for id := range f.units {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []*NodeView
	for _, id := range ids {
		if v := f.cache[id]; v != nil && adjust == nil {
			out = append(out, v)
			continue
		}
		v := NewNodeView(id, f.snaps[id], len(f.units[id]))
		for _, u := range f.units[id] {
			d := DeviceView{Device: &u.dev, Usable: !u.dev.Drained && !u.dev.MIGMode, Whole: len(u.holders) == 0, FreeMilli: max(1000-u.usedMilli, 0)}
			if u.dev.MemoryBytes > u.usedMem {
				d.FreeMemory = u.dev.MemoryBytes - u.usedMem
			}
			if adjust != nil {
				adjust(id, u, &d)
			}
			if d.Usable && d.Whole && !d.MIGMode && d.Parent == "" {
				v.FreeWhole++
			}
			v.Devices = append(v.Devices, d)
		}
		if adjust == nil {
			f.cache[id] = v
		}
		out = append(out, v)
	}
	return out
}

func (f *fleet) grant(lease string, pl Placement) {
	f.leases[lease] = pl
	for _, a := range pl.Allocations {
		for _, g := range a.Devices {
			f.unit(a.Node, g.ID).hold(lease, g.MilliGPU, g.MemoryBytes)
		}
		delete(f.cache, a.Node)
	}
}

func (f *fleet) release(lease string) {
	for _, a := range f.leases[lease].Allocations {
		for _, g := range a.Devices {
			f.unit(a.Node, g.ID).free(lease)
		}
		delete(f.cache, a.Node)
	}
	delete(f.leases, lease)
}

// strictPlacer fails the test when the placer falls back to first-fit.
func strictPlacer(t *testing.T) *SchedPlacer {
	return &SchedPlacer{Logger: slog.New(failHandler{t})}
}

type failHandler struct{ t *testing.T }

func (h failHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h failHandler) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	h.t.Errorf("placer logged: %s", msg)
	return nil
}
func (h failHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h failHandler) WithGroup(string) slog.Handler      { return h }

func devIDs(pl Placement) string {
	var out []string
	for _, a := range pl.Allocations {
		for _, g := range a.Devices {
			out = append(out, a.Node+":"+g.ID)
		}
	}
	return strings.Join(out, ",")
}

// TestSchedPlacerKeepsSwitchPairs: on the L40S box (GPU0-1 under one PCIe
// switch, GPU2-3 under another, the pairs on different sockets), a single
// GPU goes where it breaks no free pair, and two GPUs go to the pair under
// one switch, where first-fit takes the lowest free numbers across the
// sockets.
func TestSchedPlacerKeepsSwitchPairs(t *testing.T) {
	snaps := recorded(t)
	f := newFleet(map[string]*snapshot.Snapshot{"pcie": snaps["pcie"]})
	p := strictPlacer(t)
	f.grant("taken", Placement{Allocations: []api.Allocation{{Node: "pcie", Devices: []api.DeviceGrant{{ID: "gpu2", MilliGPU: 1000}}}}})
	pl, err := p.Place(Request{GPUs: 1}, f.views(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := devIDs(pl); got != "pcie:gpu3" {
		t.Errorf("one GPU beside a taken gpu2 went to %s, want pcie:gpu3 (gpu0-gpu1 stay a pair)", got)
	}
	f.release("taken")
	f.grant("taken", Placement{Allocations: []api.Allocation{{Node: "pcie", Devices: []api.DeviceGrant{{ID: "gpu1", MilliGPU: 1000}}}}})
	views := f.views(nil)
	pl, err = p.Place(Request{GPUs: 2}, views)
	if err != nil {
		t.Fatal(err)
	}
	if got := devIDs(pl); got != "pcie:gpu2,pcie:gpu3" {
		t.Errorf("two GPUs with gpu1 taken went to %s, want pcie:gpu2,pcie:gpu3 (one PCIe switch)", got)
	}
	ff, err := FirstFit{}.Place(Request{GPUs: 2}, views)
	if err != nil || devIDs(ff) != "pcie:gpu0,pcie:gpu2" {
		t.Errorf("first-fit gave %s (%v); the case is meant to differ from it", devIDs(ff), err)
	}
	if pl.Allocations[0].Devices[0].Isolation != api.IsolationExclusive || pl.Allocations[0].Devices[0].MilliGPU != 1000 {
		t.Errorf("whole GPU grant %+v", pl.Allocations[0].Devices[0])
	}
}

// TestSchedPlacerConstraintsAndGangs maps constraints (model, nodes,
// memory, NUMA) and places a gang across nodes.
func TestSchedPlacerConstraintsAndGangs(t *testing.T) {
	snaps := recorded(t)
	f := newFleet(map[string]*snapshot.Snapshot{"hgx": snaps["hgx"], "pcie": snaps["pcie"], "mi300x": snaps["mi300x"]})
	p := strictPlacer(t)
	views := f.views(nil)
	cases := []struct {
		req  Request
		node string // "" when it must not fit
		n    int
	}{
		{Request{GPUs: 2, Constraints: api.Constraints{Model: "L40S"}}, "pcie", 2},
		{Request{GPUs: 4, Constraints: api.Constraints{Vendor: "amd"}}, "mi300x", 4},
		{Request{GPUs: 1, Constraints: api.Constraints{Nodes: []string{"hgx"}}}, "hgx", 1},
		{Request{GPUs: 2, Constraints: api.Constraints{SameNUMA: true, Model: "L40S"}}, "pcie", 2},
		{Request{GPUs: 3, Constraints: api.Constraints{SameNUMA: true, Model: "L40S"}}, "", 0},
		{Request{GPUs: 1, Constraints: api.Constraints{Model: "B200"}}, "", 0},
		{Request{GPUs: 1, Constraints: api.Constraints{MinMemoryBytes: 60 << 30, Vendor: "nvidia", Nodes: []string{"pcie", "hgx"}}}, "hgx", 1},
	}
	for _, c := range cases {
		pl, err := p.Place(c.req, views)
		if c.node == "" {
			if err == nil {
				t.Errorf("%+v: placed at %s, want no fit", c.req, devIDs(pl))
			} else if !strings.HasPrefix(err.Error(), "no node has") {
				t.Errorf("%+v: reason %q, want it to start with \"no node has\"", c.req, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", c.req, err)
			continue
		}
		if len(pl.Allocations) != 1 || pl.Allocations[0].Node != c.node || len(pl.Allocations[0].Devices) != c.n {
			t.Errorf("%+v: placed at %s, want %d on %s", c.req, devIDs(pl), c.n, c.node)
		}
	}
	// 10 GPUs fit no node; as a gang they span nodes, all NVIDIA.
	gang := Request{GPUs: 10, Constraints: api.Constraints{Gang: true, Vendor: "nvidia"}}
	pl, err := p.Place(gang, views)
	if err != nil {
		t.Fatal(err)
	}
	total, nodes := 0, map[string]bool{}
	for _, a := range pl.Allocations {
		total += len(a.Devices)
		nodes[a.Node] = true
	}
	if total != 10 || !nodes["hgx"] || !nodes["pcie"] || nodes["mi300x"] {
		t.Errorf("gang of 10 NVIDIA GPUs placed as %s", devIDs(pl))
	}
	if _, err := p.Place(Request{GPUs: 10, Constraints: api.Constraints{Vendor: "nvidia"}}, views); err == nil {
		t.Error("10 GPUs without gang fit one node")
	}
}

// TestSchedPlacerFractionsAndMIG: fractions get MPS on a GPU that has it
// and pack onto a shared GPU; a MIG request claims a free existing
// instance (the A100 capture names no profile: sched reads it from the
// memory size) and none once all four are held.
func TestSchedPlacerFractionsAndMIG(t *testing.T) {
	snaps := recorded(t)
	f := newFleet(map[string]*snapshot.Snapshot{"pcie": snaps["pcie"], "a100mig": snaps["a100mig"]})
	p := strictPlacer(t)
	req := Request{MilliGPU: 500, Constraints: api.Constraints{Model: "L40S"}}
	pl, err := p.Place(req, f.views(nil))
	if err != nil {
		t.Fatal(err)
	}
	g := pl.Allocations[0].Devices[0]
	if g.Isolation != api.IsolationMPS || g.MilliGPU != 500 || g.MemoryBytes == 0 {
		t.Errorf("half an L40S: %+v, want MPS with 500 milli and half the memory", g)
	}
	f.grant("half", pl)
	pl2, err := p.Place(Request{MilliGPU: 300, Constraints: api.Constraints{Model: "L40S"}}, f.views(nil))
	if err != nil {
		t.Fatal(err)
	}
	if devIDs(pl2) != devIDs(pl) {
		t.Errorf("0.3 went to %s, want the GPU already shared, %s", devIDs(pl2), devIDs(pl))
	}
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		pl, err := p.Place(Request{MIG: "1g.20gb"}, f.views(nil))
		if err != nil {
			t.Fatalf("MIG instance %d: %v", i+1, err)
		}
		g := pl.Allocations[0].Devices[0]
		if pl.Allocations[0].Node != "a100mig" || !strings.HasPrefix(g.ID, "gpu0/mig") || g.Isolation != api.IsolationMIG || seen[g.ID] {
			t.Fatalf("MIG grant %d: %s %+v", i+1, pl.Allocations[0].Node, g)
		}
		if g.MilliGPU != 1000/7 {
			t.Errorf("1g.20gb share %d milli, want %d (1 of 7 compute slices)", g.MilliGPU, 1000/7)
		}
		seen[g.ID] = true
		f.grant(fmt.Sprintf("mig%d", i), pl)
	}
	if pl, err := p.Place(Request{MIG: "1g.20gb"}, f.views(nil)); err == nil {
		t.Errorf("a fifth 1g.20gb was placed at %s; the GPU has four instances", devIDs(pl))
	}
}

// TestSchedPlacerNeverGrantsHeld runs random grants and releases over four
// recorded machines, with drains and hypothetical views (every device
// free, as the queue's estimates see them) in between, and checks every
// placement against the views it was made from: whole GPUs only where
// nothing holds any part, fractions within the free share and memory,
// nothing drained.
func TestSchedPlacerNeverGrantsHeld(t *testing.T) {
	snaps := recorded(t)
	f := newFleet(snaps)
	p := strictPlacer(t)
	rng := rand.New(rand.NewSource(3))
	placed := 0
	for step := 0; step < 600; step++ {
		switch r := rng.Intn(10); {
		case r < 2 && len(f.leases) > 0:
			ids := make([]string, 0, len(f.leases))
			for id := range f.leases {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			f.release(ids[rng.Intn(len(ids))])
			continue
		case r == 2:
			// Everything free, as an estimate sees it: must not leak into
			// the next real placement.
			all := f.views(func(_ string, u *unitState, d *DeviceView) {
				d.Whole, d.FreeMilli, d.FreeMemory = true, 1000, u.dev.MemoryBytes
			})
			if _, err := p.Place(Request{GPUs: 1}, all); err != nil {
				t.Fatal(err)
			}
			continue
		case r == 3:
			nodes := []string{"hgx", "pcie", "mi300x"}
			n := nodes[rng.Intn(len(nodes))]
			us := f.units[n]
			u := us[rng.Intn(len(us))]
			u.dev.Drained = !u.dev.Drained
			delete(f.cache, n)
			continue
		}
		var req Request
		switch rng.Intn(4) {
		case 0:
			req.GPUs = 1 + rng.Intn(4)
		case 1:
			req.GPUs = 1
		case 2:
			req.MilliGPU = 100 + 100*rng.Intn(8)
		case 3:
			req.MIG = "1g.20gb"
		}
		views := f.views(nil)
		pl, err := p.Place(req, views)
		if err != nil {
			continue
		}
		check(t, req, pl, views)
		f.grant(fmt.Sprintf("l%d", step), pl)
		placed++
	}
	if placed < 100 {
		t.Errorf("only %d placements in 600 steps", placed)
	}
}

func check(t *testing.T, req Request, pl Placement, views []*NodeView) {
	t.Helper()
	byNode := map[string]*NodeView{}
	for _, v := range views {
		byNode[v.ID] = v
	}
	n := 0
	for _, a := range pl.Allocations {
		v := byNode[a.Node]
		if v == nil {
			t.Fatalf("%+v: placed on %s, not in the views", req, a.Node)
		}
		for _, g := range a.Devices {
			n++
			var d *DeviceView
			for i := range v.Devices {
				if v.Devices[i].ID == g.ID {
					d = &v.Devices[i]
				}
			}
			switch {
			case d == nil:
				t.Fatalf("%+v: %s:%s does not exist", req, a.Node, g.ID)
			case !d.Usable:
				t.Fatalf("%+v: %s:%s is not usable (drained %v)", req, a.Node, g.ID, d.Drained)
			case req.GPUs > 0 && (!d.Whole || g.MilliGPU != 1000):
				t.Fatalf("%+v: %s:%s is not free whole: %+v", req, a.Node, g.ID, d)
			case req.MilliGPU > 0 && (g.MilliGPU > d.FreeMilli || g.MemoryBytes > d.FreeMemory):
				t.Fatalf("%+v: %s:%s has %d milli and %d bytes free, granted %d and %d", req, a.Node, g.ID, d.FreeMilli, d.FreeMemory, g.MilliGPU, g.MemoryBytes)
			case req.MIG != "" && (d.Parent == "" || !d.Whole):
				t.Fatalf("%+v: %s:%s is not a free MIG instance", req, a.Node, g.ID)
			}
		}
	}
	if req.GPUs > 0 && n != req.GPUs {
		t.Fatalf("%+v: %d devices granted", req, n)
	}
}

// unitState is a device and what leases hold of it, as the lease core
// keeps it.
type unitState struct {
	dev       api.Device
	holders   map[string]int
	mem       map[string]uint64
	usedMilli int
	usedMem   uint64
}

func (u *unitState) hold(lease string, milli int, mem uint64) {
	if _, ok := u.holders[lease]; ok {
		return
	}
	u.holders[lease], u.mem[lease] = milli, mem
	u.usedMilli += milli
	u.usedMem += mem
}

func (u *unitState) free(lease string) {
	if m, ok := u.holders[lease]; ok {
		u.usedMilli -= m
		u.usedMem -= u.mem[lease]
		delete(u.holders, lease)
		delete(u.mem, lease)
	}
}
