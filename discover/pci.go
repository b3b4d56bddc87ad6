package discover

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// PCI vendor ids kiln knows GPUs of.
const (
	pciVendorNVIDIA = "10de"
	pciVendorAMD    = "1002"
	pciVendorIntel  = "8086"
)

// pciFunc is one PCI function found in sysfs.
type pciFunc struct {
	addr string // canonical address
	dir  string // resolved directory, relative to the root
	// parents are the directories of the PCI functions above this one,
	// nearest first, up to the root port.
	parents []string
	vendor  string
	device  string
	class   string // 6 hex digits
	kind    string
}

// walkPCI reads /sys/bus/pci/devices and fills s.GPUs and s.PCI with the
// GPUs, NVSwitches, NICs and NVMe drives and every bridge above them.
func walkPCI(r *reader, s *snapshot.Snapshot) {
	es, err := r.readDir("sys/bus/pci/devices")
	if err != nil {
		note(s, "sysfs", "PCI devices unknown: /sys/bus/pci/devices not readable")
		return
	}
	w := &pciWalk{r: r, s: s, bridges: map[string]*snapshot.PCIDevice{}, cfgs: map[string]*PCIConfig{}}
	var funcs []*pciFunc
	for _, e := range es {
		addr, err := snapshot.CanonicalPCI(e.Name())
		if err != nil {
			continue
		}
		f := w.resolve(e.Name(), addr)
		if f == nil {
			continue
		}
		funcs = append(funcs, f)
	}
	sort.Slice(funcs, func(i, j int) bool { return funcs[i].addr < funcs[j].addr })
	for _, f := range funcs {
		w.add(f)
	}
	for _, b := range w.bridges {
		s.PCI = append(s.PCI, *b)
	}
	if w.shortConfig > 0 {
		notef(s, "sysfs", "PCI config space of %d devices was readable only in part (sysfs gives the full config space to root only): ACS and AER state unknown there, port types inferred from the tree", w.shortConfig)
	}
}

type pciWalk struct {
	r       *reader
	s       *snapshot.Snapshot
	bridges map[string]*snapshot.PCIDevice
	cfgs    map[string]*PCIConfig
	// shortConfig counts devices whose config space was cut short.
	shortConfig int
}

// resolve follows the /sys/bus/pci/devices entry to the device directory,
// reads its class and, for classes kiln keeps, its vendor and device.
func (w *pciWalk) resolve(name, addr string) *pciFunc {
	link := "sys/bus/pci/devices/" + name
	dir := link
	if t, err := w.r.readLink(link); err == nil {
		if path.IsAbs(t) {
			dir = cleanRel(t)
		} else {
			dir = cleanRel(path.Join(path.Dir(link), t))
		}
	}
	class, ok := w.hexAttr(dir, "class", 6)
	if !ok {
		return nil
	}
	f := &pciFunc{addr: addr, dir: dir, class: class}
	needVendor := strings.HasPrefix(class, "03") || strings.HasPrefix(class, "0680")
	if needVendor {
		f.vendor, _ = w.hexAttr(dir, "vendor", 4)
	}
	f.kind = classify(f.vendor, class)
	if f.kind == "" {
		return nil
	}
	if !needVendor {
		f.vendor, _ = w.hexAttr(dir, "vendor", 4)
	}
	f.device, _ = w.hexAttr(dir, "device", 4)
	// The parent directories that are PCI addresses are the bridges above
	// this function; the first one that is not ends the walk (pci0000:00).
	for p := path.Dir(dir); p != "." && p != "/" && p != ""; p = path.Dir(p) {
		if _, err := snapshot.CanonicalPCI(path.Base(p)); err != nil || !strings.Contains(path.Base(p), ":") {
			break
		}
		f.parents = append(f.parents, p)
	}
	return f
}

// classify returns the kind of PCI function kiln keeps, or "".
func classify(vendor, class string) string {
	base := class[:4]
	switch {
	case (base == "0300" || base == "0302" || base == "0380") &&
		(vendor == pciVendorNVIDIA || vendor == pciVendorAMD || vendor == pciVendorIntel):
		return snapshot.KindGPU
	case base == "0680" && vendor == pciVendorNVIDIA:
		return snapshot.KindNVSwitch
	case strings.HasPrefix(class, "02"):
		return snapshot.KindNIC
	case class == "010802":
		return snapshot.KindNVMe
	}
	return ""
}

func gpuVendor(pciVendor string) string {
	switch pciVendor {
	case pciVendorNVIDIA:
		return snapshot.VendorNVIDIA
	case pciVendorAMD:
		return snapshot.VendorAMD
	case pciVendorIntel:
		return snapshot.VendorIntel
	}
	return ""
}

