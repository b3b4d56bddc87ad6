package gpubench

import (
	"fmt"
	"slices"
	"strings"
)

// Test names, as Measurement.Test holds them.
const (
	TestH2D        = "h2d"
	TestD2H        = "d2h"
	TestDevice     = "device"
	TestP2P        = "p2p"
	TestP2PBidi    = "p2p-bidi"
	TestP2PLatency = "p2p-latency"
)

// Groups of tests a plan can choose.
const (
	GroupHost       = "host"
	GroupDevice     = "device"
	GroupP2P        = "p2p"
	GroupLatency    = "latency"
	GroupCollective = "collective"
)

// Groups lists every group, in the order they run.
var Groups = []string{GroupHost, GroupDevice, GroupP2P, GroupLatency, GroupCollective}

// DefaultThresholdPercent is the share of a rating below which a figure is
// below-rating.
const DefaultThresholdPercent = 70

// Plan says what to measure and how often.
type Plan struct {
	// Bytes is the size of one copy in bandwidth tests.
	Bytes int64
	// Warmup runs are made and not timed before the Repetitions timed ones
	// of every test; a figure is their median.
	Warmup      int
	Repetitions int
	// LatencyBytes is the size of the small copies of latency tests, and
	// LatencyCopies how many are timed together in one run.
	LatencyBytes  int64
	LatencyCopies int
	// CollectiveBytes is the buffer size of collectives (what nccl-tests
	// prints as size).
	CollectiveBytes int64
	// Groups are the test groups to run (see Groups); empty runs all.
	Groups []string
	// Devices are the driver ordinals to measure; empty measures all.
	Devices []int
}

// DefaultPlan is the plan kiln bench runs without flags: 256 MiB copies,
// 2 warm-up runs, the median of 10.
func DefaultPlan() Plan {
	return Plan{
		Bytes:           256 << 20,
		Warmup:          2,
		Repetitions:     10,
		LatencyBytes:    8,
		LatencyCopies:   100,
		CollectiveBytes: 256 << 20,
	}
}

// Validate says what is wrong with a plan, in words for its user.
func (p Plan) Validate() error {
	switch {
	case p.Bytes < 4:
		return fmt.Errorf("copy size %d bytes: want at least 4", p.Bytes)
	case p.Warmup < 0:
		return fmt.Errorf("warm-up runs %d: want 0 or more", p.Warmup)
	case p.Repetitions < 1:
		return fmt.Errorf("repetitions %d: want 1 or more", p.Repetitions)
	case p.LatencyBytes < 1:
		return fmt.Errorf("latency copy size %d bytes: want 1 or more", p.LatencyBytes)
	case p.LatencyCopies < 1:
		return fmt.Errorf("latency copies %d: want 1 or more", p.LatencyCopies)
	case p.CollectiveBytes < 4:
		return fmt.Errorf("collective size %d bytes: want at least 4", p.CollectiveBytes)
	}
	for _, g := range p.Groups {
		if !slices.Contains(Groups, g) {
			return fmt.Errorf("test group %q: want one of %s", g, strings.Join(Groups, ", "))
		}
	}
	for _, d := range p.Devices {
		if d < 0 {
			return fmt.Errorf("GPU %d: want a GPU number, 0 or more", d)
		}
	}
	return nil
}

// runs reports whether the plan runs a group.
func (p Plan) runs(group string) bool {
	return len(p.Groups) == 0 || slices.Contains(p.Groups, group)
}

// task is one test of a run.
type task struct {
	test string
	// devs are driver ordinals: one GPU, or source then destination, or
	// every GPU of a collective.
	devs []int
	// memory and node for host tests: node is the host NUMA node, AnyNode
	// when not placed; local says whether it is the GPU's own.
	memory MemKind
	node   int
	local  *bool
	op     Op
}

