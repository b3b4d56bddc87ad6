package kfd

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// SourceKind is the Source.Kind of snapshots built from a live tree.
const SourceKind = "kfd"

// xgmiHopWeight is the io_link weight the kernel gives one xGMI hop
// (kfd_crat.c: weight = 15 x hops between directly linked peers).
const xgmiHopWeight = 15

// Memory heap types of mem_banks (kfd_crat.h): frame buffer, public and private.
const (
	heapFBPublic  = 1
	heapFBPrivate = 2
)

// Read reads a KFD topology tree (os.DirFS("/sys/class/kfd/kfd/topology")
// or a copy; see Root) and returns it as a Snapshot.
func Read(fsys fs.FS) (*snapshot.Snapshot, error) {
	root, ok := Root(fsys)
	if !ok {
		return nil, errors.New("kfd topology: no nodes/<n>/properties with KFD keys found")
	}
	t, err := ReadTopology(root)
	if err != nil {
		return nil, err
	}
	return t.Snapshot(), nil
}

// physical is one physical GPU: one KFD node, or the partition nodes that
// share its unique_id.
type physical struct {
	nodes []Node // sorted by location_id, then id
	addr  string
}

// Snapshot builds the node model: CPU nodes become Host.NUMANodes, GPU
// nodes are grouped into physical GPUs, and io_links/p2p_links between
// GPUs become Links aggregated per GPU pair.
func (t *Topology) Snapshot() *snapshot.Snapshot {
	s := snapshot.New()
	s.Sources = []snapshot.Source{{Kind: SourceKind}}

	numa := map[int]int{} // CPU node id -> NUMA node
	for _, n := range t.Nodes {
		if !n.IsCPU() {
			continue
		}
		numa[n.ID] = len(s.Host.NUMANodes)
		s.Host.NUMANodes = append(s.Host.NUMANodes, snapshot.NUMANode{
			ID:          len(s.Host.NUMANodes),
			MemoryBytes: bankBytes(n.MemBanks, -1),
		})
	}

	gpus := groupGPUs(t.Nodes)
	owner := map[int]int{} // node id -> index in gpus
	for i, g := range gpus {
		for _, n := range g.nodes {
			owner[n.ID] = i
		}
	}
	expected := map[uint64]int{} // device id -> most partitions any GPU of it shows
	for _, g := range gpus {
		d := g.nodes[0].Props.U("device_id")
		expected[d] = max(expected[d], len(g.nodes))
	}

	for i, g := range gpus {
		gpu, note := buildGPU(i, g, numa, expected[g.nodes[0].Props.U("device_id")])
		s.GPUs = append(s.GPUs, gpu)
		if note != "" {
			s.Notes = append(s.Notes, snapshot.Note{Source: SourceKind, Message: note})
		}
	}
	s.Links = buildLinks(t.Nodes, gpus, owner)
	if ev, ok := t.missingNodes(); ok {
		s.Events = append(s.Events, ev)
	}
	return s
}

// missingNodes: nodes the tree lacks (a gap in the numbering, a link to a
// node that is not there) or cannot read are GPUs or sockets the kernel
// knew and the copy does not show: a GPU that hung or fell away.
func (t *Topology) missingNodes() (snapshot.Event, bool) {
	have := map[int]bool{}
	maxID := -1
	for _, n := range t.Nodes {
		have[n.ID] = true
		maxID = max(maxID, n.ID)
	}
	for _, u := range t.Unreadable {
		maxID = max(maxID, u)
	}
	var why []string
	for _, u := range t.Unreadable {
		why = append(why, fmt.Sprintf("node %d has no readable properties", u))
	}
	unread := map[int]bool{}
	for _, u := range t.Unreadable {
		unread[u] = true
	}
	for id := 0; id < maxID && len(why) < 16; id++ {
		if !have[id] && !unread[id] {
			why = append(why, fmt.Sprintf("node %d is missing between nodes 0 and %d", id, maxID))
		}
	}
	for _, n := range t.Nodes {
		for _, l := range append(append([]Link(nil), n.IOLinks...), n.P2PLinks...) {
			if !have[l.To] && !unread[l.To] && len(why) < 16 {
				why = append(why, fmt.Sprintf("node %d links to node %d, which is missing", n.ID, l.To))
				have[l.To] = true // once per node
			}
		}
	}
	if len(why) == 0 {
		return snapshot.Event{}, false
	}
	return snapshot.Event{Source: SourceKind, Kind: snapshot.EventToolError, Reason: snapshot.ToolGPUError,
		Message: "KFD topology incomplete: " + strings.Join(why, "; ")}, true
}

