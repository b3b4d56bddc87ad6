package plan

import (
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

// GPUPerf is a GPU's performance figures: its compute throughput from
// plan/data/gpus.yaml, its memory and memory bandwidth from kiln's GPU
// catalog (package kb), whose row of the same name holds them.
type GPUPerf struct {
	Name string `json:"name"`
	// TFLOPS is the dense peak per precision: fp32, tf32, bf16, fp16, fp8.
	TFLOPS map[string]float64 `json:"tflops"`
	// MemoryGB and MemoryBandwidthGBps are the catalog's (kb.GPUModel).
	MemoryGB            float64 `json:"memory_gb"`
	MemoryBandwidthGBps float64 `json:"memory_bandwidth_gbps"`
	// Attainable is the fraction of peak a transformer's matrix multiplies
	// reach on this GPU.
	Attainable float64 `json:"attainable"`
	// Source is the plan table's source: compute and attainable fraction.
	Source string `json:"source"`
}

// perfRow is one row of plan/data/gpus.yaml: what the GPU catalog does not
// hold. A figure the catalog holds (memory, bandwidth) has no field here, so
// a row that gives it again fails to load.
type perfRow struct {
	Name       string             `json:"name"`
	TFLOPS     map[string]float64 `json:"tflops"`
	Attainable float64            `json:"attainable"`
	Source     string             `json:"source"`
}

//go:embed data/gpus.yaml
var gpusYAML []byte

var (
	perfOnce sync.Once
	perfRows []GPUPerf
	perfErr  error
)

// GPUs returns the GPU performance table: the embedded plan table joined
// with the embedded GPU catalog (kb.Default).
func GPUs() ([]GPUPerf, error) {
	perfOnce.Do(func() { perfRows, perfErr = joinPerf(gpusYAML, kb.Default()) })
	return perfRows, perfErr
}

// joinPerf reads a plan GPU table and takes each row's memory and memory
// bandwidth from the catalog row of the same name.
func joinPerf(data []byte, k *kb.KB) ([]GPUPerf, error) {
	var doc struct {
		Rows []perfRow `json:"rows"`
	}
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, fmt.Errorf("plan: gpus.yaml (memory and bandwidth belong in kb/data/gpus.yaml): %w", err)
	}
	catalog := make(map[string]kb.GPUModel, len(k.GPUs))
	for _, m := range k.GPUs {
		catalog[m.Name] = m
	}
	out := make([]GPUPerf, 0, len(doc.Rows))
	for _, r := range doc.Rows {
		if r.Name == "" || r.Source == "" || r.Attainable <= 0 || r.Attainable > 1 || r.TFLOPS["fp32"] <= 0 {
			return nil, fmt.Errorf("plan: gpus.yaml: row %q needs name, source, fp32 peak and an attainable fraction in (0,1]", r.Name)
		}
		m, ok := catalog[r.Name]
		if !ok {
			return nil, fmt.Errorf("plan: gpus.yaml: row %q has no row of that name in kb/data/gpus.yaml", r.Name)
		}
		if m.MemoryGB <= 0 || m.MemoryBandwidthGBps <= 0 {
			return nil, fmt.Errorf("plan: gpus.yaml: row %q: kb/data/gpus.yaml gives no memory or memory bandwidth for it", r.Name)
		}
		out = append(out, GPUPerf{
			Name:                r.Name,
			TFLOPS:              r.TFLOPS,
			MemoryGB:            m.MemoryGB,
			MemoryBandwidthGBps: m.MemoryBandwidthGBps,
			Attainable:          r.Attainable,
			Source:              r.Source,
		})
	}
	return out, nil
}

// GPUByName finds a GPU's performance row by kiln's name for it, or by any
// name a tool prints that the knowledge base recognises ("NVIDIA H100 80GB
// HBM3", "h100-sxm5-80gb").
func GPUByName(name string, k *kb.KB) (GPUPerf, bool) {
	rows, err := GPUs()
	if err != nil {
		return GPUPerf{}, false
	}
	for _, g := range rows {
		if strings.EqualFold(g.Name, strings.TrimSpace(name)) {
			return g, true
		}
	}
	if k != nil {
		if m, ok := k.GPUByName(name); ok {
			for _, g := range rows {
				if g.Name == m.Name {
					return g, true
				}
			}
		}
	}
	return GPUPerf{}, false
}

// GPUNames lists the GPUs of the performance table.
func GPUNames() []string {
	rows, _ := GPUs()
	out := make([]string, 0, len(rows))
	for _, g := range rows {
		out = append(out, g.Name)
	}
	return out
}

