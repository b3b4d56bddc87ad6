package dra

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// Attribute names in the driver's domain. Those that mean what NVIDIA's DRA
// driver means keep its spelling.
const (
	AttrType                  = "type"
	AttrVendor                = "vendor"
	AttrIndex                 = "index"
	AttrUUID                  = "uuid"
	AttrProductName           = "productName"
	AttrArchitecture          = "architecture"
	AttrCUDAComputeCapability = "cudaComputeCapability"
	AttrGFXTarget             = "gfxTarget"
	AttrDriverVersion         = "driverVersion"
	AttrCUDADriverVersion     = "cudaDriverVersion"
	AttrROCmVersion           = "rocmVersion"
	AttrNVLinkIsland          = "nvlinkIsland"
	AttrNVLinkIslandSize      = "nvlinkIslandSize"
	AttrNVLinkGBps            = "nvlinkGBpsPerDirection"
	AttrNVLinkLinks           = "nvlinkLinks"
	AttrXGMIHive              = "xgmiHive"
	AttrXGMIHiveSize          = "xgmiHiveSize"
	AttrPCIeSwitch            = "pcieSwitch"
	AttrPCIeLinkGen           = "pcieLinkGen"
	AttrPCIeLinkWidth         = "pcieLinkWidth"
	AttrPCIeMaxLinkGen        = "pcieMaxLinkGen"
	AttrPCIeMaxLinkWidth      = "pcieMaxLinkWidth"
	AttrVBIOS                 = "vbiosVersion"
	AttrHealth                = "health"
	AttrParentUUID            = "parentUUID"
	AttrParentDevice          = "parentDevice"
	AttrProfile               = "profile"
	AttrMIGStart              = "migPlacementStart"
	AttrPartitionIndex        = "partitionIndex"
	AttrComputePartition      = "computePartition"
	AttrMemoryPartition       = "memoryPartition"
)

// Standard attributes every DRA driver may publish (resource.kubernetes.io).
const (
	AttrPCIBusID = "resource.kubernetes.io/pciBusID"
	AttrPCIeRoot = "resource.kubernetes.io/pcieRoot"
	AttrNUMANode = "resource.kubernetes.io/numaNode"
)

// Capacity names.
const (
	CapMemory          = "memory"
	CapMultiprocessors = "multiprocessors"
)

// Counter names of a MIG-capable GPU's counter set.
const (
	CounterComputeSlices   = "compute-slices"
	CounterMediaExtensions = "media-extensions"
)

// CounterMemorySlice names the counter of one MIG memory slice.
func CounterMemorySlice(i int) string { return "memory-slice-" + strconv.Itoa(i) }

// attrs collects one device's attributes.
type attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute

