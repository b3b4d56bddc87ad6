package doctor

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/units"
)

func init() {
	register(Check{
		Name: "models",
		IDs:  []string{"unknown-gpu-model", "mixed-models", "memory-mismatch"},
		Doc:  "GPU models kiln does not know, several models in one node, and identical models with different memory.",
		Run:  checkModels,
	})
	register(Check{
		Name: "completeness",
		IDs:  []string{"capture-incomplete", "gpu-missing"},
		Doc:  "A capture holds fewer GPUs than it claims; the driver sees fewer GPUs than PCI shows.",
		Run:  checkCompleteness,
	})
	register(Check{
		Name: "placement",
		IDs:  []string{"numa-unknown", "cpu-affinity-restricted"},
		Doc:  "GPUs whose NUMA node the platform does not report; captures taken inside a restricted cpuset.",
		Run:  checkPlacement,
	})
}

func checkModels(in *Input) []Finding {
	var out []Finding
	var unknown []*snapshot.GPU
	models := map[string][]*snapshot.GPU{}
	var order []string
	for _, g := range gpus(in.Snapshot) {
		known := false
		if g.DeviceID != "" {
			_, known = in.KB.GPUByDeviceID(g.Vendor, g.DeviceID)
		}
		if !known && g.Model != "" {
			_, known = in.KB.GPUByName(g.Model)
		}
		if !known && (g.DeviceID != "" || g.Model != "") {
			unknown = append(unknown, g)
		}
		k := modelKey(g)
		if k == g.Vendor+":" {
			continue
		}
		if _, ok := models[k]; !ok {
			order = append(order, k)
		}
		models[k] = append(models[k], g)
	}
	if len(unknown) > 0 {
		var ev []string
		for _, g := range unknown {
			ev = append(ev, fmt.Sprintf("%s: %q vendor %s device id %q", gpuName(g), g.Model, g.Vendor, g.DeviceID))
		}
		out = append(out, Finding{
			ID:       "unknown-gpu-model",
			Severity: Info,
			Title:    fmt.Sprintf("%d %s not in kiln's GPU catalog", len(unknown), plural(len(unknown), "GPU is", "GPUs are")),
			Devices:  addrs(unknown),
			Evidence: ev,
			Impact:   "checks that need the model's ratings (NVLink count, ECC support, MIG profiles, memory) are skipped for these GPUs",
			Remedy:   "Add the model to kb/data/gpus.yaml with its source, or report it to the kiln project with `kiln inventory -o json`.",
		})
	}
	if len(order) > 1 {
		var ev []string
		for _, k := range order {
			gs := models[k]
			ev = append(ev, fmt.Sprintf("%d x %s", len(gs), modelLabel(gs[0])))
		}
		out = append(out, Finding{
			ID:       "mixed-models",
			Severity: Info,
			Title:    fmt.Sprintf("node mixes %d GPU models", len(order)),
			Evidence: ev,
			Impact:   "multi-GPU jobs run at the pace of the slowest GPU; images must carry kernels for every architecture present",
			Remedy:   "Request GPUs by model for multi-GPU jobs (kiln run --gpu-model) or group identical GPUs per node.",
		})
	}
	sort.Strings(order)
	for _, k := range order {
		gs := models[k]
		mem := map[uint64][]*snapshot.GPU{}
		for _, g := range gs {
			if g.MemoryTotalBytes > 0 {
				mem[g.MemoryTotalBytes] = append(mem[g.MemoryTotalBytes], g)
			}
		}
		if len(mem) < 2 {
			continue
		}
		var sizes []uint64
		for m := range mem {
			sizes = append(sizes, m)
		}
		sort.Slice(sizes, func(i, j int) bool { return sizes[i] > sizes[j] })
		// Small differences are reserved memory that varies with ECC and driver.
		if float64(sizes[0]-sizes[len(sizes)-1]) < 0.02*float64(sizes[0]) {
			continue
		}
		var ev []string
		for _, m := range sizes {
			var names []string
			for _, g := range mem[m] {
				names = append(names, gpuName(g))
			}
			ev = append(ev, units.BytesRounded(m, 1)+" on "+strings.Join(names, ", "))
		}
		out = append(out, Finding{
			ID:       "memory-mismatch",
			Severity: Warning,
			Title:    fmt.Sprintf("%s GPUs report different memory sizes", modelLabel(gs[0])),
			Devices:  addrs(gs),
			Evidence: ev,
			Impact:   "a job sized for the larger GPUs runs out of memory on the smaller ones; a GPU that reports less memory than its siblings may have retired memory or a different SKU",
			Remedy:   "Check the part numbers of the smaller GPUs and their retired pages or remapped rows; keep different SKUs apart when scheduling.",
		})
	}
	return out
}