// precisionFallback lists, per precision, what to use when a GPU has no
// tensor path for it.
var precisionFallback = map[string][]string{
	"fp8":  {"fp8", "bf16", "fp16", "fp32"},
	"bf16": {"bf16", "fp16", "fp32"},
	"fp16": {"fp16", "bf16", "fp32"},
	"tf32": {"tf32", "fp32"},
	"fp32": {"fp32"},
}

// Peak returns the dense peak TFLOPS for a precision and the precision it
// really is (a V100 asked for bf16 answers with fp16).
func (g GPUPerf) Peak(precision string) (float64, string) {
	for _, p := range precisionFallback[precision] {
		if v := g.TFLOPS[p]; v > 0 {
			return v, p
		}
	}
	return g.TFLOPS["fp32"], "fp32"
}

// Link is the connection between two GPUs of one node.
type Link struct {
	// Class as kiln topo names it: NV#, XGMI, PIX, PXB, PHB, NODE, SYS.
	Class string `json:"class"`
	// GBpsUni is the rated bandwidth per direction, GB/s.
	GBpsUni float64 `json:"gbps_uni"`
}

// Cluster is the hardware a plan runs on: Nodes identical nodes of
// GPUsPerNode GPUs, the links between the GPUs of a node, and the network
// between nodes.
type Cluster struct {
	GPU GPUPerf `json:"gpu"`
	// MemoryBytes is one GPU's memory (what the node reports when known).
	MemoryBytes float64 `json:"memory_bytes"`
	GPUsPerNode int     `json:"gpus_per_node"`
	Nodes       int     `json:"nodes"`
	// Links[i][j] connects GPU i and GPU j of a node (GPU index order).
	Links [][]Link `json:"links"`
	// NetworkGBps is the network bandwidth per GPU per direction in GB/s
	// (bytes), between nodes.
	NetworkGBps float64 `json:"network_gbps_uni"`
	// Source says where the hardware description came from.
	Source string   `json:"source"`
	Notes  []string `json:"notes,omitempty"`
}

// GPUs is the total number of GPUs.
func (c *Cluster) GPUs() int { return c.GPUsPerNode * c.Nodes }

// CatalogCluster describes nodes of a named GPU from the catalog: HGX-style
// NVSwitch boards get every pair at the NVLink rate of the GPU, xGMI boards
// a full mesh of single links, anything else PCIe through the host (two
// sockets when the node has more than four GPUs).
func CatalogCluster(gpuName string, gpus, perNode int, networkGbps float64, k *kb.KB) (*Cluster, error) {
	if k == nil {
		k = kb.Default()
	}
	perf, ok := GPUByName(gpuName, k)
	if !ok {
		return nil, fmt.Errorf("unknown GPU %q: kiln plan knows %s", gpuName, strings.Join(GPUNames(), ", "))
	}
	if gpus <= 0 {
		return nil, errors.New("--gpus must be at least 1")
	}
	if perNode <= 0 {
		perNode = min(gpus, 8)
	}
	if perNode > gpus {
		perNode = gpus
	}
	if gpus%perNode != 0 {
		return nil, fmt.Errorf("%d GPUs do not split into nodes of %d", gpus, perNode)
	}
	c := &Cluster{
		GPU:         perf,
		MemoryBytes: perf.MemoryGB * 1e9,
		GPUsPerNode: perNode,
		Nodes:       gpus / perNode,
		NetworkGBps: networkGbps / 8,
		Source:      fmt.Sprintf("catalog: %d x %s, %d per node", gpus, perf.Name, perNode),
	}
	row, _ := k.GPUByName(perf.Name)
	c.Links = catalogLinks(row, perNode, k)
	if c.Nodes > 1 && networkGbps <= 0 {
		return nil, fmt.Errorf("%d nodes need the network bandwidth between them: give --network-gbps (per GPU, e.g. 400 for one 400 Gb/s NIC per GPU)", c.Nodes)
	}
	return c, nil
}

func catalogLinks(row kb.GPUModel, n int, k *kb.KB) [][]Link {
	links := make([][]Link, n)
	pcie := k.PCIeGBpsUni(max(row.PCIeGen, 4), max(row.PCIeWidth, 16))
	for i := range links {
		links[i] = make([]Link, n)
		for j := range links[i] {
			var l Link
			switch {
			case i == j:
				l = Link{Class: topo.ClassSelf}
			case row.Interconnect == "nvlink" && row.NVSwitch && row.InterconnectLinks > 0:
				l = Link{Class: fmt.Sprintf("NV%d", row.InterconnectLinks), GBpsUni: float64(row.InterconnectLinks) * k.LinkGBpsUni("nvlink", row.InterconnectGen)}
			case row.Interconnect == "xgmi" && row.InterconnectGen > 0:
				l = Link{Class: topo.ClassXGMI, GBpsUni: k.LinkGBpsUni("xgmi", row.InterconnectGen)}
			case n > 4 && (i < n/2) != (j < n/2):
				l = Link{Class: topo.ClassSys, GBpsUni: pcie}
			default:
				l = Link{Class: topo.ClassNode, GBpsUni: pcie}
			}
			links[i][j] = l
		}
	}
	return links
}