// hexAttr reads a sysfs hex attribute ("0x030200") as digits lowercase
// hex digits, zero-padded.
func (w *pciWalk) hexAttr(dir, name string, digits int) (string, bool) {
	v, ok := w.r.readString(dir + "/" + name)
	if !ok {
		return "", false
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(v), "0x"), 16, 32)
	if err != nil || n >= 1<<(4*digits) {
		return "", false
	}
	return fmt.Sprintf("%0*x", digits, n), true
}

func (w *pciWalk) add(f *pciFunc) {
	dev := w.device(f.dir, f.addr, f.kind)
	dev.VendorID, dev.DeviceID, dev.Class = f.vendor, f.device, f.class
	var upstream []string
	n := len(f.parents)
	for i, p := range f.parents {
		addr, _ := snapshot.CanonicalPCI(path.Base(p))
		upstream = append(upstream, addr)
		if _, ok := w.bridges[addr]; ok {
			continue
		}
		// Position from the top of the chain: 0 is the root port, then
		// switch upstream and downstream ports alternate.
		fromTop := n - 1 - i
		inferred := snapshot.KindSwitchDown
		switch {
		case fromTop == 0:
			inferred = snapshot.KindRootPort
		case fromTop%2 == 1:
			inferred = snapshot.KindSwitchUp
		}
		b := w.device(p, addr, inferred)
		b.VendorID, _ = w.hexAttr(p, "vendor", 4)
		b.DeviceID, _ = w.hexAttr(p, "device", 4)
		b.Class, _ = w.hexAttr(p, "class", 6)
		if b.Class != "" && !strings.HasPrefix(b.Class, "06") {
			b.Kind = snapshot.KindOther
		}
		if i+1 < n {
			b.Parent, _ = snapshot.CanonicalPCI(path.Base(f.parents[i+1]))
		}
		w.bridges[addr] = b
	}
	if len(upstream) > 0 {
		dev.Parent = upstream[0]
	}
	if f.kind != snapshot.KindGPU {
		w.s.PCI = append(w.s.PCI, *dev)
		return
	}
	g := snapshot.GPU{
		Vendor:      gpuVendor(f.vendor),
		PCIAddress:  f.addr,
		DeviceID:    f.device,
		Upstream:    upstream,
		NUMANode:    dev.NUMANode,
		CPUAffinity: w.localCPUs(f.dir),
	}
	sv, ok1 := w.hexAttr(f.dir, "subsystem_vendor", 4)
	sd, ok2 := w.hexAttr(f.dir, "subsystem_device", 4)
	if ok1 && ok2 {
		g.SubsystemID = sv + ":" + sd
	}
	if m, ok := kb.Default().GPUByDeviceID(g.Vendor, g.DeviceID); ok {
		g.Model = m.Name
	}
	if dev.Link != nil {
		l := *dev.Link
		if len(upstream) > 0 {
			if up := w.bridges[upstream[0]]; up != nil && up.Link != nil {
				l.HostMaxGen = up.Link.MaxGen
			}
		}
		g.PCIe = &l
	}
	w.s.GPUs = append(w.s.GPUs, g)
	w.s.PCI = append(w.s.PCI, *dev)
}

// device reads what every kept PCI function has: NUMA node, link state,
// config-space capabilities, AER counters, driver and interface name.
func (w *pciWalk) device(dir, addr, kind string) *snapshot.PCIDevice {
	d := &snapshot.PCIDevice{Address: addr, Kind: kind}
	if v, ok := w.r.readString(dir + "/numa_node"); ok {
		// -1 is kept: the platform reports no affinity (see snapshot.GPU.NUMANode).
		if n, err := strconv.Atoi(v); err == nil && n >= -1 {
			d.NUMANode = snapshot.Ptr(n)
		}
	}
	link := w.sysfsLink(dir)
	if b, err := w.r.readFile(dir + "/config"); err == nil {
		if cfg, err := ParsePCIConfig(b); err == nil {
			w.cfgs[addr] = cfg
			if cfg.Truncated || cfg.Size <= 64 {
				w.shortConfig++
			}
			if k := pcieKind(cfg.PortType); cfg.HasPCIe && k != "" && kind != snapshot.KindGPU &&
				kind != snapshot.KindNIC && kind != snapshot.KindNVMe && kind != snapshot.KindNVSwitch {
				d.Kind = k
			}
			d.ACS, d.AER = cfg.ACS, cfg.AER
			if cfg.HasPCIe {
				// sysfs is the kernel's reading of the same registers; the
				// config space fills what sysfs lacks (old kernels).
				if link.CurrentGen == 0 {
					link.CurrentGen = cfg.CurGen
				}
				if link.MaxGen == 0 {
					link.MaxGen = cfg.MaxGen
				}
				if link.CurrentWidth == 0 {
					link.CurrentWidth = cfg.CurWidth
				}
				if link.MaxWidth == 0 {
					link.MaxWidth = cfg.MaxWidth
				}
			}
		}
	}
	if link != (snapshot.PCIeLink{}) {
		d.Link = &link
	}
	if counts := w.aerCounts(dir); counts != nil {
		if d.AER == nil {
			d.AER = &snapshot.AER{}
		}
		d.AER.Counts = counts
	}
	if t, err := w.r.readLink(dir + "/driver"); err == nil {
		d.Driver = path.Base(t)
	}
	switch kind {
	case snapshot.KindNIC:
		if n := w.firstEntry(dir + "/infiniband"); n != "" {
			d.Interface = n
		} else {
			d.Interface = w.firstEntry(dir + "/net")
		}
	case snapshot.KindNVMe:
		if c := w.firstEntry(dir + "/nvme"); c != "" {
			d.Interface = c
			if ns := w.firstEntryPrefix(dir+"/nvme/"+c, c+"n"); ns != "" {
				d.Interface = ns
			}
		}
	}
	return d
}