func (a attrs) str(name, v string) {
	v = strings.TrimSpace(v)
	if v == "" {
		return
	}
	v = truncate(v, resourceapi.DeviceAttributeMaxValueLength)
	a[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{StringValue: &v}
}

func (a attrs) int(name string, v int64) {
	a[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{IntValue: &v}
}

func (a attrs) posInt(name string, v int) {
	if v > 0 {
		a.int(name, int64(v))
	}
}

func (a attrs) version(name, v string) {
	sv, ok := Semver(v)
	if !ok || len(sv) > resourceapi.DeviceAttributeMaxValueLength {
		return
	}
	a[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{VersionValue: &sv}
}

// common are the attributes a GPU and every device carved out of it share.
func (b *builder) common(f *gpuFacts) attrs {
	g := f.g
	a := attrs{}
	vendor := strings.ToLower(strings.TrimSpace(g.Vendor))
	if vendor == "" && f.known {
		vendor = f.model.Vendor
	}
	a.str(AttrVendor, vendor)
	a.int(AttrIndex, int64(g.Index))
	a.str(AttrProductName, firstNonEmpty(modelName(f), g.Model))
	a.str(AttrArchitecture, strings.ToLower(firstNonEmpty(g.Architecture, f.model.Architecture)))
	if f.pci != "" {
		a.str(AttrPCIBusID, f.pci)
	}
	if root := b.pcieRoot(f); root != "" {
		a.str(AttrPCIeRoot, root)
	}
	if g.NUMANode != nil && *g.NUMANode >= 0 {
		a.int(AttrNUMANode, int64(*g.NUMANode))
	}
	switch vendor {
	case snapshot.VendorNVIDIA:
		a.version(AttrCUDAComputeCapability, firstNonEmpty(g.ComputeCapability, f.model.ComputeCapability))
		driver := firstNonEmpty(b.s.Drivers.NVIDIAUser, b.s.Drivers.NVIDIAKernel)
		a.version(AttrDriverVersion, driver)
		a.version(AttrCUDADriverVersion, firstNonEmpty(b.s.Drivers.CUDADriver, b.k.MaxCUDAForDriver(driver)))
	case snapshot.VendorAMD:
		a.str(AttrGFXTarget, strings.ToLower(firstNonEmpty(g.GFXTarget, f.model.GFXTarget)))
		a.version(AttrDriverVersion, b.s.Drivers.AMDGPU)
		a.version(AttrROCmVersion, firstNonEmpty(b.s.Drivers.ROCm, toolkit(b.s, "rocm")))
	default:
		a.version(AttrDriverVersion, firstNonEmpty(b.s.Drivers.NVIDIAUser, b.s.Drivers.AMDGPU))
	}
	if f.island >= 0 {
		a.int(AttrNVLinkIsland, int64(f.island))
		a.int(AttrNVLinkIslandSize, int64(f.islandSize))
		if gbps := f.nvlinkGBps; gbps > 0 && !math.IsInf(gbps, 0) {
			a.int(AttrNVLinkGBps, int64(math.Round(gbps)))
		}
		a.posInt(AttrNVLinkLinks, f.nvlinkLinks)
	}
	if h := strings.TrimSpace(g.XGMIHive); h != "" {
		a.str(AttrXGMIHive, h)
		a.posInt(AttrXGMIHiveSize, f.hiveSize)
	}
	if sw := b.pcieSwitch(f); sw != "" {
		a.str(AttrPCIeSwitch, sw)
	}
	if l := g.PCIe; l != nil {
		a.posInt(AttrPCIeLinkGen, l.CurrentGen)
		a.posInt(AttrPCIeLinkWidth, l.CurrentWidth)
		a.posInt(AttrPCIeMaxLinkGen, l.MaxGen)
		a.posInt(AttrPCIeMaxLinkWidth, l.MaxWidth)
	}
	a.str(AttrVBIOS, g.VBIOS)
	a.str(AttrHealth, f.health)
	return a
}

func modelName(f *gpuFacts) string {
	if f.known {
		return f.model.Name
	}
	return ""
}

func toolkit(s *snapshot.Snapshot, kind string) string {
	for _, t := range s.Drivers.Toolkits {
		if t.Kind == kind {
			return t.Version
		}
	}
	return ""
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s = strings.TrimSpace(s); s != "" {
			return s
		}
	}
	return ""
}

// pcieRoot is the GPU's PCIe root complex in the standard attribute's form,
// "pci<domain>:<bus>": the bus of the root port above it, or its own bus
// when the PCI tree shows it on a root bus. Empty when not known.
func (b *builder) pcieRoot(f *gpuFacts) string {
	addr := ""
	if n := len(f.g.Upstream); n > 0 {
		addr = f.g.Upstream[n-1]
	} else if d := b.s.DeviceByPCI(f.pci); d != nil && d.Parent == "" {
		addr = f.pci
	}
	c, err := snapshot.CanonicalPCI(addr)
	if addr == "" || err != nil {
		return ""
	}
	domain, rest, _ := strings.Cut(c, ":")
	bus, _, _ := strings.Cut(rest, ":")
	return "pci" + domain + ":" + bus
}

// pcieSwitch is the PCI address of the switch nearest the GPU (its
// upstream port), empty when the GPU is not behind one or the tree is not
// known.
func (b *builder) pcieSwitch(f *gpuFacts) string {
	for _, up := range f.g.Upstream {
		d := b.s.DeviceByPCI(up)
		if d == nil {
			continue
		}
		switch d.Kind {
		case snapshot.KindSwitchUp:
			c, _ := snapshot.CanonicalPCI(up)
			return c
		case snapshot.KindSwitchDown:
			if p, err := snapshot.CanonicalPCI(d.Parent); err == nil && d.Parent != "" {
				return p
			}
		}
	}
	return ""
}

func quantity(v uint64) resource.Quantity {
	if v > math.MaxInt64 {
		v = math.MaxInt64
	}
	return *resource.NewQuantity(int64(v), resource.BinarySI)
}

// devicesOf returns the devices of one GPU and its counter sets: the GPU
// itself; with MIG on, its MIG devices consuming its counters; in an AMD
// partition mode with more than one partition, the partitions instead.
func (b *builder) devicesOf(f *gpuFacts) ([]resourceapi.Device, []resourceapi.CounterSet) {
	g := f.g
	if p := g.Partition; p != nil && max(p.Count, len(g.KFDNodes)) > 1 {
		if b.shared[g.Index] {
			b.note("%s: split into %d partitions, which are published instead of fractions", f.name, max(p.Count, len(g.KFDNodes)))
		}
		return b.partitions(f), nil
	}
	if b.shared[g.Index] {
		if g.MIG != nil && g.MIG.Enabled {
			b.note("%s: MIG is on: published as MIG devices, not as fractions", f.name)
		} else {
			return []resourceapi.Device{b.fraction(f)}, nil
		}
	}
	gpu := resourceapi.Device{Name: f.name, Attributes: b.common(f), Taints: f.taints}
	attrs(gpu.Attributes).str(AttrUUID, g.UUID)
	attrs(gpu.Attributes).str(AttrType, TypeGPU)
	if p := g.Partition; p != nil {
		attrs(gpu.Attributes).str(AttrComputePartition, p.Compute)
		attrs(gpu.Attributes).str(AttrMemoryPartition, p.Memory)
	}
	gpu.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	if g.MemoryTotalBytes > 0 {
		gpu.Capacity[CapMemory] = resourceapi.DeviceCapacity{Value: quantity(g.MemoryTotalBytes)}
	} else if f.known && f.model.MemoryGB > 0 {
		gpu.Capacity[CapMemory] = resourceapi.DeviceCapacity{Value: quantity(uint64(f.model.MemoryGB * 1e9))}
	}
	if mp := f.multiprocessors(); mp > 0 {
		gpu.Capacity[CapMultiprocessors] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(mp), resource.DecimalSI)}
	}
	if len(gpu.Capacity) == 0 {
		gpu.Capacity = nil
	}
	b.res.Targets[gpu.Name] = Target{GPUIndex: g.Index, Partition: -1}
	if g.MIG == nil || !g.MIG.Enabled {
		return []resourceapi.Device{gpu}, nil
	}
	geo, ok := b.k.MIGProfiles(firstNonEmpty(modelName(f), g.Model))
	if !ok {
		b.note("%s: MIG is on but kiln has no MIG geometry for %s; only the whole GPU is published", f.name, firstNonEmpty(g.Model, "this model"))
		return []resourceapi.Device{gpu}, nil
	}
	return b.mig(f, gpu, geo)
}