// SnapshotCluster describes nodes like the one a snapshot shows: its GPUs
// (the first perNode of them when perNode is smaller), the link matrix
// kiln topo builds from it, and nodes of them joined by a network of
// networkGbps per GPU.
func SnapshotCluster(s *snapshot.Snapshot, k *kb.KB, gpus int, networkGbps float64) (*Cluster, error) {
	if s == nil {
		return nil, errors.New("no snapshot")
	}
	if k == nil {
		k = kb.Default()
	}
	m, err := topo.Build(s, k)
	if err != nil {
		return nil, err
	}
	idx := m.GPUs()
	if len(idx) == 0 {
		return nil, errors.New("the node has no GPU to plan for")
	}
	model := m.Devices[idx[0]].Model
	var mem uint64
	for _, g := range s.GPUs {
		if model == "" && g.Model != "" {
			model = g.Model
		}
		if g.MemoryTotalBytes > 0 && (mem == 0 || g.MemoryTotalBytes < mem) {
			mem = g.MemoryTotalBytes
		}
	}
	perf, ok := GPUByName(model, k)
	if !ok {
		if model == "" {
			return nil, errors.New("the node's GPU model is unknown; name it with --gpu")
		}
		return nil, fmt.Errorf("kiln plan has no performance figures for %q; name a GPU it knows with --gpu (%s)", model, strings.Join(GPUNames(), ", "))
	}
	for _, i := range idx {
		if d := m.Devices[i].Model; d != "" && d != perf.Name {
			if p, ok := GPUByName(d, k); !ok || p.Name != perf.Name {
				return nil, fmt.Errorf("the node mixes GPU models (%s and %s); kiln plan assumes one model", perf.Name, d)
			}
		}
	}
	perNode := len(idx)
	if gpus <= 0 {
		gpus = perNode
	}
	c := &Cluster{
		GPU:         perf,
		MemoryBytes: perf.MemoryGB * 1e9,
		NetworkGBps: networkGbps / 8,
		Source:      fmt.Sprintf("node %s: %d x %s", hostname(s), perNode, perf.Name),
	}
	if mem > 0 {
		c.MemoryBytes = float64(mem)
	}
	if gpus < perNode {
		perNode = gpus
		c.Notes = append(c.Notes, fmt.Sprintf("using the node's first %d of %d GPUs", gpus, len(idx)))
	}
	if gpus%perNode != 0 {
		return nil, fmt.Errorf("%d GPUs are not whole nodes of %d GPUs like this one", gpus, perNode)
	}
	c.GPUsPerNode, c.Nodes = perNode, gpus/perNode
	if c.Nodes > 1 {
		c.Source += fmt.Sprintf(", %d such nodes", c.Nodes)
		if networkGbps <= 0 {
			return nil, fmt.Errorf("%d nodes need the network bandwidth between them: give --network-gbps (per GPU)", c.Nodes)
		}
	}
	row, _ := k.GPUByName(perf.Name)
	fallback := k.PCIeGBpsUni(max(row.PCIeGen, 3), max(row.PCIeWidth, 16))
	c.Links = make([][]Link, perNode)
	unknown := 0
	for a := 0; a < perNode; a++ {
		c.Links[a] = make([]Link, perNode)
		for b := 0; b < perNode; b++ {
			cell := m.Cells[idx[a]][idx[b]]
			l := Link{Class: cell.Class, GBpsUni: cell.GBpsUni}
			if a != b && l.GBpsUni <= 0 {
				unknown++
				l.GBpsUni = fallback
				if l.Class == "" || l.Class == topo.ClassUnknown {
					l.Class = topo.ClassSys
				}
			}
			c.Links[a][b] = l
		}
	}
	if unknown > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("%d GPU pairs have no rated bandwidth in the link matrix; taken as %.0f GB/s (uni) PCIe", unknown/2, fallback))
	}
	return c, nil
}

func hostname(s *snapshot.Snapshot) string {
	if s.Host.Hostname != "" {
		return s.Host.Hostname
	}
	return "(unnamed)"
}