func checkCompleteness(in *Input) []Finding {
	s := in.Snapshot
	var out []Finding
	if denied := toolErrors(s, snapshot.ToolPermissionDenied); len(denied) > 0 {
		out = append(out, Finding{
			ID:       "capture-incomplete",
			Severity: Warning,
			Title:    "the tool ran without access to the GPUs' device files: most of what it prints is unknown",
			Devices:  addrs(gpus(s)),
			Evidence: eventLines(denied, 3),
			Impact:   "the GPUs were listed but not read: their health, clocks, memory and firmware were never audited (a permission error is not a GPU fault)",
			Remedy:   "Capture again as root or as a member of the render and video groups (the groups that own /dev/kfd and /dev/dri/renderD*).",
		})
	}
	for _, c := range s.Claims {
		if c.What != "gpus" || c.Count <= len(s.GPUs) {
			continue
		}
		out = append(out, Finding{
			ID:       "capture-incomplete",
			Severity: Warning,
			Title:    fmt.Sprintf("%s claims %d GPUs but holds %d", c.Source, c.Count, len(s.GPUs)),
			Evidence: []string{fmt.Sprintf("%s: %s = %d; GPU records in the capture: %d", c.Source, orWord(c.Detail, "claimed count"), c.Count, len(s.GPUs))},
			Impact:   "the capture was trimmed or cut short: the GPUs it leaves out were never audited (kiln reports only the GPUs it holds and does not invent the others)",
			Remedy:   "Capture the machine again in full (kiln inventory --record DIR, or the whole tool output) to audit every GPU.",
		})
	}
	// PCI shows a GPU the driver does not: NVIDIA GPUs without a UUID when
	// a driver-level source (NVML, nvidia-smi) saw the others.
	driverSaw := 0
	var missing []*snapshot.GPU
	for _, g := range gpus(s) {
		if g.Vendor != snapshot.VendorNVIDIA {
			continue
		}
		if g.UUID != "" {
			driverSaw++
		} else if g.PCIAddress != "" {
			missing = append(missing, g)
		}
	}
	if driverSaw > 0 && len(missing) > 0 {
		var ev []string
		for _, g := range missing {
			ev = append(ev, fmt.Sprintf("%s is on the PCI bus but the driver reported no GPU there", gpuName(g)))
		}
		ev = append(ev, fmt.Sprintf("driver reports %d GPUs, PCI shows %d", driverSaw, driverSaw+len(missing)))
		out = append(out, Finding{
			ID:       "gpu-missing",
			Severity: Critical,
			Title:    fmt.Sprintf("%d %s on the PCI bus but not usable by the driver", len(missing), plural(len(missing), "GPU is", "GPUs are")),
			Devices:  addrs(missing),
			Evidence: ev,
			Impact:   "jobs cannot use these GPUs; multi-GPU jobs that expect the full node fail or run smaller",
			Remedy:   "Read the kernel log for NVRM probe failures or Xid 79 on these addresses; reset the GPU or reboot the node, and RMA a GPU that keeps failing to initialise.",
		})
	}
	if f, ok := unboundGPUs(s); ok && driverSaw == 0 {
		out = append(out, f)
	}
	fellOff := false
	for _, e := range s.Events {
		if e.Kind == snapshot.EventFallenOffBus || (e.Kind == snapshot.EventXid && e.Code == 79) {
			fellOff = true
		}
	}
	for _, e := range s.Events {
		// After a GPU fell off the bus the driver's probe fails too: that
		// is reported (with this line) as gpu-fallen-off-bus.
		if e.Kind != snapshot.EventProbeFailed || fellOff {
			continue
		}
		out = append(out, Finding{
			ID:       "gpu-missing",
			Severity: Critical,
			Title:    "kernel log: the NVIDIA driver failed to initialise a GPU",
			Devices:  nonEmpty(e.Device),
			Evidence: eventLines([]snapshot.Event{e}, 1),
			Impact:   "the GPU the probe failed on is not usable until it is reset or the node rebooted",
			Remedy:   "Look for 'fallen off the bus' or Xid lines just before this one; reboot the node, and RMA a GPU that keeps failing.",
		})
		break
	}
	return out
}

