// Package dra describes the GPUs of a node as Kubernetes Dynamic Resource
// Allocation devices of the driver gpu.kiln.dev: ResourceSlices whose
// attributes carry what kiln knows of each GPU (PCIe placement, versions as
// semantic versions, NVLink island and bandwidth, xGMI hive, health), MIG
// placements as partitionable devices with shared counters, AMD compute
// partitions as devices of their own, and the doctor's findings as device
// taints.
//
// Build is a pure function of a Snapshot, its topology matrix, the doctor's
// report and the knowledge base. Publishing (the kubelet plugin) and
// reading machines live elsewhere, so that nothing here talks to a cluster.
package dra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

// DriverName is the DRA driver kiln publishes devices as.
const DriverName = "gpu.kiln.dev"

// Device types, the value of the "type" attribute.
const (
	TypeGPU       = "gpu"
	TypeMIG       = "mig"
	TypePartition = "partition"
	// TypeFraction is a whole GPU shared by several claims, each taking
	// part of its memory (consumable capacity).
	TypeFraction = "fraction"
)

// Health values of the "health" attribute.
const (
	HealthHealthy  = "healthy"
	HealthWarning  = "warning"
	HealthCritical = "critical"
)

// Input is what a node's ResourceSlices are made from.
type Input struct {
	Snapshot *snapshot.Snapshot
	// Matrix is the node's link matrix; nil means topo.Build.
	Matrix *topo.Matrix
	// Report is the doctor's report on the node; nil means doctor.Run.
	Report *doctor.Report
	// KB is the knowledge base; nil means kb.Default().
	KB *kb.KB
	// NodeName is the Kubernetes node (and pool) the devices belong to;
	// empty means the Snapshot's host name made a DNS name.
	NodeName string
	// Shared are the indices of the GPUs published as fractions: one device
	// that several claims share, each consuming part of its memory
	// (Kubernetes' consumable capacity, feature DRAConsumableCapacity). A
	// shared GPU is not published whole besides. GPUs in MIG mode and AMD
	// GPUs split into partitions are published as those, with a note.
	Shared []int
}

// Slice is the content of one ResourceSlice: devices or shared counters,
// never both (the API's rule).
type Slice struct {
	Devices        []resourceapi.Device
	SharedCounters []resourceapi.CounterSet
}

// Result is what Build makes of one node.
type Result struct {
	NodeName string
	// Slices is the pool, split within the API's per-slice limits; the
	// counter sets come first.
	Slices []Slice
	// Notes say what was left out and why, for the reader.
	Notes []string
	// Targets says, for each device name, what on the node it stands for.
	Targets map[string]Target `json:"-"`
}

// Target is what a published device stands for on the node: a GPU (by its
// Snapshot index), one of its MIG instances, or one of its partitions.
type Target struct {
	GPUIndex int
	// MIG is set for a MIG device; Exists is false for a placement that
	// has no instance yet.
	MIG *MIGTarget
	// Partition is the partition number of an AMD partition, -1 otherwise.
	Partition int
	// Shared is set for a GPU published as fractions: several claims may
	// hold it at once.
	Shared bool
}

// MIGTarget is a MIG device's instance and placement.
type MIGTarget struct {
	Profile                      string
	Start                        int
	Exists                       bool
	GPUInstance, ComputeInstance int
}

// Devices returns every device of the pool, in slice order.
func (r *Result) Devices() []resourceapi.Device {
	var out []resourceapi.Device
	for _, s := range r.Slices {
		out = append(out, s.Devices...)
	}
	return out
}

// maxDevicesPerSlice is the API's limit for slices with taints or counters.
const maxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// maxCounterSetsPerSlice is the API's limit of counter sets per slice.
const maxCounterSetsPerSlice = resourceapi.ResourceSliceMaxCounterSets

