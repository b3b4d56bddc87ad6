package main

import (
	"fmt"
	"slices"
	"testing"

	"kiln.dev/kiln/sched"
	"kiln.dev/kiln/sched/shapes"
)

func layoutNamed(t *testing.T, name string) *layout {
	t.Helper()
	for _, sh := range shapes.All() {
		if sh.Name == name {
			l, err := newLayout(sh)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
	}
	t.Fatalf("no layout %s", name)
	return nil
}

// linkNames lists the library's names of the links from GPU i to GPU j.
func linkNames(p *nvidiaPicker, i, j int) []string {
	var out []string
	for _, l := range p.devices[i].Links[j] {
		out = append(out, fmt.Sprint(l.Type))
	}
	return out
}

// The library's devices carry kiln's topology in the library's own terms
// (its String names prove the constant values), the same both ways.
func TestGPUAllocatorDevices(t *testing.T) {
	cases := []struct {
		layout string
		i, j   int
		want   []string
	}{
		{"nvlink-pairs-8", 0, 1, []string{"P2PLinkSingleSwitch", "TwelveNVLINKLinks"}},
		{"nvlink-pairs-8", 0, 2, []string{"P2PLinkSingleSwitch"}},
		{"nvlink-pairs-8", 3, 4, []string{"P2PLinkCrossCPU"}},
		{"pcie-switches-8", 1, 2, []string{"P2PLinkSingleSwitch"}},
		{"pcie-switches-8", 0, 7, []string{"P2PLinkCrossCPU"}},
		{"nvswitch-8", 0, 3, []string{"P2PLinkSameCPU", "EighteenNVLINKLinks"}},
		{"nvswitch-8", 2, 6, []string{"P2PLinkCrossCPU", "EighteenNVLINKLinks"}},
		{"root-ports-4", 0, 1, []string{"P2PLinkHostBridge"}},
		{"root-ports-4", 1, 2, []string{"P2PLinkCrossCPU"}},
	}
	for _, c := range cases {
		p := layoutNamed(t, c.layout).nvidia
		for _, d := range [][2]int{{c.i, c.j}, {c.j, c.i}} {
			if got := linkNames(p, d[0], d[1]); !slices.Equal(got, c.want) {
				t.Errorf("%s GPU%d-GPU%d: links %v, want %v", c.layout, d[0], d[1], got, c.want)
			}
		}
	}
}

// What the library chooses on the NVLink-pairs layout.
func TestGPUAllocatorPicks(t *testing.T) {
	l := layoutNamed(t, "nvlink-pairs-8")
	cases := []struct {
		free uint64
		k    int
		want uint64
	}{
		{0xff, 1, 0x01},        // one GPU: the first free
		{0xff, 2, 0x03},        // idle node, two GPUs: an NVLink pair
		{0xfe, 2, 0x0c},        // GPU0 taken: pair 2-3 (1 is left over)
		{0xfe, 4, 0xf0},        // the four under the other switch
		{0xaa, 2, 0x0a},        // no NVLink pair left: two under one switch
		{0x03 | 0x30, 2, 0x03}, // two free pairs: the first
		{0x0f, 8, 0},           // too few free GPUs
	}
	for _, c := range cases {
		got, ok := l.nvidia.Pick(l.t, c.free, c.k, sched.Locality{})
		if ok != (c.want != 0) || got != c.want {
			t.Errorf("free %08b k %d: got %08b (%v), want %08b", c.free, c.k, got, ok, c.want)
		}
	}
}

// A reduced run of the scenario on every layout, one seed: all three
// pickers accept the same jobs; kiln gets the layout's best class at least
// as often as the library, and always the best the free GPUs allowed; the
// library beats random choice wherever the links differ.
func TestScenarioRanking(t *testing.T) {
	for _, sh := range shapes.All() {
		l := layoutNamed(t, sh.Name)
		share := map[string]float64{}
		accepted := map[string]int{}
		for name, pk := range map[string]sched.Picker{"kiln": sched.TopologyPicker{}, "gpuallocator": l.nvidia, "random": sched.RandomPicker{Seed: 1}} {
			r := result{placed: map[int]int{}, bestLayout: map[int]int{}, bestNow: map[int]int{}}
			if err := stream(l.c, pk, 1, 1500, 0.75, l.t, l.all, &r); err != nil {
				t.Fatal(err)
			}
			if sum(r.placed) < 500 {
				t.Fatalf("%s %s: only %d multi-GPU jobs placed", sh.Name, name, sum(r.placed))
			}
			share[name] = float64(sum(r.bestLayout)) / float64(sum(r.placed))
			accepted[name] = r.accepted
			if name == "kiln" && sum(r.bestNow) != sum(r.placed) {
				t.Errorf("%s: kiln missed the best set the free GPUs allowed %d times", sh.Name, sum(r.placed)-sum(r.bestNow))
			}
		}
		if accepted["kiln"] != accepted["random"] || accepted["kiln"] != accepted["gpuallocator"] {
			t.Errorf("%s: accepted jobs differ: %v", sh.Name, accepted)
		}
		if share["kiln"] < share["gpuallocator"] {
			t.Errorf("%s: shares %v: want kiln >= gpuallocator", sh.Name, share)
		}
		if sh.Name == "nvswitch-8" {
			// Every pair is NV18: every choice is the best.
			if share["random"] != 1 || share["gpuallocator"] != 1 {
				t.Errorf("%s: shares %v, want all 1", sh.Name, share)
			}
		} else if share["gpuallocator"] < 0.9 || share["gpuallocator"] < 2*share["random"] {
			t.Errorf("%s: shares %v: want gpuallocator >= 0.9 and >> random", sh.Name, share)
		}
	}
}