// counterSetName names a GPU's counter set.
func counterSetName(f *gpuFacts) string { return f.name + "-counters" }

// mig publishes a MIG GPU's placements as partitionable devices. Every
// memory slice is a counter, and so are the compute slices: a placement
// consumes the memory slices it covers and its compute slices, the whole
// GPU consumes all of them, so the scheduler never hands out two devices
// that overlap. Where instances exist, those instances are the devices
// (they are what a container can be given); a GPU in MIG mode without
// instances offers every legal placement of every profile.
func (b *builder) mig(f *gpuFacts, gpu resourceapi.Device, geo kb.MIGModel) ([]resourceapi.Device, []resourceapi.CounterSet) {
	set := counterSetName(f)
	all := map[string]resourceapi.Counter{CounterComputeSlices: {Value: *resource.NewQuantity(int64(geo.ComputeSlices), resource.DecimalSI)}}
	for i := 0; i < geo.MemorySlices; i++ {
		all[CounterMemorySlice(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	hasME := slices.ContainsFunc(geo.Profiles, func(p kb.MIGProfile) bool { return p.MediaExtensions })
	if hasME {
		all[CounterMediaExtensions] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	counters := []resourceapi.CounterSet{{Name: set, Counters: all}}
	gpu.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set, Counters: copyCounters(all)}}
	out := []resourceapi.Device{gpu}

	type placement struct {
		p     kb.MIGProfile
		start int
		inst  *snapshot.MIGInstance
	}
	var places []placement
	if len(f.g.MIG.Instances) > 0 {
		insts, err := layInstances(geo, f.g.MIG.Instances)
		if err != nil {
			b.note("%s: MIG instances cannot be laid out (%v); only the whole GPU is published", f.name, err)
			return []resourceapi.Device{gpu}, counters
		}
		for _, x := range insts {
			places = append(places, placement{p: x.profile, start: x.start, inst: x.inst})
		}
	} else {
		for _, p := range geo.Profiles {
			for _, st := range p.Placements {
				places = append(places, placement{p: p, start: st})
			}
		}
	}
	memTotal := f.g.MemoryTotalBytes
	if memTotal == 0 && f.known {
		memTotal = uint64(f.model.MemoryGB * 1e9)
	}
	for _, pl := range places {
		d := resourceapi.Device{
			Name:       DNSLabel(fmt.Sprintf("%s-mig-%s-%d", f.name, pl.p.Name, pl.start)),
			Attributes: b.common(f),
			Taints:     f.taints,
		}
		attrs(d.Attributes).str(AttrType, TypeMIG)
		attrs(d.Attributes).str(AttrProfile, pl.p.Name)
		attrs(d.Attributes).str(AttrParentUUID, f.g.UUID)
		attrs(d.Attributes).str(AttrParentDevice, f.name)
		attrs(d.Attributes).int(AttrMIGStart, int64(pl.start))
		mt := &MIGTarget{Profile: pl.p.Name, Start: pl.start}
		if pl.inst != nil {
			attrs(d.Attributes).str(AttrUUID, pl.inst.UUID)
			mt.Exists, mt.GPUInstance, mt.ComputeInstance = true, pl.inst.GPUInstance, pl.inst.ComputeInstance
		}
		b.res.Targets[d.Name] = Target{GPUIndex: f.g.Index, MIG: mt, Partition: -1}
		use := map[string]resourceapi.Counter{CounterComputeSlices: {Value: *resource.NewQuantity(int64(pl.p.ComputeSlices), resource.DecimalSI)}}
		for i := pl.start; i < pl.start+pl.p.MemorySlices; i++ {
			use[CounterMemorySlice(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
		}
		if pl.p.MediaExtensions {
			use[CounterMediaExtensions] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
		}
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set, Counters: use}}
		capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
		mem := uint64(0)
		if pl.inst != nil && pl.inst.MemoryBytes > 0 {
			mem = pl.inst.MemoryBytes
		} else if memTotal > 0 && geo.MemorySlices > 0 {
			mem = memTotal / uint64(geo.MemorySlices) * uint64(pl.p.MemorySlices)
		}
		if mem > 0 {
			capacity[CapMemory] = resourceapi.DeviceCapacity{Value: quantity(mem)}
		}
		sms := 0
		if pl.inst != nil && pl.inst.SMs > 0 {
			sms = pl.inst.SMs
		} else if geo.SMsPerComputeSlice > 0 {
			sms = geo.SMsPerComputeSlice * pl.p.ComputeSlices
		}
		if sms > 0 {
			capacity[CapMultiprocessors] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(sms), resource.DecimalSI)}
		}
		if len(capacity) > 0 {
			d.Capacity = capacity
		}
		out = append(out, d)
	}
	return out, counters
}

