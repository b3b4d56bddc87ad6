// Package kfd reads AMD's KFD topology tree (/sys/class/kfd/kfd/topology,
// or a copy of it) and turns it into a Snapshot: one GPU per physical GPU
// (partitions of one GPU grouped), its PCI address, gfx target, xGMI hive,
// NUMA node, and the xGMI and PCIe links between GPUs.
//
// The tree holds nodes/<n>/properties ("key value" lines), with
// nodes/<n>/io_links/<m>/properties (direct links), p2p_links/<m>/properties
// (indirect peer paths, newer kernels) and mem_banks/<m>/properties, and at
// the top system_properties and generation_id. Everything but the node
// properties is optional: copies of the tree are often partial.
package kfd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Limits that keep a damaged or hostile tree from exhausting memory.
const (
	maxNodes     = 4096
	maxLinks     = 1024 // per node and kind
	maxPropsSize = 1 << 20
)

// Topology is the raw content of a KFD topology tree.
type Topology struct {
	// Nodes sorted by id.
	Nodes []Node
	// System is system_properties when present.
	System Properties
	// Generation is generation_id when present.
	Generation string
	// Unreadable lists nodes whose properties could not be read (a hung
	// GPU's sysfs files fail to read; a copy holds them empty).
	Unreadable []int
}

// Node is one KFD node: a CPU socket (NUMA node), a GPU, or one partition
// of a GPU.
type Node struct {
	ID       int
	Props    Properties
	IOLinks  []Link
	P2PLinks []Link
	// MemBanks are mem_banks/<m>/properties, when copied.
	MemBanks []Properties
}

// Link is one io_links or p2p_links entry.
type Link struct {
	Type   uint64
	From   int
	To     int
	Weight uint64
	// MinBandwidth and MaxBandwidth are in MB/s; 0 when the kernel does not say.
	MinBandwidth uint64
	MaxBandwidth uint64
	Flags        uint64
}

// IsGPU says whether the node has compute units (a GPU, a GPU partition or
// an APU).
func (n Node) IsGPU() bool { return n.Props.U("simd_count") > 0 }

// IsCPU says whether the node has CPU cores (a CPU socket or an APU).
func (n Node) IsCPU() bool { return n.Props.U("cpu_cores_count") > 0 }

// Root finds the topology directory inside fsys: fsys itself when it holds
// nodes/<n>/properties, else a "topology" folder, else the only folder
// (repeated twice, for copies such as "host/topology/nodes/..."). It returns
// false when none is found.
func Root(fsys fs.FS) (fs.FS, bool) {
	cur := fsys
	for depth := 0; depth < 3; depth++ {
		if looksLikeTopology(cur) {
			return cur, true
		}
		ents, err := fs.ReadDir(cur, ".")
		if err != nil {
			return nil, false
		}
		next := ""
		dirs := 0
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			dirs++
			if e.Name() == "topology" {
				next = "topology"
				break
			}
			next = e.Name()
		}
		if next == "" || (dirs > 1 && next != "topology") {
			return nil, false
		}
		sub, err := fs.Sub(cur, next)
		if err != nil {
			return nil, false
		}
		cur = sub
	}
	return nil, false
}

// looksLikeTopology says whether fsys has nodes/<n>/properties for a
// numeric n whose content carries KFD's keys.
func looksLikeTopology(fsys fs.FS) bool {
	ents, err := fs.ReadDir(fsys, "nodes")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || !e.IsDir() {
			continue
		}
		b, err := readSmall(fsys, path.Join("nodes", e.Name(), "properties"))
		if err != nil {
			continue
		}
		p, err := ParseProperties(b)
		if err != nil {
			return false
		}
		return p.Has("simd_count") && (p.Has("cpu_cores_count") || p.Has("gfx_target_version"))
	}
	return false
}