// sysfsLink reads current/max link speed and width.
func (w *pciWalk) sysfsLink(dir string) snapshot.PCIeLink {
	var l snapshot.PCIeLink
	if v, ok := w.r.readString(dir + "/current_link_speed"); ok {
		l.CurrentGen, _ = ParseLinkSpeed(v)
	}
	if v, ok := w.r.readString(dir + "/max_link_speed"); ok {
		l.MaxGen, _ = ParseLinkSpeed(v)
	}
	if v, ok := w.r.readString(dir + "/current_link_width"); ok {
		l.CurrentWidth = parseWidth(v)
	}
	if v, ok := w.r.readString(dir + "/max_link_width"); ok {
		l.MaxWidth = parseWidth(v)
	}
	return l
}

func (w *pciWalk) localCPUs(dir string) string {
	v, _ := w.r.readString(dir + "/local_cpulist")
	return v
}

// firstEntry returns the first name (sorted) in a directory, keeping that
// name in a recording.
func (w *pciWalk) firstEntry(dir string) string { return w.firstEntryPrefix(dir, "") }

func (w *pciWalk) firstEntryPrefix(dir, prefix string) string {
	es, err := w.r.readDir(dir)
	if err != nil {
		return ""
	}
	var names []string
	for _, e := range es {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	w.r.markDir(dir + "/" + names[0])
	return names[0]
}

// aerCounts reads aer_dev_correctable, aer_dev_fatal and aer_dev_nonfatal.
// Keys are "<file>/<name>" ("correctable/RxErr", "fatal/TOTAL_ERR_FATAL");
// the TOTAL lines are always kept, other names only when non-zero.
func (w *pciWalk) aerCounts(dir string) map[string]uint64 {
	var out map[string]uint64
	for _, kind := range []string{"correctable", "fatal", "nonfatal"} {
		b, err := w.r.readFile(dir + "/aer_dev_" + kind)
		if err != nil {
			continue
		}
		for name, n := range ParseAERCounters(string(b)) {
			if n == 0 && !strings.HasPrefix(name, "TOTAL_") {
				continue
			}
			if out == nil {
				out = map[string]uint64{}
			}
			out[kind+"/"+name] = n
		}
	}
	return out
}

// ParseAERCounters reads a sysfs aer_dev_* file: "<name> <count>" lines.
func ParseAERCounters(text string) map[string]uint64 {
	out := map[string]uint64{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		out[f[0]] = n
	}
	return out
}

// ParseLinkSpeed turns a sysfs link speed into a PCIe generation. It
// accepts current kernels' "16.0 GT/s PCIe", old kernels' "16 GT/s" and
// "5 GT/s", and "Unknown" (no link), which is 0 with no error.
func ParseLinkSpeed(s string) (int, error) {
	t := strings.TrimSpace(s)
	if t == "" || strings.EqualFold(t, "unknown") {
		return 0, nil
	}
	num, _, ok := strings.Cut(t, "GT/s")
	if !ok {
		return 0, fmt.Errorf("link speed %q: want \"<rate> GT/s\"", s)
	}
	rate, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil {
		return 0, fmt.Errorf("link speed %q: %q is not a rate in GT/s", s, strings.TrimSpace(num))
	}
	if gen := kb.Default().PCIeGenForGTps(rate); gen > 0 {
		return gen, nil
	}
	return 0, fmt.Errorf("link speed %q: %v GT/s is no PCIe generation kiln knows", s, rate)
}

func parseWidth(s string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(s), "x"))
	if err != nil || n < 0 || n > 32 {
		return 0
	}
	return n
}