// Build describes the node's GPUs as DRA devices. The result passes
// Validate; a GPU kiln cannot describe within the API's limits is left out
// with a note rather than published wrong.
func Build(ctx context.Context, in Input) (*Result, error) {
	s := in.Snapshot
	if s == nil {
		return nil, errors.New("no snapshot to describe")
	}
	k := in.KB
	if k == nil {
		k = kb.Default()
	}
	m := in.Matrix
	if m == nil {
		var err error
		if m, err = topo.Build(s, k); err != nil {
			return nil, fmt.Errorf("building the link matrix: %w", err)
		}
	}
	rep := in.Report
	if rep == nil {
		var err error
		if rep, err = doctor.Run(ctx, s, k); err != nil {
			return nil, fmt.Errorf("running the doctor: %w", err)
		}
	}
	node := in.NodeName
	if node == "" {
		node = DNSSubdomain(s.Host.Hostname)
	}
	if node == "" {
		return nil, errors.New("the node has no name: the snapshot has no host name, so give the node's name")
	}
	if DNSSubdomain(node) != node {
		return nil, fmt.Errorf("node name %q is not a DNS name (lowercase letters, digits, '-' and '.')", node)
	}
	b := &builder{s: s, k: k, m: m, rep: rep, res: &Result{NodeName: node, Targets: map[string]Target{}}, shared: map[int]bool{}}
	b.collect()
	if err := b.share(in.Shared); err != nil {
		return nil, err
	}
	b.islands()
	b.health()
	var devices []resourceapi.Device
	var counters []resourceapi.CounterSet
	for _, g := range b.gpus {
		ds, cs := b.devicesOf(g)
		devices = append(devices, ds...)
		counters = append(counters, cs...)
	}
	for i := range devices {
		b.fit(&devices[i])
	}
	b.res.Slices = split(devices, counters)
	if err := ValidateSlices(b.res.Slices); err != nil {
		return nil, fmt.Errorf("node %s: kiln made devices the API would refuse: %w", node, err)
	}
	return b.res, nil
}

// split lays devices and counter sets out in slices within the limits.
func split(devices []resourceapi.Device, counters []resourceapi.CounterSet) []Slice {
	var out []Slice
	for len(counters) > 0 {
		n := min(len(counters), maxCounterSetsPerSlice)
		out = append(out, Slice{SharedCounters: counters[:n:n]})
		counters = counters[n:]
	}
	for len(devices) > 0 {
		n := min(len(devices), maxDevicesPerSlice)
		out = append(out, Slice{Devices: devices[:n:n]})
		devices = devices[n:]
	}
	if len(out) == 0 {
		// An empty pool still tells the scheduler the node has none.
		out = append(out, Slice{})
	}
	return out
}

// gpuFacts is what the builder gathered about one GPU.
type gpuFacts struct {
	g     *snapshot.GPU
	name  string // device name, "gpu-<index>"
	pci   string // canonical, "" when unknown
	model kb.GPUModel
	known bool
	row   int // matrix row, -1 when none

	island, islandSize int // -1 when in no NVLink island
	nvlinkGBps         float64
	nvlinkLinks        int
	hiveSize           int

	health string
	taints []resourceapi.DeviceTaint
}

type builder struct {
	s      *snapshot.Snapshot
	k      *kb.KB
	m      *topo.Matrix
	rep    *doctor.Report
	res    *Result
	gpus   []*gpuFacts
	shared map[int]bool // by GPU index
}

func (b *builder) note(format string, args ...any) {
	b.res.Notes = append(b.res.Notes, fmt.Sprintf(format, args...))
}

func (b *builder) collect() {
	gs := make([]*snapshot.GPU, 0, len(b.s.GPUs))
	for i := range b.s.GPUs {
		gs = append(gs, &b.s.GPUs[i])
	}
	slices.SortStableFunc(gs, func(x, y *snapshot.GPU) int { return x.Index - y.Index })
	rowByPCI := map[string]int{}
	rows := b.m.GPUs()
	for _, r := range rows {
		if p := b.m.Devices[r].PCI; p != "" {
			rowByPCI[p] = r
		}
	}
	seen := map[string]bool{}
	for i, g := range gs {
		f := &gpuFacts{g: g, row: -1, island: -1}
		f.name = DNSLabel(fmt.Sprintf("gpu-%d", g.Index))
		if seen[f.name] {
			b.note("GPU %d is listed twice in the snapshot; only the first is published", g.Index)
			continue
		}
		seen[f.name] = true
		if g.PCIAddress != "" {
			if c, err := snapshot.CanonicalPCI(g.PCIAddress); err == nil {
				f.pci = c
			}
		}
		if r, ok := rowByPCI[f.pci]; ok && f.pci != "" {
			f.row = r
		} else if i < len(rows) {
			f.row = rows[i]
		}
		if g.DeviceID != "" {
			f.model, f.known = b.k.GPUByDeviceID(g.Vendor, g.DeviceID)
		}
		if !f.known && g.Model != "" {
			f.model, f.known = b.k.GPUByName(g.Model)
		}
		b.gpus = append(b.gpus, f)
	}
	hives := map[string]int{}
	for _, f := range b.gpus {
		if h := strings.TrimSpace(f.g.XGMIHive); h != "" {
			hives[h]++
		}
	}
	for _, f := range b.gpus {
		f.hiveSize = hives[strings.TrimSpace(f.g.XGMIHive)]
	}
}