func copyCounters(in map[string]resourceapi.Counter) map[string]resourceapi.Counter {
	out := make(map[string]resourceapi.Counter, len(in))
	for k, v := range in {
		out[k] = resourceapi.Counter{Value: v.Value.DeepCopy()}
	}
	return out
}

type laidInstance struct {
	profile kb.MIGProfile
	start   int
	inst    *snapshot.MIGInstance
}

// layInstances gives each GPU instance (the snapshot lists one entry per
// compute instance) its profile and start: the start the snapshot gives
// when it is legal, else the first legal free one, largest profiles first,
// the way the driver places them.
func layInstances(geo kb.MIGModel, in []snapshot.MIGInstance) ([]laidInstance, error) {
	seen := map[int]bool{}
	var out []laidInstance
	for i := range in {
		x := &in[i]
		if seen[x.GPUInstance] {
			continue
		}
		seen[x.GPUInstance] = true
		p, err := geo.Resolve(kb.MIGInstance{Profile: x.Profile, SMs: x.SMs, MemoryMiB: float64(x.MemoryBytes) / (1 << 20)})
		if err != nil {
			return nil, fmt.Errorf("GPU instance %d: %w", x.GPUInstance, err)
		}
		st := -1
		if x.Start != nil && slices.Contains(p.Placements, *x.Start) {
			st = *x.Start
		}
		out = append(out, laidInstance{profile: p, start: st, inst: x})
	}
	var used uint64
	span := func(st, n int) uint64 { return ((uint64(1) << n) - 1) << st }
	for _, x := range out {
		if x.start < 0 {
			continue
		}
		s := span(x.start, x.profile.MemorySlices)
		if used&s != 0 {
			return nil, fmt.Errorf("instances overlap at memory slice %d", x.start)
		}
		used |= s
	}
	order := make([]int, 0, len(out))
	for i, x := range out {
		if x.start < 0 {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, c int) int { return out[c].profile.MemorySlices - out[a].profile.MemorySlices })
	for _, i := range order {
		p := out[i].profile
		for _, st := range p.Placements {
			if st < 0 || st+p.MemorySlices > geo.MemorySlices || st+p.MemorySlices > 63 {
				continue
			}
			if s := span(st, p.MemorySlices); used&s == 0 {
				out[i].start = st
				used |= s
				break
			}
		}
		if out[i].start < 0 {
			return nil, fmt.Errorf("no free placement for a %s instance", p.Name)
		}
	}
	slices.SortStableFunc(out, func(a, c laidInstance) int { return a.start - c.start })
	return out, nil
}