// gpuDrivers are the kernel drivers that make a GPU usable for compute;
// vfio-pci (passed to a VM) and pci-stub mean the host gave it away on
// purpose.
var gpuDrivers = map[string]string{"10de": "nvidia", "1002": "amdgpu"}

// unboundGPUs: the PCI listing (lspci -k) shows the vendor's driver bound
// to some GPUs and no driver at all on others of the same vendor: the
// driver failed to take them (an unsupported generation, a failed probe).
func unboundGPUs(s *snapshot.Snapshot) (Finding, bool) {
	bound := map[string]int{}
	var unbound []string
	for _, d := range s.PCI {
		if d.Kind != snapshot.KindGPU {
			continue
		}
		want, ok := gpuDrivers[d.VendorID]
		if !ok {
			continue
		}
		switch d.Driver {
		case want:
			bound[d.VendorID]++
		case "":
			unbound = append(unbound, d.VendorID+" "+d.Address)
		}
	}
	var devs, ev []string
	for _, u := range unbound {
		v, a, _ := strings.Cut(u, " ")
		if bound[v] == 0 {
			continue
		}
		devs = append(devs, a)
		ev = append(ev, fmt.Sprintf("%s: no kernel driver in use, while %d other GPUs of this vendor run %s", a, bound[v], gpuDrivers[v]))
	}
	if len(devs) == 0 {
		return Finding{}, false
	}
	return Finding{
		ID:       "gpu-missing",
		Severity: Critical,
		Title:    fmt.Sprintf("%d %s on the PCI bus with no driver, beside GPUs the driver took", len(devs), plural(len(devs), "GPU", "GPUs")),
		Devices:  devs,
		Evidence: ev,
		Impact:   "jobs cannot use these GPUs: the driver did not bind them",
		Remedy:   "Read the kernel log for the driver's probe of these addresses (an unsupported GPU generation for this driver branch, RmInitAdapter failures); install a driver branch that supports them, or reset the GPU or the node.",
	}, true
}

func checkPlacement(in *Input) []Finding {
	s := in.Snapshot
	var out []Finding
	var unknown []*snapshot.GPU
	for _, g := range gpus(s) {
		// On a host known to have one NUMA node, -1 is normal.
		if g.NUMANode != nil && *g.NUMANode < 0 && len(s.Host.NUMANodes) != 1 {
			unknown = append(unknown, g)
		}
	}
	if len(unknown) > 0 {
		var ev []string
		for _, g := range unknown {
			ev = append(ev, fmt.Sprintf("%s: NUMA node reported as %d", gpuName(g), *g.NUMANode))
		}
		out = append(out, Finding{
			ID:       "numa-unknown",
			Severity: Info,
			Title:    fmt.Sprintf("the platform reports no NUMA node for %d %s", len(unknown), plural(len(unknown), "GPU", "GPUs")),
			Devices:  addrs(unknown),
			Evidence: ev,
			Impact:   "kiln cannot keep a job's CPU threads and memory next to its GPU; on a multi-socket host that costs host-transfer bandwidth",
			Remedy:   "On a single-socket machine this is harmless. On multi-socket servers enable ACPI SRAT/NUMA reporting (disable node interleaving) in the BIOS.",
		})
	}
	h := s.Host
	if h.CPUSet != "" && h.OnlineCPUs != "" && cpuCount(h.CPUSet) > 0 && cpuCount(h.CPUSet) < cpuCount(h.OnlineCPUs) {
		out = append(out, Finding{
			ID:       "cpu-affinity-restricted",
			Severity: Info,
			Title:    fmt.Sprintf("the capture ran inside a cpuset of %d of the host's %d CPUs", cpuCount(h.CPUSet), cpuCount(h.OnlineCPUs)),
			Evidence: []string{"allowed CPUs: " + h.CPUSet, "online CPUs: " + h.OnlineCPUs},
			Impact:   "CPU affinity and NUMA facts describe a container's slice, not the host",
			Remedy:   "Run kiln inventory on the host (or with the host's cpuset) for a complete picture.",
		})
	}
	return out
}

// cpuCount counts CPUs in a kernel list ("0-3,8,10-11").
func cpuCount(list string) int {
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(list), ",") {
		if part == "" {
			continue
		}
		var a, b int
		if c, _ := fmt.Sscanf(part, "%d-%d", &a, &b); c == 2 && b >= a {
			n += b - a + 1
		} else if c, _ := fmt.Sscanf(part, "%d", &a); c == 1 {
			n++
		}
	}
	return n
}

func orWord(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func nonEmpty(xs ...string) []string {
	var out []string
	for _, x := range xs {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}