func (t task) String() string {
	switch t.test {
	case TestH2D, TestD2H:
		where := "host memory not placed"
		if t.node != AnyNode {
			where = fmt.Sprintf("NUMA node %d", t.node)
		}
		return fmt.Sprintf("%s GPU%d %s (%s)", t.test, t.devs[0], t.memory, where)
	case TestDevice:
		return fmt.Sprintf("device memory GPU%d", t.devs[0])
	case TestP2P, TestP2PLatency:
		return fmt.Sprintf("%s GPU%d->GPU%d", t.test, t.devs[0], t.devs[1])
	case TestP2PBidi:
		return fmt.Sprintf("%s GPU%d<->GPU%d", t.test, t.devs[0], t.devs[1])
	}
	return string(t.op)
}

// tasks lists the tests of a plan on these devices, in the order they
// run, and notes on what is left out.
func (p Plan) tasks(devs []Device, hostNodes []int) ([]task, []string) {
	var out []task
	var notes []string
	yes, no := true, false
	if p.runs(GroupHost) {
		noRemote := false
		for _, d := range devs {
			local := AnyNode
			if d.NUMANode != nil && *d.NUMANode >= 0 && slices.Contains(hostNodes, *d.NUMANode) {
				local = *d.NUMANode
			}
			type place struct {
				node  int
				local *bool
			}
			var places []place
			if local == AnyNode {
				places = append(places, place{AnyNode, nil})
				notes = append(notes, fmt.Sprintf("GPU%d: its NUMA node is not known, so host memory was not placed on a node", d.Ordinal))
			} else {
				places = append(places, place{local, &yes})
				remote := AnyNode
				for _, n := range hostNodes {
					if n != local {
						remote = n
						break
					}
				}
				if remote != AnyNode {
					places = append(places, place{remote, &no})
				} else {
					noRemote = true
				}
			}
			for _, pl := range places {
				for _, mem := range []MemKind{HostPinned, HostPageable} {
					for _, test := range []string{TestH2D, TestD2H} {
						out = append(out, task{test: test, devs: []int{d.Ordinal}, memory: mem, node: pl.node, local: pl.local})
					}
				}
			}
		}
		if noRemote {
			notes = append(notes, "the host has one NUMA node with memory: host transfers from another node were not measured")
		}
	}
	if p.runs(GroupDevice) {
		for _, d := range devs {
			out = append(out, task{test: TestDevice, devs: []int{d.Ordinal}, memory: DeviceMemory})
		}
	}
	if len(devs) < 2 {
		if p.runs(GroupP2P) || p.runs(GroupLatency) {
			notes = append(notes, "one GPU: peer-to-peer tests need two or more")
		}
		return out, notes
	}
	if p.runs(GroupP2P) {
		for _, a := range devs {
			for _, b := range devs {
				if a.Ordinal != b.Ordinal {
					out = append(out, task{test: TestP2P, devs: []int{a.Ordinal, b.Ordinal}})
				}
			}
		}
		for i, a := range devs {
			for _, b := range devs[i+1:] {
				out = append(out, task{test: TestP2PBidi, devs: []int{a.Ordinal, b.Ordinal}})
			}
		}
	}
	if p.runs(GroupLatency) {
		for i, a := range devs {
			for _, b := range devs[i+1:] {
				out = append(out, task{test: TestP2PLatency, devs: []int{a.Ordinal, b.Ordinal}})
			}
		}
	}
	return out, notes
}

// collectiveTasks lists the collectives over devs, which belong to a
// communicator of ranks ranks (more than len(devs) across nodes).
func (p Plan) collectiveTasks(devs []Device, ranks int) []task {
	if !p.runs(GroupCollective) || ranks < 2 || len(devs) == 0 {
		return nil
	}
	all := make([]int, len(devs))
	for i, d := range devs {
		all[i] = d.Ordinal
	}
	var out []task
	for _, op := range Ops {
		out = append(out, task{test: string(op), devs: all, op: op})
	}
	return out
}