// partitions publishes an AMD GPU in a compute partition mode (DPX, QPX,
// CPX) as one device per partition, each with its share of the memory.
func (b *builder) partitions(f *gpuFacts) []resourceapi.Device {
	g := f.g
	n := max(g.Partition.Count, len(g.KFDNodes))
	mem := g.MemoryTotalBytes
	if mem == 0 && f.known {
		mem = uint64(f.model.MemoryGB * 1e9)
	}
	// Each partition addresses its NUMA memory partition: all of the
	// memory in NPS1, a quarter in NPS4; split evenly when the memory mode
	// is not known.
	div := uint64(n)
	if nps, err := strconv.Atoi(strings.TrimPrefix(strings.ToUpper(g.Partition.Memory), "NPS")); err == nil && nps > 0 {
		div = uint64(nps)
	}
	var out []resourceapi.Device
	for i := 0; i < n; i++ {
		d := resourceapi.Device{
			Name:       DNSLabel(fmt.Sprintf("%s-part-%d", f.name, i)),
			Attributes: b.common(f),
			Taints:     f.taints,
		}
		attrs(d.Attributes).str(AttrType, TypePartition)
		attrs(d.Attributes).str(AttrParentDevice, f.name)
		attrs(d.Attributes).str(AttrParentUUID, g.UUID)
		attrs(d.Attributes).int(AttrPartitionIndex, int64(i))
		b.res.Targets[d.Name] = Target{GPUIndex: g.Index, Partition: i}
		attrs(d.Attributes).str(AttrComputePartition, g.Partition.Compute)
		attrs(d.Attributes).str(AttrMemoryPartition, g.Partition.Memory)
		if mem > 0 {
			d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: {Value: quantity(mem / div)}}
		}
		// Compute partitions split the CUs evenly (a CPX partition of an
		// MI300X is one XCD: 38 of 304); an uneven split is not guessed.
		if mp := f.multiprocessors(); mp > 0 && mp%n == 0 {
			if d.Capacity == nil {
				d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
			}
			d.Capacity[CapMultiprocessors] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(mp/n), resource.DecimalSI)}
		}
		out = append(out, d)
	}
	return out
}

// minFraction is the least memory one claim on a shared GPU takes.
const minFraction = 256 << 20

// fraction is a whole GPU that several claims share, each consuming part
// of its memory. A claim that asks no amount takes all of it: it holds the
// GPU alone, since kiln cannot know what it will use. Only memory is a
// capacity: the API lets a capacity without a request policy be taken
// whole by every claim that does not ask, which would end the sharing.
func (b *builder) fraction(f *gpuFacts) resourceapi.Device {
	g := f.g
	d := resourceapi.Device{Name: f.name, Attributes: b.common(f), Taints: f.taints, AllowMultipleAllocations: ptrTo(true)}
	attrs(d.Attributes).str(AttrUUID, g.UUID)
	attrs(d.Attributes).str(AttrType, TypeFraction)
	mem := g.MemoryTotalBytes
	if mem == 0 && f.known {
		mem = uint64(f.model.MemoryGB * 1e9)
	}
	if mem > 0 {
		total := quantity(mem)
		least := quantity(min(mem, minFraction))
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: {
			Value:         total,
			RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: &total, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &least}},
		}}
	} else {
		b.note("%s: its memory is not known, so claims cannot ask for a part of it; each takes it whole", f.name)
	}
	b.res.Targets[d.Name] = Target{GPUIndex: g.Index, Partition: -1, Shared: true}
	return d
}

func ptrTo[T any](v T) *T { return &v }