// ReadTopology reads the tree rooted at fsys (the topology folder itself;
// see Root for copies that hold it deeper).
func ReadTopology(fsys fs.FS) (*Topology, error) {
	ents, err := fs.ReadDir(fsys, "nodes")
	if err != nil {
		return nil, fmt.Errorf("kfd topology: %w", err)
	}
	t := &Topology{}
	for _, e := range ents {
		id, err := strconv.Atoi(e.Name())
		if err != nil || id < 0 || !e.IsDir() {
			continue
		}
		if len(t.Nodes) >= maxNodes {
			return nil, fmt.Errorf("kfd topology: more than %d nodes", maxNodes)
		}
		n, err := readNode(fsys, id)
		if errors.Is(err, errUnreadable) {
			t.Unreadable = append(t.Unreadable, id)
			continue
		}
		if err != nil {
			return nil, err
		}
		t.Nodes = append(t.Nodes, n)
	}
	if len(t.Nodes) == 0 {
		return nil, errors.New("kfd topology: no nodes/<n>/properties found")
	}
	sort.Slice(t.Nodes, func(i, j int) bool { return t.Nodes[i].ID < t.Nodes[j].ID })
	if b, err := readSmall(fsys, "system_properties"); err == nil {
		if p, err := ParseProperties(b); err == nil {
			t.System = p
		}
	}
	if b, err := readSmall(fsys, "generation_id"); err == nil {
		t.Generation = strings.TrimSpace(string(b))
	}
	return t, nil
}

// errUnreadable marks a node whose properties file is missing or empty.
var errUnreadable = errors.New("properties missing or empty")

func readNode(fsys fs.FS, id int) (Node, error) {
	dir := path.Join("nodes", strconv.Itoa(id))
	b, err := readSmall(fsys, path.Join(dir, "properties"))
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(strings.TrimSpace(string(b))) == 0) {
		return Node{}, fmt.Errorf("kfd topology: node %d: %w", id, errUnreadable)
	}
	if err != nil {
		return Node{}, fmt.Errorf("kfd topology: node %d: %w", id, err)
	}
	p, err := ParseProperties(b)
	if err != nil {
		return Node{}, fmt.Errorf("kfd topology: %s/properties: %w", dir, err)
	}
	n := Node{ID: id, Props: p}
	if n.IOLinks, err = readLinks(fsys, path.Join(dir, "io_links")); err != nil {
		return Node{}, err
	}
	if n.P2PLinks, err = readLinks(fsys, path.Join(dir, "p2p_links")); err != nil {
		return Node{}, err
	}
	for _, sub := range numberedDirs(fsys, path.Join(dir, "mem_banks")) {
		b, err := readSmall(fsys, path.Join(dir, "mem_banks", sub, "properties"))
		if err != nil {
			continue
		}
		mp, err := ParseProperties(b)
		if err != nil {
			return Node{}, fmt.Errorf("kfd topology: %s/mem_banks/%s/properties: %w", dir, sub, err)
		}
		n.MemBanks = append(n.MemBanks, mp)
	}
	return n, nil
}

func readLinks(fsys fs.FS, dir string) ([]Link, error) {
	var out []Link
	for _, sub := range numberedDirs(fsys, dir) {
		file := path.Join(dir, sub, "properties")
		b, err := readSmall(fsys, file)
		if err != nil {
			continue // a partial copy: the folder without its file
		}
		p, err := ParseProperties(b)
		if err != nil {
			return nil, fmt.Errorf("kfd topology: %s: %w", file, err)
		}
		from, ok1, err1 := p.Uint("node_from")
		to, ok2, err2 := p.Uint("node_to")
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("kfd topology: %s: %w", file, err)
		}
		if !ok1 || !ok2 || from > maxNodes*4 || to > maxNodes*4 {
			return nil, fmt.Errorf("kfd topology: %s: node_from and node_to are required", file)
		}
		out = append(out, Link{
			Type: p.U("type"), From: int(from), To: int(to), Weight: p.U("weight"),
			MinBandwidth: p.U("min_bandwidth"), MaxBandwidth: p.U("max_bandwidth"), Flags: p.U("flags"),
		})
		if len(out) > maxLinks {
			return nil, fmt.Errorf("kfd topology: %s: more than %d links", dir, maxLinks)
		}
	}
	return out, nil
}

// numberedDirs lists the numeric sub-folders of dir in numeric order; none
// when dir is absent.
func numberedDirs(fsys fs.FS, dir string) []string {
	ents, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil
	}
	var ids []int
	for _, e := range ents {
		if id, err := strconv.Atoi(e.Name()); err == nil && id >= 0 && e.IsDir() {
			ids = append(ids, id)
		}
	}
	sort.Ints(ids)
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.Itoa(id)
	}
	return out
}

func readSmall(fsys fs.FS, name string) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%s is a directory", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxPropsSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxPropsSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, maxPropsSize)
	}
	return b, nil
}
