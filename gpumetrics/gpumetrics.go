// Package gpumetrics turns what an agent read of its node (a Snapshot
// sampled on the agent's own interval, and the doctor's findings) into
// metric families named by Prometheus conventions: base units, `_total`
// counters, `_info` series. On NVIDIA nodes it can also give the names,
// units and labels of dcgm-exporter for the series that its widely used
// Grafana dashboard and common alerts query, computed from the same
// sample.
//
// The package is a pure function of its input: it holds no state and
// speaks no protocol. gpumetrics/prom turns the families into a
// Prometheus collector for the agent's /metrics.
//
// Device series carry the GPU's index and UUID only; a lease's project
// and user are on kiln_lease_info, joined on the lease label of the
// per-lease series (kiln_lease_gpu_*), so values are never copied to every
// lease that shares a GPU. What describes a GPU (model, PCI address,
// VBIOS) lives on kiln_gpu_info, so that a series does not change identity
// when a description does. A reading the GPU
// cannot give is not left missing without a word: kiln_gpu_metric_supported
// is 0 for each reading a GPU's sample did not have.
package gpumetrics

import (
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// Kind is a family's type.
type Kind int

// Family kinds.
const (
	Gauge Kind = iota
	Counter
)

func (k Kind) String() string {
	if k == Counter {
		return "counter"
	}
	return "gauge"
}

// Family is one metric name with its series.
type Family struct {
	Name   string
	Help   string
	Kind   Kind
	Labels []string
	Series []Series
}

// Series is one set of label values (in the family's label order) and its
// value.
type Series struct {
	Values []string
	Value  float64
}

// Input is one sample of a node.
type Input struct {
	Snapshot *snapshot.Snapshot
	// Findings are the doctor's findings on the Snapshot (the last full
	// discovery's).
	Findings []Finding
	// Leases are the leases whose jobs run on the node, and Cgroups the
	// cgroup of each GPU process (PID to path): they divide the GPUs'
	// processes and memory between leases (Attribute).
	Leases  []Lease
	Cgroups map[int]string
	// Hostname labels dcgm-exporter's series (its Hostname label); the
	// Snapshot's host name when empty.
	Hostname string
}

// Finding is what the series say of a doctor's finding.
type Finding struct {
	// Check is the finding's id ("pcie-downtrained"), Severity its
	// severity's text (critical, warning, info).
	Check, Severity string
	// Devices are the canonical PCI addresses it names.
	Devices []string
}

// severities are the doctor's severities, worst first.
var severities = []string{"critical", "warning", "info"}

// Options choose the families.
type Options struct {
	// DCGM adds dcgm-exporter's names for NVIDIA GPUs.
	DCGM bool
}

// Readings are the values of kiln_gpu_metric_supported's metric label, in
// order: each names a group of series that a GPU may be unable to give.
var Readings = []string{
	"utilization", "memory", "power", "temperature", "clocks", "fans",
	"throttle", "pcie_link", "pcie_replays", "nvlink", "nvlink_errors", "nvlink_traffic", "ecc", "row_remapping",
	"retired_pages", "processes",
	// Profiling readings (NVML's GPM, Hopper and newer, measured between
	// two of the agent's samples).
	"sm_activity", "tensor_activity", "dram_activity",
	"energy",
}

// Families returns the node's families, sorted by name; families without
// series are left out, except kiln_gpu_metric_supported, which says why.
func Families(in Input, opt Options) []Family {
	b := &builder{fams: map[string]*Family{}}
	s := in.Snapshot
	if s == nil {
		s = &snapshot.Snapshot{}
	}
	b.node(s, in.Findings)
	for i := range s.GPUs {
		b.gpu(s, &s.GPUs[i], in.Findings)
	}
	b.leases(s, in.Leases, in.Cgroups)
	if opt.DCGM {
		host := in.Hostname
		if host == "" {
			host = s.Host.Hostname
		}
		for i := range s.GPUs {
			if s.GPUs[i].Vendor == snapshot.VendorNVIDIA {
				b.dcgm(s, &s.GPUs[i], host)
			}
		}
	}
	out := make([]Family, 0, len(b.fams))
	for _, f := range b.fams {
		if len(f.Series) > 0 || f.Name == "kiln_gpu_metric_supported" {
			out = append(out, *f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

type builder struct {
	fams map[string]*Family
}

// family returns the family name, made on first use.
func (b *builder) family(name string, kind Kind, help string, labels ...string) *Family {
	f := b.fams[name]
	if f == nil {
		f = &Family{Name: name, Help: help, Kind: kind, Labels: labels}
		b.fams[name] = f
	}
	return f
}

func (f *Family) add(v float64, values ...string) {
	f.Series = append(f.Series, Series{Values: values, Value: v})
}

func boolValue(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// node adds the node-wide families.
func (b *builder) node(s *snapshot.Snapshot, finds []Finding) {
	info := b.family("kiln_node_info", Gauge, "The node as the agent sees it: host name, kernel, NVIDIA and AMD drivers and CUDA driver version (1).",
		"hostname", "kernel", "nvidia_driver", "cuda_driver", "amdgpu", "rocm")
	info.add(1, s.Host.Hostname, s.Host.Kernel, s.Drivers.NVIDIAKernel, s.Drivers.CUDADriver, s.Drivers.AMDGPU, s.Drivers.ROCm)
	gpus := b.family("kiln_node_gpus", Gauge, "GPUs the agent found on the node, by vendor.", "vendor")
	count := map[string]int{}
	for _, g := range s.GPUs {
		count[g.Vendor]++
	}
	for _, v := range sortedKeys(count) {
		gpus.add(float64(count[v]), v)
	}
	// Every severity has a series, zero included, so that an alert on
	// critical findings sees them go back to zero.
	f := b.family("kiln_doctor_findings", Gauge, "The doctor's findings on the node's last sample, by severity and check.", "severity", "check")
	per := map[[2]string]int{}
	for _, fd := range finds {
		per[[2]string{fd.Severity, fd.Check}]++
	}
	for _, sev := range severities {
		n := 0
		for k, v := range per {
			if k[0] == sev {
				n += v
			}
		}
		if n == 0 {
			f.add(0, sev, "")
		}
	}
	keys := make([][2]string, 0, len(per))
	for k := range per {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		f.add(float64(per[k]), k[0], k[1])
	}
}

// gpuLabels are every per-GPU family's first labels.
var gpuLabels = []string{"gpu", "uuid"}

func withGPU(extra ...string) []string { return append(append([]string(nil), gpuLabels...), extra...) }

func (b *builder) gpu(s *snapshot.Snapshot, g *snapshot.GPU, finds []Finding) {
	idx, uuid := strconv.Itoa(g.Index), g.UUID
	lv := func(extra ...string) []string { return append([]string{idx, uuid}, extra...) }
	has := map[string]bool{}

	b.family("kiln_gpu_info", Gauge, "A GPU's description (1): vendor, model, PCI address, architecture, VBIOS.",
		withGPU("vendor", "model", "pci_address", "architecture", "vbios")...).
		add(1, lv(g.Vendor, g.Model, g.PCIAddress, g.Architecture, g.VBIOS)...)

	if g.UtilizationGPU != nil {
		has["utilization"] = true
		b.family("kiln_gpu_utilization_ratio", Gauge, "Share of the last sample period in which a kernel ran on the GPU (0 to 1).", gpuLabels...).
			add(*g.UtilizationGPU/100, lv()...)
	}
	if g.MemoryTotalBytes > 0 {
		has["memory"] = true
		b.family("kiln_gpu_memory_total_bytes", Gauge, "The GPU's memory.", gpuLabels...).add(float64(g.MemoryTotalBytes), lv()...)
		b.family("kiln_gpu_memory_used_bytes", Gauge, "The GPU's memory in use (by every process and the driver).", gpuLabels...).add(float64(g.MemoryUsedBytes), lv()...)
	}
	if p := g.Power; p != nil && p.DrawW != nil {
		has["power"] = true
		b.family("kiln_gpu_power_watts", Gauge, "The GPU's power draw.", gpuLabels...).add(*p.DrawW, lv()...)
		limit := p.EnforcedW
		if limit == nil {
			limit = p.LimitW
		}
		if limit != nil {
			b.family("kiln_gpu_power_limit_watts", Gauge, "The power limit the GPU holds to now.", gpuLabels...).add(*limit, lv()...)
		}
		if p.MaxLimitW != nil {
			b.family("kiln_gpu_power_max_limit_watts", Gauge, "The highest power limit the GPU's board allows.", gpuLabels...).add(*p.MaxLimitW, lv()...)
		}
	}
	if p := g.Power; p != nil && p.EnergyJ != nil {
		has["energy"] = true
		b.family("kiln_gpu_energy_joules_total", Counter, "Energy the GPU used since the driver loaded.", gpuLabels...).add(*p.EnergyJ, lv()...)
	}
	if a := g.Activity; a != nil {
		for _, x := range []struct {
			v          *float64
			name, help string
			reading    string
		}{
			{a.Graphics, "kiln_gpu_graphics_engine_active_ratio", "Share of the last sample period the graphics (compute) engine was busy, by the GPU's profiling counters.", ""},
			{a.SM, "kiln_gpu_sm_active_ratio", "Share of the SMs' time in the last sample period with work on them, by the GPU's profiling counters.", "sm_activity"},
			{a.Tensor, "kiln_gpu_tensor_active_ratio", "Share of the last sample period the tensor cores were busy, by the GPU's profiling counters.", "tensor_activity"},
			{a.DRAM, "kiln_gpu_dram_active_ratio", "Share of the last sample period the memory interface was busy, by the GPU's profiling counters.", "dram_activity"},
		} {
			if x.v == nil {
				continue
			}
			if x.reading != "" {
				has[x.reading] = true
			}
			b.family(x.name, Gauge, x.help, gpuLabels...).add(*x.v, lv()...)
		}
	}
	b.temperatures(g, lv, has)
	b.clocks(g, lv, has)
	if len(g.Fans) > 0 {
		f := b.family("kiln_gpu_fan_speed_ratio", Gauge, "A fan's speed as a share of its maximum (0 to 1).", withGPU("fan")...)
		for i, fan := range g.Fans {
			if fan.Percent != nil {
				has["fans"] = true
				f.add(*fan.Percent/100, lv(strconv.Itoa(i))...)
			}
		}
	}
	if len(g.Throttle) > 0 {
		has["throttle"] = true
		act := b.family("kiln_gpu_throttle_active", Gauge, "1 while a reason holds the GPU's clocks down (power cap, thermal slowdown, hardware slowdown, ...).", withGPU("reason")...)
		tot := b.family("kiln_gpu_throttle_seconds_total", Counter, "Time the GPU's clocks were held down, by reason, since the driver loaded (where the driver counts it).", withGPU("reason")...)
		for _, t := range g.Throttle {
			act.add(boolValue(t.Active), lv(t.Name)...)
			if t.Microseconds != nil {
				tot.add(float64(*t.Microseconds)/1e6, lv(t.Name)...)
			}
		}
	}
	if l := g.PCIe; l != nil {
		if l.CurrentGen > 0 || l.CurrentWidth > 0 {
			has["pcie_link"] = true
			gen := b.family("kiln_gpu_pcie_link_generation", Gauge, "The GPU's PCIe link generation: now (state=current; it drops at idle on many GPUs) and at most (state=max).", withGPU("state")...)
			width := b.family("kiln_gpu_pcie_link_width_lanes", Gauge, "The GPU's PCIe link width in lanes: now (state=current) and at most (state=max).", withGPU("state")...)
			gen.add(float64(l.CurrentGen), lv("current")...)
			width.add(float64(l.CurrentWidth), lv("current")...)
			if l.MaxGen > 0 {
				gen.add(float64(l.MaxGen), lv("max")...)
			}
			if l.MaxWidth > 0 {
				width.add(float64(l.MaxWidth), lv("max")...)
			}
		}
		if l.Replays != nil {
			has["pcie_replays"] = true
			b.family("kiln_gpu_pcie_replays_total", Counter, "PCIe replays (link-level retransmissions) since the GPU's reset.", gpuLabels...).add(float64(*l.Replays), lv()...)
		}
	}
	if len(g.NVLinks) > 0 {
		has["nvlink"] = true
		// Links are counted by state, and their errors and traffic summed,
		// as dcgm-exporter's NVLINK_*_TOTAL are: per link they would be
		// seven series for each of a Hopper's 18 links. The doctor's
		// findings name a link that is down.
		states := map[string]int{"active": 0, "inactive": 0}
		var sum nvlinkSums
		for _, nl := range g.NVLinks {
			states[nl.State]++
			sum.add(nl)
		}
		links := b.family("kiln_gpu_nvlinks", Gauge, "The GPU's NVLinks by state: active, inactive, disabled.", withGPU("state")...)
		for _, st := range sortedKeys(states) {
			links.add(float64(states[st]), lv(st)...)
		}
		if sum.errors {
			has["nvlink_errors"] = true
			errs := b.family("kiln_gpu_nvlink_errors_total", Counter, "The GPU's NVLink data-link errors since the driver loaded, summed over its links, by kind: replay, recovery, crc_flit, crc_data.", withGPU("kind")...)
			errs.add(float64(sum.replay), lv("replay")...)
			errs.add(float64(sum.recovery), lv("recovery")...)
			errs.add(float64(sum.crcFlit), lv("crc_flit")...)
			errs.add(float64(sum.crcData), lv("crc_data")...)
		}
		if sum.traffic {
			has["nvlink_traffic"] = true
			b.family("kiln_gpu_nvlink_transmit_bytes_total", Counter, "Data the GPU sent over its NVLinks since the driver loaded.", gpuLabels...).add(float64(sum.tx), lv()...)
			b.family("kiln_gpu_nvlink_receive_bytes_total", Counter, "Data the GPU received over its NVLinks since the driver loaded.", gpuLabels...).add(float64(sum.rx), lv()...)
		}
	}
	if e := g.ECC; e != nil {
		if e.Enabled != nil {
			has["ecc"] = true
			b.family("kiln_gpu_ecc_enabled", Gauge, "1 when the GPU's memory runs with ECC.", gpuLabels...).add(boolValue(*e.Enabled), lv()...)
		}
		f := b.family("kiln_gpu_ecc_errors_total", Counter, "ECC errors of the GPU's memory, by kind (correctable, uncorrectable) and scope (volatile: since the driver loaded; aggregate: over the GPU's life).", withGPU("kind", "scope")...)
		for _, c := range []struct {
			v           *uint64
			kind, scope string
		}{{e.VolatileCorrectable, "correctable", "volatile"}, {e.VolatileUncorrectable, "uncorrectable", "volatile"},
			{e.AggregateCorrectable, "correctable", "aggregate"}, {e.AggregateUncorrectable, "uncorrectable", "aggregate"}} {
			if c.v != nil {
				has["ecc"] = true
				f.add(float64(*c.v), lv(c.kind, c.scope)...)
			}
		}
	}
	if r := g.RemappedRows; r != nil {
		f := b.family("kiln_gpu_remapped_rows", Gauge, "Memory rows the GPU remapped to spares, by the error that caused it.", withGPU("cause")...)
		if r.Correctable != nil {
			has["row_remapping"] = true
			f.add(float64(*r.Correctable), lv("correctable")...)
		}
		if r.Uncorrectable != nil {
			has["row_remapping"] = true
			f.add(float64(*r.Uncorrectable), lv("uncorrectable")...)
		}
		if r.Pending != nil {
			has["row_remapping"] = true
			b.family("kiln_gpu_row_remap_pending", Gauge, "1 when a row remapping waits for the GPU's reset.", gpuLabels...).add(boolValue(*r.Pending), lv()...)
		}
		if r.Failure != nil {
			has["row_remapping"] = true
			b.family("kiln_gpu_row_remap_failed", Gauge, "1 when a row could not be remapped (the GPU needs service).", gpuLabels...).add(boolValue(*r.Failure), lv()...)
		}
	}
	if r := g.RetiredPages; r != nil {
		f := b.family("kiln_gpu_retired_pages", Gauge, "Memory pages the GPU retired, by cause (single_bit, double_bit errors).", withGPU("cause")...)
		if r.SingleBit != nil {
			has["retired_pages"] = true
			f.add(float64(*r.SingleBit), lv("single_bit")...)
		}
		if r.DoubleBit != nil {
			has["retired_pages"] = true
			f.add(float64(*r.DoubleBit), lv("double_bit")...)
		}
	}
	if g.ProcessesRead || g.Processes > 0 {
		// Zero is a reading only where the processes were listed.
		has["processes"] = true
		b.family("kiln_gpu_processes", Gauge, "Processes using the GPU.", gpuLabels...).add(float64(g.Processes), lv()...)
	}
	b.xids(s, g, lv)
	if m := g.MIG; m != nil {
		b.family("kiln_gpu_mig_enabled", Gauge, "1 when the GPU runs in MIG mode.", gpuLabels...).add(boolValue(m.Enabled), lv()...)
		inst := b.family("kiln_gpu_mig_instance_info", Gauge, "A MIG instance of the GPU (1): GPU and compute instance, profile, its UUID.", withGPU("gi", "ci", "profile", "instance_uuid")...)
		mem := b.family("kiln_gpu_mig_instance_memory_bytes", Gauge, "A MIG instance's memory.", withGPU("gi", "ci")...)
		for _, mi := range m.Instances {
			gi, ci := strconv.Itoa(mi.GPUInstance), strconv.Itoa(mi.ComputeInstance)
			inst.add(1, lv(gi, ci, mi.Profile, mi.UUID)...)
			if mi.MemoryBytes > 0 {
				mem.add(float64(mi.MemoryBytes), lv(gi, ci)...)
			}
		}
	}
	if p := g.Partition; p != nil && (p.Compute != "" || p.Memory != "") {
		b.family("kiln_gpu_partition_info", Gauge, "An AMD GPU's partition modes (1): compute (SPX, DPX, QPX, CPX) and memory (NPS1, NPS4).", withGPU("compute", "memory")...).
			add(1, lv(p.Compute, p.Memory)...)
	}
	finding := b.family("kiln_gpu_findings", Gauge, "The doctor's findings that name the GPU, by severity.", withGPU("severity")...)
	per := map[string]int{}
	for _, fd := range finds {
		for _, d := range fd.Devices {
			if d != "" && d == g.PCIAddress {
				per[fd.Severity]++
				break
			}
		}
	}
	for _, sev := range severities {
		finding.add(float64(per[sev]), lv(sev)...)
	}
	// Only the readings a GPU did not give have a series (0): a reading it
	// gives has series of its own, and a fleet's GPUs give most.
	sup := b.family("kiln_gpu_metric_supported", Gauge, "0 for each reading the GPU did not give in the last sample: it cannot (MIG mode hides utilization on A100 and H100, a consumer GPU has no ECC, GPM needs Hopper) or its tools did not say. A reading it gives has no series here.", withGPU("metric")...)
	for _, r := range Readings {
		if !has[r] {
			sup.add(0, lv(r)...)
		}
	}
}

func (b *builder) temperatures(g *snapshot.GPU, lv func(...string) []string, has map[string]bool) {
	t := g.Temperature
	if t == nil {
		return
	}
	now := b.family("kiln_gpu_temperature_celsius", Gauge, "A GPU temperature sensor: gpu (NVIDIA's core), memory, edge, junction (AMD's hotspot).", withGPU("sensor")...)
	for _, c := range []struct {
		v    *float64
		name string
	}{{t.GPUC, "gpu"}, {t.MemoryC, "memory"}, {t.EdgeC, "edge"}, {t.JunctionC, "junction"}} {
		if c.v != nil {
			has["temperature"] = true
			now.add(*c.v, lv(c.name)...)
		}
	}
	lim := b.family("kiln_gpu_temperature_limit_celsius", Gauge, "A GPU's temperature thresholds: slowdown, shutdown, max_operating (target), memory_max, critical.", withGPU("threshold")...)
	for _, c := range []struct {
		v    *float64
		name string
	}{{t.SlowdownC, "slowdown"}, {t.ShutdownC, "shutdown"}, {t.MaxOpC, "max_operating"}, {t.MemMaxC, "memory_max"}, {t.CriticalC, "critical"}} {
		if c.v != nil {
			lim.add(*c.v, lv(c.name)...)
		}
	}
}

func (b *builder) clocks(g *snapshot.GPU, lv func(...string) []string, has map[string]bool) {
	c := g.Clocks
	if c == nil {
		return
	}
	now := b.family("kiln_gpu_clock_hertz", Gauge, "A GPU clock now: graphics, sm, memory.", withGPU("clock")...)
	max := b.family("kiln_gpu_clock_max_hertz", Gauge, "A GPU clock's highest rate: graphics, sm, memory.", withGPU("clock")...)
	for _, k := range []struct {
		v, m *float64
		name string
	}{{c.GraphicsMHz, c.MaxGraphicsMHz, "graphics"}, {c.SMMHz, c.MaxSMMHz, "sm"}, {c.MemoryMHz, c.MaxMemoryMHz, "memory"}} {
		if k.v != nil {
			has["clocks"] = true
			now.add(*k.v*1e6, lv(k.name)...)
		}
		if k.m != nil {
			max.add(*k.m*1e6, lv(k.name)...)
		}
	}
}

// xids counts the GPU's Xid events in the sample's kernel log, by code.
func (b *builder) xids(s *snapshot.Snapshot, g *snapshot.GPU, lv func(...string) []string) {
	if g.PCIAddress == "" {
		return
	}
	per := map[int]int{}
	for _, e := range s.Events {
		if e.Kind == snapshot.EventXid && e.Device == g.PCIAddress {
			per[e.Code] += 1 + e.Repeats
		}
	}
	if len(per) == 0 {
		return
	}
	f := b.family("kiln_gpu_xid_errors_total", Counter, "Xid errors the kernel logged for the GPU, by code, in the log the agent read (since boot where the log reaches back that far).", withGPU("xid")...)
	for _, code := range sortedKeys(per) {
		f.add(float64(per[code]), lv(strconv.Itoa(code))...)
	}
}

func sortedKeys[K int | string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// deviceName is dcgm-exporter's device label: nvidia0, nvidia1, ...
func deviceName(g *snapshot.GPU) string { return "nvidia" + strconv.Itoa(g.Index) }

// pciBusID is dcgm-exporter's form of a PCI address: 00000000:1B:00.0.
func pciBusID(addr string) string {
	dom, rest, ok := strings.Cut(addr, ":")
	if !ok {
		return strings.ToUpper(addr)
	}
	return strings.ToUpper(strings.Repeat("0", max(0, 8-len(dom))) + dom + ":" + rest)
}

// nvlinkSums add up a GPU's NVLink counters over its links.
type nvlinkSums struct {
	replay, recovery, crcFlit, crcData, tx, rx uint64
	errors, traffic                            bool
}

func (n *nvlinkSums) add(l snapshot.NVLink) {
	if e := l.Errors; e != nil {
		n.errors = true
		n.replay += e.Replay
		n.recovery += e.Recovery
		n.crcFlit += e.CRCFlit
		n.crcData += e.CRCData
	}
	if l.TxBytes != nil && l.RxBytes != nil {
		n.traffic = true
		n.tx += *l.TxBytes
		n.rx += *l.RxBytes
	}
}

// dcgmLabels are dcgm-exporter's labels on every GPU series.
var dcgmLabels = []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}

// dcgm adds dcgm-exporter's names for an NVIDIA GPU, in its units (MHz,
// MiB, percent, millijoules), from the same sample as kiln's own series.
func (b *builder) dcgm(s *snapshot.Snapshot, g *snapshot.GPU, host string) {
	driver := s.Drivers.NVIDIAKernel
	if driver == "" {
		driver = s.Drivers.NVIDIAUser
	}
	lv := []string{strconv.Itoa(g.Index), g.UUID, pciBusID(g.PCIAddress), deviceName(g), g.Model, host, driver}
	gauge := func(name, help string, v float64) {
		b.family(name, Gauge, help+" (dcgm-exporter's name, from kiln's sample)", dcgmLabels...).add(v, lv...)
	}
	counter := func(name, help string, v float64) {
		b.family(name, Counter, help+" (dcgm-exporter's name, from kiln's sample)", dcgmLabels...).add(v, lv...)
	}
	if c := g.Clocks; c != nil {
		if c.SMMHz != nil {
			gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", *c.SMMHz)
		}
		if c.MemoryMHz != nil {
			gauge("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", *c.MemoryMHz)
		}
	}
	if t := g.Temperature; t != nil {
		if t.MemoryC != nil {
			gauge("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", *t.MemoryC)
		}
		if t.GPUC != nil {
			gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", *t.GPUC)
		}
	}
	if p := g.Power; p != nil && p.DrawW != nil {
		gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", *p.DrawW)
	}
	if l := g.PCIe; l != nil && l.Replays != nil {
		counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", float64(*l.Replays))
	}
	if g.UtilizationGPU != nil {
		gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", *g.UtilizationGPU)
	}
	const grHelp = "Ratio of time the graphics engine is active; NVML's utilization where the GPU gives no profiling sample."
	a := g.Activity
	switch {
	case a != nil && a.Graphics != nil:
		gauge("DCGM_FI_PROF_GR_ENGINE_ACTIVE", grHelp, *a.Graphics)
	case g.UtilizationGPU != nil:
		// Without a GPM sample, the graphics engine's activity is NVML's
		// utilization: the share of time a kernel ran.
		gauge("DCGM_FI_PROF_GR_ENGINE_ACTIVE", grHelp, *g.UtilizationGPU/100)
	}
	if a != nil {
		if a.SM != nil {
			gauge("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", *a.SM)
		}
		if a.Tensor != nil {
			gauge("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", *a.Tensor)
		}
		if a.DRAM != nil {
			gauge("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.", *a.DRAM)
		}
	}
	if p := g.Power; p != nil && p.EnergyJ != nil {
		counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", *p.EnergyJ*1000)
	}
	if g.MemoryTotalBytes > 0 {
		const mib = 1 << 20
		used := float64(g.MemoryUsedBytes) / mib
		gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", used)
		gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", max(0, float64(g.MemoryTotalBytes)/mib-used))
	}
	xid := 0
	for _, e := range s.Events {
		if e.Kind == snapshot.EventXid && e.Device != "" && e.Device == g.PCIAddress {
			xid = e.Code // the last one logged
		}
	}
	gauge("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", float64(xid))
	if r := g.RemappedRows; r != nil {
		if r.Uncorrectable != nil {
			counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", float64(*r.Uncorrectable))
		}
		if r.Correctable != nil {
			counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", float64(*r.Correctable))
		}
		if r.Failure != nil {
			gauge("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", boolValue(*r.Failure))
		}
	}
	var nv nvlinkSums
	for _, l := range g.NVLinks {
		nv.add(l)
	}
	if nv.errors {
		counter("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "Total number of NVLink flow-control CRC errors.", float64(nv.crcFlit))
		counter("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "Total number of NVLink data CRC errors.", float64(nv.crcData))
		counter("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.", float64(nv.replay))
		counter("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors.", float64(nv.recovery))
	}
	if e := g.ECC; e != nil {
		if e.VolatileCorrectable != nil {
			counter("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", float64(*e.VolatileCorrectable))
		}
		if e.VolatileUncorrectable != nil {
			counter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", float64(*e.VolatileUncorrectable))
		}
	}
}