func groupGPUs(nodes []Node) []*physical {
	byKey := map[string]*physical{}
	var order []*physical
	for _, n := range nodes {
		if !n.IsGPU() {
			continue
		}
		key := "n" + strconv.Itoa(n.ID)
		loc, hasLoc, _ := n.Props.Uint("location_id")
		dom := n.Props.U("domain")
		switch {
		case n.Props.U("unique_id") != 0:
			key = "u" + strconv.FormatUint(n.Props.U("unique_id"), 10)
		case hasLoc && loc != 0:
			// Partitions are functions of one PCI device.
			key = fmt.Sprintf("p%d:%d", dom, loc>>3)
		}
		g := byKey[key]
		if g == nil {
			g = &physical{}
			byKey[key] = g
			order = append(order, g)
		}
		g.nodes = append(g.nodes, n)
	}
	for _, g := range order {
		sort.SliceStable(g.nodes, func(i, j int) bool {
			a, b := g.nodes[i].Props.U("location_id"), g.nodes[j].Props.U("location_id")
			if a != b {
				return a < b
			}
			return g.nodes[i].ID < g.nodes[j].ID
		})
		p := g.nodes[0].Props
		if p.Has("location_id") {
			g.addr = PCIAddress(p.U("domain"), p.U("location_id"))
		}
	}
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if a.addr != "" && b.addr != "" && a.addr != b.addr {
			return a.addr < b.addr
		}
		return a.nodes[0].ID < b.nodes[0].ID
	})
	return order
}

func buildGPU(index int, g *physical, numa map[int]int, expected int) (snapshot.GPU, string) {
	first := g.nodes[0]
	p := first.Props
	gpu := snapshot.GPU{
		Index:      index,
		Vendor:     snapshot.VendorAMD,
		PCIAddress: g.addr,
		GFXTarget:  GFXTarget(p.U("gfx_target_version")),
	}
	if d := p.U("device_id"); d > 0 && d <= 0xffff {
		gpu.DeviceID = fmt.Sprintf("%04x", d)
	}
	if u := p.U("unique_id"); u != 0 {
		gpu.UniqueID = fmt.Sprintf("0x%x", u)
	}
	if h := p.U("hive_id"); h != 0 {
		gpu.XGMIHive = strconv.FormatUint(h, 10)
	}
	for _, n := range g.nodes {
		gpu.KFDNodes = append(gpu.KFDNodes, n.ID)
	}
	sort.Ints(gpu.KFDNodes)

	if mode := partitionMode(expected, p.U("num_xcc")); mode != "" {
		gpu.Partition = &snapshot.Partition{Compute: mode, Count: len(g.nodes)}
	}
	note := ""
	if len(g.nodes) < expected {
		name := g.addr
		if name == "" {
			name = "with KFD node " + strconv.Itoa(first.ID)
		}
		note = fmt.Sprintf("GPU %s shows %d KFD partition nodes where other GPUs of its model show %d: the topology is incomplete or a partition is missing",
			name, len(g.nodes), expected)
	}

	// Memory: only for an unpartitioned GPU, where the node's memory is the
	// GPU's. local_mem_size 0 means "not reported", not "no memory".
	if len(g.nodes) == 1 {
		if b := bankBytes(first.MemBanks, heapFBPublic, heapFBPrivate); b > 0 {
			gpu.MemoryTotalBytes = b
		} else if m := p.U("local_mem_size"); m > 0 {
			gpu.MemoryTotalBytes = m
		}
	}

	// NUMA node: the CPU node this GPU's PCIe io_link leads to.
	for _, n := range g.nodes {
		for _, l := range n.IOLinks {
			if id, ok := numa[l.To]; ok && l.Type == LinkTypePCIe {
				gpu.NUMANode = snapshot.Ptr(id)
				break
			}
		}
		if gpu.NUMANode != nil {
			break
		}
	}
	return gpu, note
}