// isNVLink reports whether a matrix cell is an NVLink connection.
func isNVLink(c topo.Cell) bool {
	if c.Kind == topo.LinkNVLink {
		return true
	}
	cls := strings.ToUpper(c.Class)
	return c.Kind == "" && strings.HasPrefix(cls, "NV") && cls != "NODE"
}

// islands groups GPUs joined by NVLink (directly or through NVSwitches)
// into islands, numbered from 0 in GPU order; a GPU without an NVLink to
// another GPU is in none.
func (b *builder) islands() {
	n := len(b.gpus)
	parent := make([]int, n)
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	linked := make([]bool, n)
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			a, c := b.gpus[i].row, b.gpus[j].row
			if a < 0 || c < 0 || a >= len(b.m.Cells) || c >= len(b.m.Cells[a]) {
				continue
			}
			cell := b.m.Cells[a][c]
			if !isNVLink(cell) {
				continue
			}
			linked[i], linked[j] = true, true
			if ri, rj := find(i), find(j); ri != rj {
				parent[max(ri, rj)] = min(ri, rj)
			}
			for _, x := range []int{i, j} {
				f := b.gpus[x]
				f.nvlinkGBps = max(f.nvlinkGBps, cell.GBpsUni)
				f.nvlinkLinks = max(f.nvlinkLinks, cell.Links)
			}
		}
	}
	ids := map[int]int{}
	sizes := map[int]int{}
	for i := range b.gpus {
		if linked[i] {
			sizes[find(i)]++
		}
	}
	for i, f := range b.gpus {
		if !linked[i] {
			continue
		}
		r := find(i)
		id, ok := ids[r]
		if !ok {
			id = len(ids)
			ids[r] = id
		}
		f.island, f.islandSize = id, sizes[r]
	}
	// Active NVLinks the GPU reports count where the matrix has none.
	for _, f := range b.gpus {
		if f.nvlinkLinks > 0 {
			continue
		}
		active := 0
		for _, l := range f.g.NVLinks {
			if l.State == "active" {
				active++
			}
		}
		if f.island >= 0 {
			f.nvlinkLinks = active
		}
	}
}

// dropOrder lists the attributes given up first when a device would carry
// more attributes and capacities than the API allows.
var dropOrder = []string{
	AttrVBIOS, AttrPCIeMaxLinkWidth, AttrPCIeMaxLinkGen, AttrPCIeLinkWidth, AttrPCIeLinkGen,
	AttrNVLinkLinks, AttrXGMIHiveSize, AttrIndex, AttrParentDevice, AttrArchitecture,
}

// fit keeps a device within the API's limit of attributes and capacities,
// dropping the least useful attributes first, with a note.
func (b *builder) fit(d *resourceapi.Device) {
	limit := resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice
	var dropped []string
	for _, name := range dropOrder {
		if len(d.Attributes)+len(d.Capacity) <= limit {
			break
		}
		if _, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok {
			delete(d.Attributes, resourceapi.QualifiedName(name))
			dropped = append(dropped, name)
		}
	}
	if len(dropped) > 0 {
		b.note("%s: %s left out to stay within %d attributes and capacities", d.Name, strings.Join(dropped, ", "), limit)
	}
}

// multiprocessors is the GPU's number of SMs or CUs from the catalogue; 0
// when the model is unknown or the catalogue has no figure.
func (f *gpuFacts) multiprocessors() int {
	if !f.known {
		return 0
	}
	return f.model.DeviceMultiprocessors()
}

// share marks the GPUs to publish as fractions; an index the node does not
// have is an error (a typo must not leave a GPU unshared silently).
func (b *builder) share(indices []int) error {
	have := map[int]bool{}
	for _, f := range b.gpus {
		have[f.g.Index] = true
	}
	for _, i := range indices {
		if !have[i] {
			return fmt.Errorf("GPU %d is to be shared, but the node has no GPU %d", i, i)
		}
		b.shared[i] = true
	}
	return nil
}

// ParseShared reads which GPUs to share as fractions: "" none, "all" every
// GPU of the snapshot, or indices separated by commas ("0,2").
func ParseShared(spec string, s *snapshot.Snapshot) ([]int, error) {
	spec = strings.TrimSpace(spec)
	switch spec {
	case "", "none":
		return nil, nil
	case "all":
		var out []int
		for _, g := range s.GPUs {
			out = append(out, g.Index)
		}
		return out, nil
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || i < 0 {
			return nil, fmt.Errorf("--shared %q: want all, none or GPU indices separated by commas (0,2), not %q", spec, f)
		}
		out = append(out, i)
	}
	return out, nil
}
