package main

import (
	"testing"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/sched"
	"kiln.dev/kiln/sched/shapes"
	"kiln.dev/kiln/topo"
)

func pairsCluster(t *testing.T) (*sched.Cluster, *sched.Topology) {
	s := shapes.NVLinkPairs8("pairs")
	m, err := topo.Build(s, kb.Default())
	if err != nil {
		t.Fatal(err)
	}
	n, err := sched.NodeFromSnapshot(s, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sched.NewCluster([]*sched.Node{n})
	if err != nil {
		t.Fatal(err)
	}
	return c, c.Topology(0)
}

func TestBestEffortBaseline(t *testing.T) {
	_, tp := pairsCluster(t)
	cases := []struct {
		free uint64
		k    int
		want uint64
	}{
		{0xff, 1, 0x01},        // one GPU: the first free
		{0xff, 2, 0x03},        // a pair: an NVLink pair
		{0xfe, 2, 0x0c},        // GPU0 taken: pair 2-3 (1 is left over)
		{0xfe, 4, 0xf0},        // four under one switch
		{0xaa, 2, 0x0a},        // no NVLink pair left: two under one switch
		{0x03 | 0x30, 2, 0x03}, // two free pairs: the first
	}
	for _, c := range cases {
		got, ok := bestEffort{}.Pick(tp, c.free, c.k, sched.Locality{})
		if !ok || got != c.want {
			t.Errorf("free %08b k %d: got %08b, want %08b", c.free, c.k, got, c.want)
		}
	}
}

// A reduced run of the scenario: kiln gets the layout's best class at
// least as often as the best-effort baseline, and both far more often than
// random choice; all three accept the same jobs.
func TestScenarioRanking(t *testing.T) {
	c, tp := pairsCluster(t)
	share := map[string]float64{}
	accepted := map[string]int{}
	for name, pk := range map[string]sched.Picker{"kiln": sched.TopologyPicker{}, "best-effort": bestEffort{}, "random": sched.RandomPicker{Seed: 1}} {
		r := result{placed: map[int]int{}, bestLayout: map[int]int{}, bestNow: map[int]int{}}
		if err := stream(c, pk, 1, 1500, 0.75, tp, 0xff, &r); err != nil {
			t.Fatal(err)
		}
		share[name] = float64(sum(r.bestLayout)) / float64(sum(r.placed))
		accepted[name] = r.accepted
		if name == "kiln" && sum(r.bestNow) != sum(r.placed) {
			t.Errorf("kiln missed the best set the free GPUs allowed %d times", sum(r.placed)-sum(r.bestNow))
		}
	}
	if accepted["kiln"] != accepted["random"] || accepted["kiln"] != accepted["best-effort"] {
		t.Errorf("accepted jobs differ: %v", accepted)
	}
	if share["kiln"] < share["best-effort"] || share["best-effort"] < 2*share["random"] {
		t.Errorf("shares %v: want kiln >= best-effort >> random", share)
	}
}