// bankBytes sums size_in_bytes of the memory banks of the given heap types;
// heap type -1 takes every bank.
func bankBytes(banks []Properties, heaps ...int) uint64 {
	var total uint64
	for _, b := range banks {
		ht := b.U("heap_type")
		for _, h := range heaps {
			if h == -1 || uint64(h) == ht {
				total += b.U("size_in_bytes")
				break
			}
		}
	}
	return total
}

type pairKey struct {
	a, b int
	kind string
}

type pairAgg struct {
	weight uint64
	bwMBps uint64
}

func buildLinks(nodes []Node, gpus []*physical, owner map[int]int) []snapshot.Link {
	agg := map[pairKey]*pairAgg{}
	add := func(l Link) {
		a, okA := owner[l.From]
		b, okB := owner[l.To]
		if !okA || !okB || a == b {
			return // CPU ends, or partitions of one GPU
		}
		kind := ""
		switch l.Type {
		case LinkTypeXGMI:
			kind = snapshot.LinkXGMI
		case LinkTypePCIe:
			kind = snapshot.LinkPCIe
		default:
			return
		}
		if a > b {
			a, b = b, a
		}
		k := pairKey{a, b, kind}
		p := agg[k]
		if p == nil {
			p = &pairAgg{weight: l.Weight}
			agg[k] = p
		}
		if l.Weight > 0 && (p.weight == 0 || l.Weight < p.weight) {
			p.weight = l.Weight
		}
		p.bwMBps = max(p.bwMBps, l.MaxBandwidth)
	}
	for _, n := range nodes {
		for _, l := range n.IOLinks {
			add(l)
		}
		for _, l := range n.P2PLinks {
			add(l)
		}
	}
	name := func(i int) string {
		if gpus[i].addr != "" {
			return gpus[i].addr
		}
		return "GPU" + strconv.Itoa(i)
	}
	keys := make([]pairKey, 0, len(agg))
	for k := range agg {
		// A pair joined by xGMI does not also get its slower PCIe path.
		if k.kind == snapshot.LinkPCIe && agg[pairKey{k.a, k.b, snapshot.LinkXGMI}] != nil {
			continue
		}
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].a != keys[j].a {
			return keys[i].a < keys[j].a
		}
		if keys[i].b != keys[j].b {
			return keys[i].b < keys[j].b
		}
		return keys[i].kind < keys[j].kind
	})
	var out []snapshot.Link
	for _, k := range keys {
		p := agg[k]
		l := snapshot.Link{A: name(k.a), B: name(k.b), Kind: k.kind, Weight: clampInt(p.weight)}
		if k.kind == snapshot.LinkXGMI {
			if p.weight > 0 && p.weight%xgmiHopWeight == 0 {
				l.Hops = clampInt(p.weight / xgmiHopWeight)
			}
			// The kernel fills xGMI max_bandwidth from lanes x rate of one
			// link, per direction (MB/s).
			l.BandwidthGBpsUni = float64(p.bwMBps) / 1000
		}
		out = append(out, l)
	}
	return out
}

func clampInt(v uint64) int {
	if v > 1<<31-1 {
		return 1<<31 - 1
	}
	return int(v)
}
