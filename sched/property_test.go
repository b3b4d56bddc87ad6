package sched

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"testing"

	"kiln.dev/kiln/sched/shapes"
)

// propCluster is a mixed cluster: the four server shapes, MIG GPUs, a node
// with an unhealthy GPU and one of unknown CPU and memory.
func propCluster(t testing.TB) *Cluster {
	t.Helper()
	var nodes []*Node
	for i, sh := range shapes.All() {
		for k := 0; k < 2; k++ {
			nodes = append(nodes, nodeOf(t, sh.Build(fmt.Sprintf("%s-%d-%d", sh.Name, i, k))))
		}
	}
	nodes = append(nodes, migNode("mig-a", 2), migNode("mig-b", 1))
	sick := nodeOf(t, shapes.PCIeSwitches8("sick"))
	sick.Devices[3].Unhealthy = []string{"xid-error: test"}
	nodes = append(nodes, sick)
	bare := nodeOf(t, shapes.RootPorts4("bare"))
	bare.CPUMilli, bare.MemoryBytes = 0, 0
	nodes = append(nodes, bare)
	c, err := NewCluster(nodes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randomRequest(rng *rand.Rand, id string) Request {
	r := Request{ID: id, CPUMilli: int64(rng.IntN(16000)), MemoryBytes: uint64(rng.IntN(64)) << 30, Priority: rng.IntN(3)}
	switch rng.IntN(6) {
	case 0, 1:
		r.GPUs = []int{1, 1, 2, 4, 8}[rng.IntN(5)]
	case 2, 3:
		r.GPUMilli = 50 * (1 + rng.IntN(19))
		if rng.IntN(2) == 0 {
			r.GPUMemoryBytes = uint64(1+rng.IntN(40)) << 30
		}
	case 4:
		r.MIGProfile = []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me"}[rng.IntN(7)]
	default:
	}
	switch rng.IntN(8) {
	case 0:
		r.Locality.SameNVLinkIsland = true
	case 1:
		r.Locality.SameNUMA = true
	case 2:
		r.Constraints.Models = []string{"L40S", "H100"}[rng.IntN(2) : rng.IntN(2)+1]
	}
	return r
}

// checkInvariants recomputes every device's load from the allocations,
// without the engine's own bookkeeping, and checks the capacities.
func checkInvariants(t *testing.T, st *State) {
	t.Helper()
	if err := st.Verify(); err != nil {
		t.Fatal(err)
	}
	type load struct {
		milli int
		mem   uint64
		mig   uint32
		comp  int
		held  map[int]bool
	}
	loads := map[[2]int]*load{}
	cpu := map[int]int64{}
	for _, a := range st.Allocations() {
		n := st.c.nodes[a.NodeIndex]
		cpu[a.NodeIndex] += a.CPUMilli
		for _, sh := range a.Devices {
			d := &n.Devices[sh.Device]
			if !d.Healthy() {
				t.Fatalf("%s holds unhealthy GPU %d of %s", a.RequestID, sh.Device, n.Name)
			}
			k := [2]int{a.NodeIndex, sh.Device}
			l := loads[k]
			if l == nil {
				l = &load{held: map[int]bool{}}
				for _, in := range d.MIGInstances {
					l.mig |= span(in.Start, in.Size)
					l.comp += in.Compute
				}
				loads[k] = l
			}
			if sh.MIG != nil {
				p, ok := d.MIG.Profile(sh.MIG.Profile)
				if !ok {
					t.Fatalf("%s: unknown profile %s", a.RequestID, sh.MIG.Profile)
				}
				if sh.MIG.Existing >= 0 {
					if l.held[sh.MIG.Existing] {
						t.Fatalf("%s: MIG instance %d held twice", a.RequestID, sh.MIG.Existing)
					}
					l.held[sh.MIG.Existing] = true
					continue
				}
				legal := false
				for _, s := range p.Placements {
					legal = legal || s == sh.MIG.Start
				}
				s := span(sh.MIG.Start, p.MemorySlices)
				if !legal || l.mig&s != 0 {
					t.Fatalf("%s: %s at slice %d is illegal or overlaps (%08b)", a.RequestID, p.Name, sh.MIG.Start, l.mig)
				}
				l.mig |= s
				l.comp += p.ComputeSlices
				if l.comp > d.MIG.ComputeSlices {
					t.Fatalf("%s: %d compute slices on a %d-slice GPU", a.RequestID, l.comp, d.MIG.ComputeSlices)
				}
				continue
			}
			if d.MIGEnabled {
				t.Fatalf("%s: milli share on a MIG GPU", a.RequestID)
			}
			l.milli += sh.Milli
			l.mem += sh.MemoryBytes
			if l.milli > 1000 || l.mem > d.MemoryBytes {
				t.Fatalf("GPU %d of %s over-committed: %d milli, %d of %d bytes", sh.Device, n.Name, l.milli, l.mem, d.MemoryBytes)
			}
		}
	}
	for i, c := range cpu {
		if n := st.c.nodes[i]; n.CPUMilli > 0 && c > n.CPUMilli {
			t.Fatalf("node %s: %d milli-CPU of %d", n.Name, c, n.CPUMilli)
		}
	}
}

// run replays a seeded stream of placements, gangs and releases and
// returns the allocations after each step.
func run(t *testing.T, c *Cluster, s *Scheduler, seed uint64, steps int) [][]Allocation {
	rng := rand.New(rand.NewPCG(seed, 99))
	st := NewState(c)
	var live []string
	var trace [][]Allocation
	for step := 0; step < steps; step++ {
		switch op := rng.IntN(10); {
		case op < 5:
			r := randomRequest(rng, fmt.Sprintf("r%d", step))
			if a, err := s.Place(st, r); err == nil {
				if err := st.CommitOne(a); err != nil {
					t.Fatalf("step %d: commit of a fresh placement failed: %v", step, err)
				}
				live = append(live, r.ID)
			}
		case op < 7:
			g := Gang{ID: fmt.Sprintf("g%d", step)}
			for m := 0; m < 2+rng.IntN(3); m++ {
				g.Members = append(g.Members, randomRequest(rng, fmt.Sprintf("g%d-%d", step, m)))
			}
			before := st.Len()
			p, err := s.PlaceGang(st, g)
			if st.Len() != before {
				t.Fatalf("step %d: PlaceGang changed the state", step)
			}
			if err != nil {
				break
			}
			if rng.IntN(4) == 0 && len(p.Allocations[0].Devices) > 0 {
				// Someone takes a share of the first member's first GPU
				// before the gang commits: the whole gang must fail (or
				// succeed whole when there was room for both).
				a := p.Allocations[0]
				thief := Allocation{RequestID: fmt.Sprintf("t%d", step), Node: a.Node, NodeIndex: a.NodeIndex, Devices: a.Devices[:1]}
				if st.CommitOne(thief) == nil {
					live = append(live, thief.RequestID)
				}
			}
			err = st.Commit(p)
			n := 0
			for _, m := range g.Members {
				if _, ok := st.Allocation(m.ID); ok {
					n++
				}
			}
			if err == nil && n != len(g.Members) || err != nil && n != 0 {
				t.Fatalf("step %d: gang of %d has %d members placed (commit error %v)", step, len(g.Members), n, err)
			}
			if err == nil {
				for _, m := range g.Members {
					live = append(live, m.ID)
				}
			}
		default:
			if len(live) > 0 {
				k := rng.IntN(len(live))
				if err := st.Release(live[k]); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				live = append(live[:k], live[k+1:]...)
			}
		}
		checkInvariants(t, st)
		trace = append(trace, st.Allocations())
	}
	return trace
}

func TestPropertyNoOvercommitGangsMIG(t *testing.T) {
	c := propCluster(t)
	for _, seed := range []uint64{1, 2, 3} {
		for _, s := range []*Scheduler{Default(seed), Random(seed), Spread(seed)} {
			trace := run(t, c, s, seed, 400)
			placed := 0
			for _, a := range trace[len(trace)-1] {
				placed += len(a.Devices)
			}
			if placed == 0 {
				t.Errorf("%s seed %d: nothing placed at the end", s.Name, seed)
			}
		}
	}
}

func TestPropertySameSeedSameResult(t *testing.T) {
	c := propCluster(t)
	for _, mk := range []func(uint64) *Scheduler{Default, Random} {
		a := run(t, c, mk(5), 11, 250)
		b := run(t, c, mk(5), 11, 250)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs with one seed differ", mk(5).Name)
		}
	}
	// A different seed changes the random policy's choices.
	a := run(t, c, Random(5), 11, 250)
	b := run(t, c, Random(6), 11, 250)
	if reflect.DeepEqual(a, b) {
		t.Error("random policy ignores its seed")
	}
}

// Sets placed never break the requested locality.
func TestPropertyLocality(t *testing.T) {
	c := propCluster(t)
	rng := rand.New(rand.NewPCG(8, 8))
	s := Default(1)
	st := NewState(c)
	for i := 0; i < 300; i++ {
		r := Request{ID: fmt.Sprint(i), GPUs: 1 + rng.IntN(4)}
		r.Locality = Locality{SameNVLinkIsland: rng.IntN(2) == 0, SameNUMA: rng.IntN(2) == 0}
		a, err := s.Place(st, r)
		if err != nil {
			continue
		}
		var set uint64
		for _, sh := range a.Devices {
			set |= 1 << sh.Device
		}
		tp := c.Topology(a.NodeIndex)
		if !tp.allows(set, r.Locality) || bits.OnesCount64(set) != r.GPUs {
			t.Fatalf("%+v got %v on %s", r, devs(set), a.Node)
		}
		if err := st.CommitOne(a); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(3) == 0 {
			_ = st.Release(a.RequestID)
		}
	}
}
