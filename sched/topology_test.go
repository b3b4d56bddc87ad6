package sched

import (
	"math/bits"
	"math/rand/v2"
	"testing"

	"kiln.dev/kiln/sched/shapes"
	"kiln.dev/kiln/topo"
)

func mask(devs ...int) uint64 {
	var m uint64
	for _, d := range devs {
		m |= 1 << d
	}
	return m
}

func devs(m uint64) []int {
	var out []int
	for ; m != 0; m &= m - 1 {
		out = append(out, bits.TrailingZeros64(m))
	}
	return out
}

func TestTopologyPicker(t *testing.T) {
	pairs := NewTopology(nodeOf(t, shapes.NVLinkPairs8("pairs")))
	switches := NewTopology(nodeOf(t, shapes.PCIeSwitches8("switches")))
	roots := NewTopology(nodeOf(t, shapes.RootPorts4("roots")))
	all8 := mask(0, 1, 2, 3, 4, 5, 6, 7)
	cases := []struct {
		name  string
		t     *Topology
		free  uint64
		n     int
		loc   Locality
		want  uint64
		wantF bool // want a failure
	}{
		{name: "1 GPU takes the leftover of a used pair", t: pairs, free: all8 &^ mask(0), n: 1, want: mask(1)},
		{name: "1 GPU takes the leftover next to the busier switch", t: pairs, free: all8 &^ mask(0, 4, 5), n: 1, want: mask(1)},
		{name: "2 GPUs take a free NVLink pair", t: pairs, free: all8 &^ mask(0, 2), n: 2, want: mask(4, 5)},
		{name: "2 GPUs on an empty box take the first pair", t: pairs, free: all8, n: 2, want: mask(0, 1)},
		{name: "4 GPUs stay under one switch", t: pairs, free: all8 &^ mask(1), n: 4, want: mask(4, 5, 6, 7)},
		{name: "no pair left: 2 GPUs under one switch", t: pairs, free: mask(1, 3, 5, 7), n: 2, want: mask(1, 3)},
		{name: "NVLink island asked, none left", t: pairs, free: mask(1, 3, 5, 7), n: 2, loc: Locality{SameNVLinkIsland: true}, wantF: true},
		{name: "NVLink island asked and found", t: pairs, free: mask(1, 3, 6, 7), n: 2, loc: Locality{SameNVLinkIsland: true}, want: mask(6, 7)},
		{name: "1 GPU from the switch with fewer free", t: switches, free: all8 &^ mask(2), n: 1, want: mask(0)},
		{name: "4 GPUs on the whole switch", t: switches, free: all8 &^ mask(2), n: 4, want: mask(4, 5, 6, 7)},
		{name: "2 GPUs on one host bridge", t: roots, free: mask(0, 2, 3), n: 2, want: mask(2, 3)},
		{name: "same NUMA for 3 of 4 fails", t: roots, free: mask(0, 1, 2, 3), n: 3, loc: Locality{SameNUMA: true}, wantF: true},
		{name: "too few free", t: roots, free: mask(0), n: 2, wantF: true},
	}
	for _, c := range cases {
		got, ok := TopologyPicker{}.Pick(c.t, c.free, c.n, c.loc)
		if c.wantF {
			if ok {
				t.Errorf("%s: picked %v, want no set", c.name, devs(got))
			}
			continue
		}
		if !ok || got != c.want {
			t.Errorf("%s: picked %v (ok %v), want %v", c.name, devs(got), ok, devs(c.want))
		}
		// The cached answer is the same.
		if again, _ := (TopologyPicker{}).Pick(c.t, c.free, c.n, c.loc); again != got {
			t.Errorf("%s: cached pick %v differs from %v", c.name, devs(again), devs(got))
		}
	}
}

// randomTopology is n GPUs in NVLink pairs or quads, under switches,
// host bridges and sockets drawn at random.
func randomTopology(rng *rand.Rand, n int) *Topology {
	nd := &Node{Name: "r"}
	island := make([]int, n)
	sw := make([]int, n)
	sock := make([]int, n)
	for i := 0; i < n; i++ {
		nd.Devices = append(nd.Devices, Device{Index: i, NUMA: 0})
		island[i] = i / (1 << rng.IntN(3))
		sw[i] = i / (2 + rng.IntN(3))
		sock[i] = i * 2 / n
		nd.Devices[i].NUMA = sock[i]
	}
	nd.Links = make([][]Link, n)
	for i := range n {
		nd.Links[i] = make([]Link, n)
		for j := range n {
			var c topo.Cell
			switch {
			case i == j:
				c = topo.Cell{Class: "X"}
			case island[i] == island[j] && rng.IntN(4) > 0:
				c = topo.Cell{Class: "NV12", Links: 12}
			case sw[i] == sw[j]:
				c = topo.Cell{Class: "PIX"}
			case sock[i] == sock[j]:
				c = topo.Cell{Class: "NODE"}
			default:
				c = topo.Cell{Class: "SYS"}
			}
			nd.Links[i][j] = Link{Class: c.Class, Rank: c.Rank()}
		}
	}
	for i := range n {
		for j := range i {
			nd.Links[i][j] = nd.Links[j][i]
		}
	}
	return NewTopology(nd)
}

// The picker's slowest pair is never worse than the best any set has,
// found by brute force, and locality asked is always met.
func TestPickerOptimalProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 7))
	for trial := 0; trial < 300; trial++ {
		n := []int{4, 8, 8, 10, 16}[rng.IntN(5)]
		tp := randomTopology(rng, n)
		free := rng.Uint64() & (1<<n - 1)
		k := 1 + rng.IntN(max(1, bits.OnesCount64(free)))
		loc := Locality{SameNVLinkIsland: rng.IntN(4) == 0, SameNUMA: rng.IntN(4) == 0}
		got, ok := TopologyPicker{}.Pick(tp, free, k, loc)
		// Brute force.
		best, found := 1<<30, false
		for s := uint64(0); s < 1<<n; s++ {
			if s&^free != 0 || bits.OnesCount64(s) != k || !tp.allows(s, loc) {
				continue
			}
			r, _, _, _ := tp.Worst(s)
			if r < best {
				best = r
			}
			found = true
		}
		if ok != found {
			t.Fatalf("trial %d: n=%d free=%b k=%d loc=%+v: picker ok=%v, brute force found=%v", trial, n, free, k, loc, ok, found)
		}
		if !ok {
			continue
		}
		if got&^free != 0 || bits.OnesCount64(got) != k || !tp.allows(got, loc) {
			t.Fatalf("trial %d: picked %v from %v: not a valid set of %d", trial, devs(got), devs(free), k)
		}
		if r, _, _, _ := tp.Worst(got); r != best {
			t.Fatalf("trial %d: picked %v with worst rank %d, best is %d", trial, devs(got), r, best)
		}
	}
}

func TestPicker16GPUsIsQuick(t *testing.T) {
	tp := randomTopology(rand.New(rand.NewPCG(1, 2)), 16)
	for k := 1; k <= 16; k++ {
		if _, ok := (TopologyPicker{}).Pick(tp, 1<<16-1, k, Locality{}); !ok {
			t.Fatalf("no set of %d out of 16", k)
		}
	}
}
