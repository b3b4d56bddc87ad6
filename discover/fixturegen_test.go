package discover

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// The record bundles under testdata/fixtures are derived, not recorded:
// each is described below as a compact machine (fxMachine), written out as
// a sysfs/procfs tree shaped like a live machine's, and recorded with
// Record, so the bundle has exactly the layout Record produces.
//
//	go test ./discover -run TestFixturesUpToDate -update
//
// regenerates them; without -update the test fails when a committed
// bundle differs from what the generator writes.
var update = flag.Bool("update", false, "rewrite testdata/fixtures from the generator")

const fixturesDir = "../testdata/fixtures"

// fxDev is one PCI function and the functions below it.
type fxDev struct {
	addr                                 string
	vendor, device, subVendor, subDevice uint16
	class                                uint32
	// port is the PCIe port type written in the config space.
	port int
	// Link capability and status: generation and width.
	maxGen, maxWidth, curGen, curWidth int
	// acsCap/acsCtl: ACS capability and control registers; no ACS
	// capability when acsCap is 0.
	acsCap, acsCtl uint16
	// aerCor/aerUnc: AER correctable and uncorrectable status registers.
	aerCor, aerUnc uint32
	// aerCounts: name -> count for aer_dev_correctable; nil writes zeros.
	aerCounts map[string]uint64
	driver    string
	netIf     string
	ibIf      string
	nvme      string
	// files are extra attribute files relative to the device directory.
	files map[string]string
	kids  []*fxDev
}

// fxRoot is one PCI root bus (pci0000:16) and its devices.
type fxRoot struct {
	bus  string // "0000:16"
	numa int
	devs []*fxDev
}

// fxMachine is one machine.
type fxMachine struct {
	name      string
	readme    string
	hostname  string
	kernel    string
	arch      string // written to proc/sys/kernel/arch when set
	osRelease string
	cpuModel  string
	threads   int
	memKB     uint64
	numaCPUs  []string
	numaMemKB []uint64
	cpuset    string
	roots     []fxRoot
	// files and links are other paths of the root (modules, driver and
	// toolkit files).
	files map[string]string
	links map[string]string
	// kmsg are /dev/kmsg records; nil leaves /dev/kmsg out.
	kmsg []string
	nvml *NVMLReadings
	// cfgLimit cuts config files (64: a non-root reader); 0 is 4096.
	cfgLimit int
	// procs are /proc/<pid>/comm names.
	procs     map[int]string
	collected time.Time
}

func online(m *fxMachine) string { return fmt.Sprintf("0-%d", m.threads-1) }

// writeTree writes m as a live-machine root under dir.
func (m *fxMachine) writeTree(t testing.TB, dir string) {
	t.Helper()
	put := func(rel, content string) {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(rel, target string) {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	put("proc/sys/kernel/hostname", m.hostname+"\n")
	put("proc/sys/kernel/osrelease", m.kernel+"\n")
	if m.arch != "" {
		put("proc/sys/kernel/arch", m.arch+"\n")
	}
	put("etc/os-release", m.osRelease)
	var ci strings.Builder
	for i := 0; i < m.threads; i++ {
		fmt.Fprintf(&ci, "processor\t: %d\nvendor_id\t: GenuineIntel\nmodel name\t: %s\ncpu MHz\t\t: 2000.000\n\n", i, m.cpuModel)
	}
	put("proc/cpuinfo", ci.String())
	put("proc/meminfo", fmt.Sprintf("MemTotal:       %d kB\nMemFree:        %d kB\nMemAvailable:   %d kB\n", m.memKB, m.memKB/2, m.memKB/2))
	for i, cpus := range m.numaCPUs {
		put(fmt.Sprintf("sys/devices/system/node/node%d/cpulist", i), cpus+"\n")
		put(fmt.Sprintf("sys/devices/system/node/node%d/meminfo", i), fmt.Sprintf("Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\n", i, m.numaMemKB[i], i, m.numaMemKB[i]/2))
	}
	put("sys/devices/system/node/possible", fmt.Sprintf("0-%d\n", len(m.numaCPUs)-1))
	put("sys/devices/system/cpu/online", online(m)+"\n")
	cpuset := m.cpuset
	if cpuset == "" {
		cpuset = online(m)
	}
	put("proc/self/status", "Name:\tkiln\nState:\tR (running)\nCpus_allowed:\tffffffff\nCpus_allowed_list:\t"+cpuset+"\nMems_allowed_list:\t0-1\n")
	for pid, comm := range m.procs {
		put(fmt.Sprintf("proc/%d/comm", pid), comm+"\n")
	}
	for rel, c := range m.files {
		put(rel, c)
	}
	for rel, target := range m.links {
		link(rel, target)
	}
	if m.kmsg != nil {
		put("dev/kmsg", strings.Join(m.kmsg, "\n")+"\n")
	}
	for _, r := range m.roots {
		rootDir := "sys/devices/pci" + r.bus
		put(rootDir+"/uevent", "")
		var walk func(parent string, d *fxDev)
		walk = func(parent string, d *fxDev) {
			devDir := parent + "/" + d.addr
			m.writeDev(put, link, devDir, r.numa, d)
			rel, err := filepath.Rel("sys/bus/pci/devices", devDir)
			if err != nil {
				t.Fatal(err)
			}
			link("sys/bus/pci/devices/"+d.addr, filepath.ToSlash(rel))
			for _, k := range d.kids {
				walk(devDir, k)
			}
		}
		for _, d := range r.devs {
			walk(rootDir, d)
		}
	}
}

var fxSpeed = map[int]string{1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}

func (m *fxMachine) writeDev(put func(string, string), link func(string, string), dir string, numa int, d *fxDev) {
	put(dir+"/vendor", fmt.Sprintf("0x%04x\n", d.vendor))
	put(dir+"/device", fmt.Sprintf("0x%04x\n", d.device))
	put(dir+"/class", fmt.Sprintf("0x%06x\n", d.class))
	put(dir+"/subsystem_vendor", fmt.Sprintf("0x%04x\n", d.subVendor))
	put(dir+"/subsystem_device", fmt.Sprintf("0x%04x\n", d.subDevice))
	put(dir+"/numa_node", fmt.Sprintf("%d\n", numa))
	put(dir+"/local_cpulist", m.numaCPUs[numa]+"\n")
	put(dir+"/enable", "1\n")
	if d.maxGen > 0 {
		put(dir+"/max_link_speed", fxSpeed[d.maxGen]+"\n")
		put(dir+"/max_link_width", fmt.Sprintf("%d\n", d.maxWidth))
		put(dir+"/current_link_speed", fxSpeed[d.curGen]+"\n")
		put(dir+"/current_link_width", fmt.Sprintf("%d\n", d.curWidth))
	}
	cfg := d.config()
	limit := m.cfgLimit
	if limit == 0 || limit > len(cfg) {
		limit = len(cfg)
	}
	put(dir+"/config", string(cfg[:limit]))
	if d.maxGen > 0 {
		names := []string{"RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF"}
		var b strings.Builder
		var total uint64
		for _, n := range names {
			fmt.Fprintf(&b, "%s %d\n", n, d.aerCounts[n])
			total += d.aerCounts[n]
		}
		fmt.Fprintf(&b, "TOTAL_ERR_COR %d\n", total)
		put(dir+"/aer_dev_correctable", b.String())
		unc := []string{"Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked"}
		for _, kind := range []string{"fatal", "nonfatal"} {
			var u strings.Builder
			for _, n := range unc {
				fmt.Fprintf(&u, "%s 0\n", n)
			}
			fmt.Fprintf(&u, "TOTAL_ERR_%s 0\n", strings.ToUpper(kind))
			put(dir+"/aer_dev_"+kind, u.String())
		}
	}
	if d.driver != "" {
		rel, _ := filepath.Rel(dir, "sys/bus/pci/drivers/"+d.driver)
		link(dir+"/driver", filepath.ToSlash(rel))
	}
	if d.netIf != "" {
		put(dir+"/net/"+d.netIf+"/mtu", "1500\n")
	}
	if d.ibIf != "" {
		put(dir+"/infiniband/"+d.ibIf+"/node_type", "1: CA\n")
	}
	if d.nvme != "" {
		put(dir+"/nvme/"+d.nvme+"/model", "NVMe SSD\n")
		put(dir+"/nvme/"+d.nvme+"/"+d.nvme+"n1/size", "7501476528\n")
	}
	for rel, c := range d.files {
		put(dir+"/"+rel, c)
	}
}

// config builds the device's 4 KiB configuration space: header, a power
// management capability at 0x40, the PCIe capability at 0x60, AER at
// 0x100 and ACS at 0x148.
func (d *fxDev) config() []byte {
	b := make([]byte, 4096)
	p16 := func(at int, v uint16) { binary.LittleEndian.PutUint16(b[at:], v) }
	p32 := func(at int, v uint32) { binary.LittleEndian.PutUint32(b[at:], v) }
	p16(0x00, d.vendor)
	p16(0x02, d.device)
	p16(0x04, 0x0406)
	p16(0x06, 0x0010)
	b[0x08] = 0xa1
	b[0x09], b[0x0a], b[0x0b] = byte(d.class), byte(d.class>>8), byte(d.class>>16)
	bridge := d.class>>8 == 0x0604
	if bridge {
		b[0x0e] = 0x01
		if len(d.kids) > 0 {
			sec, sub := busOf(d.kids[0].addr), 0
			var walk func(x *fxDev)
			walk = func(x *fxDev) {
				sub = max(sub, busOf(x.addr))
				for _, k := range x.kids {
					walk(k)
				}
			}
			for _, k := range d.kids {
				walk(k)
			}
			b[0x18], b[0x19], b[0x1a] = byte(busOf(d.addr)), byte(sec), byte(sub)
		}
	} else {
		p16(0x2c, d.subVendor)
		p16(0x2e, d.subDevice)
	}
	b[0x34] = 0x40
	b[0x40], b[0x41] = 0x01, 0x60 // power management, next: PCIe
	p16(0x42, 0x0003)
	if d.maxGen == 0 {
		b[0x41] = 0
		return b
	}
	b[0x60], b[0x61] = 0x10, 0x00
	p16(0x62, uint16(0x2|d.port<<4))
	p32(0x6c, uint32(d.maxGen)|uint32(d.maxWidth)<<4)
	p16(0x72, uint16(d.curGen)|uint16(d.curWidth)<<4|1<<13)
	var vec uint32
	for g := 1; g <= d.maxGen; g++ {
		vec |= 1 << g
	}
	p32(0x8c, vec)
	next := uint32(0)
	if d.acsCap != 0 {
		next = 0x148
		p32(0x148, 0x000d|1<<16)
		p16(0x14c, d.acsCap)
		p16(0x14e, d.acsCtl)
	}
	p32(0x100, 0x0001|2<<16|next<<20)
	p32(0x104, d.aerUnc)
	p32(0x110, d.aerCor)
	p32(0x114, 0x0000e000) // correctable mask: AdvNonFatalErr CorrIntErr HeaderOF
	return b
}

func busOf(addr string) int {
	var dom, bus, dev, fn int
	if _, err := fmt.Sscanf(addr, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); err != nil {
		return 0
	}
	return bus
}

// record writes m's tree to a temporary root and records it into out.
func (m *fxMachine) record(t testing.TB, out string) {
	t.Helper()
	root := t.TempDir()
	m.writeTree(t, root)
	opts := Options{Root: root, SkipNVML: true, nvml: m.nvml, collected: m.collected}
	if m.arch == "" {
		opts.arch = "x86_64"
	}
	if err := Record(context.Background(), opts, out); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "README.md"), []byte(m.readme), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fixtures are the committed bundles.
func fixtures() []*fxMachine {
	return []*fxMachine{pcie4DowntrainedACS(), consumer2NoP2P(), h100HGX8()}
}

func TestFixturesUpToDate(t *testing.T) {
	for _, m := range fixtures() {
		t.Run(m.name, func(t *testing.T) {
			dst := filepath.Join(fixturesDir, m.name)
			if *update {
				if err := os.RemoveAll(dst); err != nil {
					t.Fatal(err)
				}
				m.record(t, dst)
				return
			}
			tmp := filepath.Join(t.TempDir(), m.name)
			m.record(t, tmp)
			want, got := treeListing(t, tmp), treeListing(t, dst)
			if want != got {
				t.Errorf("%s differs from the generator's output; run go test ./discover -run TestFixturesUpToDate -update\n%s", dst, firstDiff(want, got))
			}
		})
	}
}

// treeListing describes a tree: every path with its content's hash or
// link target, sorted.
func treeListing(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			lines = append(lines, rel+" -> "+target)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("%s %d %x", rel, len(b), fnv(b)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func fnv(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			return "generator: " + al[i] + "\ncommitted: " + bl[i]
		}
	}
	return fmt.Sprintf("generator has %d paths, committed %d", len(al), len(bl))
}

// Helpers to describe devices.

func u32(v uint32) *uint32 { return &v }
func u64(v uint64) *uint64 { return &v }
func intp(v int) *int      { return &v }
func boolp(v bool) *bool   { return &v }

// ACS register values: capability SV TB RR CR UF DT; control as Linux
// sets it with an IOMMU on (SV RR CR UF).
const (
	acsCapSwitch = 0x005f
	acsCtlLinux  = 0x001d
)

var collectedAt = time.Date(2025, 3, 14, 9, 30, 0, 0, time.UTC)

func osRelease(id, version, pretty string) string {
	return fmt.Sprintf("PRETTY_NAME=%q\nNAME=%q\nVERSION_ID=%q\nID=%s\n", pretty, strings.Fields(pretty)[0], version, id)
}

func cudaVersionJSON(v string) string {
	return fmt.Sprintf("{\n   \"cuda\" : {\n      \"name\" : \"CUDA SDK\",\n      \"version\" : \"%s\"\n   },\n   \"cuda_cudart\" : {\n      \"name\" : \"CUDA Runtime (cudart)\",\n      \"version\" : \"%s\"\n   }\n}\n", v, v)
}

// pcie4DowntrainedACS: 4x L40S behind two Broadcom PEX88096 switches, one
// GPU trained at Gen4 x8 under load, ACS redirect on the switch ports.
func pcie4DowntrainedACS() *fxMachine {
	gpu := func(addr string, curWidth int, cor uint32, counts map[string]uint64) *fxDev {
		return &fxDev{addr: addr, vendor: 0x10de, device: 0x26b9, subVendor: 0x10de, subDevice: 0x1851, class: 0x030200,
			port: portEndpoint, maxGen: 4, maxWidth: 16, curGen: 4, curWidth: curWidth, aerCor: cor, aerCounts: counts, driver: "nvidia"}
	}
	down := func(addr string, curWidth int, cor uint32, kid *fxDev) *fxDev {
		return &fxDev{addr: addr, vendor: 0x1000, device: 0xc010, subVendor: 0x1000, subDevice: 0xa064, class: 0x060400,
			port: portSwitchDown, maxGen: 4, maxWidth: 16, curGen: 4, curWidth: curWidth,
			acsCap: acsCapSwitch, acsCtl: acsCtlLinux, aerCor: cor, driver: "pcieport", kids: []*fxDev{kid}}
	}
	switchTree := func(rootPort, up string, downs ...*fxDev) *fxDev {
		return &fxDev{addr: rootPort, vendor: 0x8086, device: 0x347a, class: 0x060400, port: portRootPort,
			maxGen: 4, maxWidth: 16, curGen: 4, curWidth: 16, acsCap: acsCapSwitch, acsCtl: acsCtlLinux, driver: "pcieport",
			kids: []*fxDev{{addr: up, vendor: 0x1000, device: 0xc010, subVendor: 0x1000, subDevice: 0xa064, class: 0x060400,
				port: portSwitchUp, maxGen: 4, maxWidth: 16, curGen: 4, curWidth: 16, driver: "pcieport", kids: downs}}}
	}
	badCounts := map[string]uint64{"RxErr": 212, "BadTLP": 37, "BadDLLP": 9}
	nic := &fxDev{addr: "0000:43:00.0", vendor: 0x15b3, device: 0x101b, subVendor: 0x15b3, subDevice: 0x0007, class: 0x020700,
		port: portEndpoint, maxGen: 4, maxWidth: 16, curGen: 4, curWidth: 16, driver: "mlx5_core", netIf: "ibp67s0", ibIf: "mlx5_0"}
	node0 := fxRoot{bus: "0000:3e", numa: 0, devs: []*fxDev{switchTree("0000:3e:02.0", "0000:3f:00.0",
		down("0000:40:00.0", 8, 0x00c1, gpu("0000:41:00.0", 8, 0x00c1, badCounts)),
		down("0000:40:01.0", 16, 0, gpu("0000:42:00.0", 16, 0, nil)),
		down("0000:40:02.0", 16, 0, nic),
	)}}
	node1 := fxRoot{bus: "0000:be", numa: 1, devs: []*fxDev{switchTree("0000:be:02.0", "0000:bf:00.0",
		down("0000:c0:00.0", 16, 0, gpu("0000:c1:00.0", 16, 0, nil)),
		down("0000:c0:01.0", 16, 0, gpu("0000:c2:00.0", 16, 0, nil)),
	)}}
	platform := fxRoot{bus: "0000:00", numa: 0, devs: []*fxDev{
		{addr: "0000:00:00.0", vendor: 0x8086, device: 0x09a2, class: 0x060000},
		{addr: "0000:00:1c.0", vendor: 0x8086, device: 0xa0bc, class: 0x060400, port: portRootPort, maxGen: 3, maxWidth: 1, curGen: 3, curWidth: 1, driver: "pcieport",
			kids: []*fxDev{{addr: "0000:01:00.0", vendor: 0x8086, device: 0x1563, subVendor: 0x15d9, subDevice: 0x1563, class: 0x020000,
				port: portEndpoint, maxGen: 3, maxWidth: 1, curGen: 3, curWidth: 1, driver: "ixgbe", netIf: "eno1"}}},
		{addr: "0000:00:1c.4", vendor: 0x8086, device: 0xa0bd, class: 0x060400, port: portRootPort, maxGen: 2, maxWidth: 1, curGen: 2, curWidth: 1, driver: "pcieport",
			kids: []*fxDev{{addr: "0000:02:00.0", vendor: 0x1a03, device: 0x1150, class: 0x060400, kids: []*fxDev{
				{addr: "0000:03:00.0", vendor: 0x1a03, device: 0x2000, subVendor: 0x15d9, subDevice: 0x1b95, class: 0x030000, driver: "ast"}}}}},
	}}
	nvme := fxRoot{bus: "0000:16", numa: 0, devs: []*fxDev{{addr: "0000:16:02.0", vendor: 0x8086, device: 0x347a, class: 0x060400, port: portRootPort,
		maxGen: 4, maxWidth: 4, curGen: 4, curWidth: 4, acsCap: acsCapSwitch, acsCtl: acsCtlLinux, driver: "pcieport",
		kids: []*fxDev{{addr: "0000:17:00.0", vendor: 0x144d, device: 0xa80a, subVendor: 0x144d, subDevice: 0xa812, class: 0x010802,
			port: portEndpoint, maxGen: 4, maxWidth: 4, curGen: 4, curWidth: 4, driver: "nvme", nvme: "nvme0"}}}}}

	nv := &NVMLReadings{DriverVersion: "550.90.07", NVMLVersion: "12.550.90.07", CUDADriverVersion: 12040}
	for i, addr := range []string{"0000:41:00.0", "0000:42:00.0", "0000:c1:00.0", "0000:c2:00.0"} {
		width := 16
		if i == 0 {
			width = 8
		}
		nv.Devices = append(nv.Devices, NVMLDevice{
			Index: i, Name: "NVIDIA L40S", UUID: fmt.Sprintf("GPU-6f1c2e0a-5b7d-4c1e-9a3f-0000000000%02d", i),
			PCIBusID: addr, PCIDeviceID: "26b9", PCISubsystemID: "10de:1851", VBIOS: "95.02.66.00.02",
			MemoryTotalBytes: u64(48305799168), MemoryUsedBytes: u64(41875931136), ComputeCapability: "8.9",
			PowerUsageMW: u32(318000 + uint32(i)*2100), PowerLimitMW: u32(350000), EnforcedPowerLimitMW: u32(350000), DefaultPowerLimitMW: u32(350000),
			TemperatureC: u32(67 + uint32(i)), PerformanceState: intp(0), UtilizationGPU: u32(90), UtilizationMemory: u32(61),
			Persistence: boolp(true), ComputeMode: "Default", ECCEnabled: boolp(true), ECCPending: boolp(true),
			ECCVolatileCorrected: u64(0), ECCVolatileUncorrected: u64(0),
			ClockEventReasons: u64(0), Throttle: decodeClockEventReasons(0),
			PCIeCurrentGen: intp(4), PCIeMaxGen: intp(4), PCIeCurrentWidth: intp(width), PCIeMaxWidth: intp(16),
			PCIeReplays: u64(map[bool]uint64{true: 1843, false: 0}[i == 0]),
			NUMANode:    intp(i / 2),
		})
	}
	return &fxMachine{
		name:      "pcie4-downtrained-acs",
		hostname:  "gpu-pcie-07",
		kernel:    "5.15.0-112-generic",
		osRelease: osRelease("ubuntu", "22.04", "Ubuntu 22.04.4 LTS"),
		cpuModel:  "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz",
		threads:   128,
		memKB:     527958280,
		numaCPUs:  []string{"0-31,64-95", "32-63,96-127"},
		numaMemKB: []uint64{263822392, 264135888},
		roots:     []fxRoot{platform, nvme, node0, node1},
		files: map[string]string{
			"sys/module/nvidia/version":         "550.90.07\n",
			"sys/module/nvidia_uvm/version":     "550.90.07\n",
			"sys/module/nvidia_modeset/version": "550.90.07\n",
			"sys/module/ast/uevent":             "",
			"proc/driver/nvidia/version":        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n",
			"usr/local/cuda-12.4/version.json":  cudaVersionJSON("12.4.131"),
		},
		links: map[string]string{"usr/local/cuda": "cuda-12.4"},
		kmsg: []string{
			"6,512,2046113,-;pci 0000:41:00.0: [10de:26b9] type 00 class 0x030200",
			"6,530,2051877,-;pci 0000:41:00.0: 126.024 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x8 link at 0000:40:00.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)",
			"6,1412,9804331,-;nvidia: module license 'NVIDIA' taints kernel.",
			"6,1420,9951203,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024",
			"3,20611,81234567890,-;pcieport 0000:40:00.0: AER: Corrected error received: 0000:41:00.0",
			"3,20612,81234567911,-;nvidia 0000:41:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
			"3,20613,81234567925,-;nvidia 0000:41:00.0:   device [10de:26b9] error status/mask=00000001/0000e000",
			"3,20614,81234567933,-;nvidia 0000:41:00.0:    [ 0] RxErr                  (First)",
		},
		nvml:      nv,
		collected: collectedAt,
		readme: `# pcie4-downtrained-acs (derived fixture, not a recording)

A kiln record bundle written by discover/fixturegen_test.go in the exact
layout discover.Record produces. It was not recorded on a real machine: it
models a common 4-GPU PCIe Gen4 server (dual Intel Xeon Gold 6338, Ice Lake,
two NUMA nodes) with 4x NVIDIA L40S (10de:26b9), each pair behind one
Broadcom/PLX PEX88096-class switch (1000:c010) on its own root port:

* NUMA 0: root port 0000:3e:02.0 -> switch 0000:3f:00.0 -> downstream ports
  0000:40:00.0 (GPU 0000:41:00.0), 0000:40:01.0 (GPU 0000:42:00.0),
  0000:40:02.0 (ConnectX-6 InfiniBand NIC 0000:43:00.0, mlx5_0).
* NUMA 1: root port 0000:be:02.0 -> switch 0000:bf:00.0 -> 0000:c0:00.0
  (GPU 0000:c1:00.0), 0000:c0:01.0 (GPU 0000:c2:00.0).
* NVMe 0000:17:00.0 (nvme0n1) on root port 0000:16:02.0, NUMA 0; onboard
  Intel NIC 0000:01:00.0 (eno1); ASPEED BMC VGA 0000:03:00.0 (not a GPU).

What a good audit reports:
* warning: GPU 0000:41:00.0 runs at PCIe Gen4 x8 while the card and its slot
  (downstream port 0000:40:00.0) support Gen4 x16, under 90 % load (nvml.json):
  a real fault, not idle power saving. Its AER correctable counters are
  non-zero (RxErr 212, BadTLP 37, BadDLLP 9) and NVML counts 1843 replays.
* warning/info: ACS Request Redirect and Completion Redirect are enabled on
  the switch downstream ports, so GPU peer-to-peer traffic is routed up
  through the root complex.
* info: GPU-NIC affinity: the NIC shares switch 0000:3f:00.0 with GPUs 41 and
  42 (NUMA 0); GPUs c1 and c2 reach it only across sockets.

Config-space files are 4096 bytes (recorded as root) and were built to carry
the PCIe, AER and ACS capabilities above. Bridge and NIC device ids follow
the real parts; subsystem ids are illustrative.
`,
	}
}

// consumer2NoP2P: two RTX 4090s, each on its own CPU root port, recorded as
// a non-root user (64-byte config space, no kernel log).
func consumer2NoP2P() *fxMachine {
	gpu := func(addr, audio string) []*fxDev {
		return []*fxDev{
			{addr: addr, vendor: 0x10de, device: 0x2684, subVendor: 0x10de, subDevice: 0x167c, class: 0x030000,
				port: portEndpoint, maxGen: 4, maxWidth: 16, curGen: 1, curWidth: 16, driver: "nvidia"},
			{addr: audio, vendor: 0x10de, device: 0x22ba, subVendor: 0x10de, subDevice: 0x167c, class: 0x040300,
				port: portEndpoint, maxGen: 4, maxWidth: 16, curGen: 1, curWidth: 16, driver: "snd_hda_intel"},
		}
	}
	rp := func(addr string, kids []*fxDev) *fxDev {
		return &fxDev{addr: addr, vendor: 0x1022, device: 0x14ab, class: 0x060400, port: portRootPort,
			maxGen: 5, maxWidth: 16, curGen: 1, curWidth: 16, driver: "pcieport", kids: kids}
	}
	nv := &NVMLReadings{DriverVersion: "535.154.05", NVMLVersion: "12.535.154.05", CUDADriverVersion: 12020}
	for i, addr := range []string{"0000:01:00.0", "0000:41:00.0"} {
		nv.Devices = append(nv.Devices, NVMLDevice{
			Index: i, Name: "NVIDIA GeForce RTX 4090", UUID: fmt.Sprintf("GPU-1d4b7c22-8e0f-4a55-b1c3-00000000%04d", i),
			PCIBusID: addr, PCIDeviceID: "2684", PCISubsystemID: "10de:167c", VBIOS: "95.02.18.80.87",
			MemoryTotalBytes: u64(25757220864), MemoryUsedBytes: u64(4325376), ComputeCapability: "8.9",
			PowerUsageMW: u32(21000), PowerLimitMW: u32(450000), TemperatureC: u32(31), PerformanceState: intp(8),
			UtilizationGPU: u32(0), Persistence: boolp(true), ComputeMode: "Default",
			ClockEventReasons: u64(1), Throttle: decodeClockEventReasons(1),
			PCIeCurrentGen: intp(1), PCIeMaxGen: intp(4), PCIeCurrentWidth: intp(16), PCIeMaxWidth: intp(16), PCIeReplays: u64(0),
		})
	}
	return &fxMachine{
		name:      "consumer2-nop2p",
		hostname:  "ws-4090x2",
		kernel:    "6.1.0-18-amd64",
		arch:      "x86_64",
		osRelease: osRelease("debian", "12", "Debian GNU/Linux 12 (bookworm)"),
		cpuModel:  "AMD Ryzen Threadripper PRO 7975WX 32-Cores",
		threads:   64,
		memKB:     263749164,
		numaCPUs:  []string{"0-63"},
		numaMemKB: []uint64{263749164},
		roots: []fxRoot{
			{bus: "0000:00", numa: 0, devs: []*fxDev{{addr: "0000:00:00.0", vendor: 0x1022, device: 0x14a4, class: 0x060000}, rp("0000:00:01.1", gpu("0000:01:00.0", "0000:01:00.1"))}},
			{bus: "0000:40", numa: 0, devs: []*fxDev{rp("0000:40:01.1", gpu("0000:41:00.0", "0000:41:00.1"))}},
			{bus: "0000:20", numa: 0, devs: []*fxDev{{addr: "0000:20:01.2", vendor: 0x1022, device: 0x14ab, class: 0x060400, port: portRootPort,
				maxGen: 4, maxWidth: 4, curGen: 4, curWidth: 4, driver: "pcieport",
				kids: []*fxDev{{addr: "0000:21:00.0", vendor: 0x144d, device: 0xa80c, subVendor: 0x144d, subDevice: 0xa801, class: 0x010802,
					port: portEndpoint, maxGen: 4, maxWidth: 4, curGen: 4, curWidth: 4, driver: "nvme", nvme: "nvme0"}}}}},
		},
		files: map[string]string{
			"sys/module/nvidia/version":  "535.154.05\n",
			"proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.154.05  Release Build  (dvs-builder@U16-T02-35-3)  Thu Dec 28 18:44:45 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
		},
		nvml:      nv,
		cfgLimit:  64,
		collected: collectedAt,
		readme: `# consumer2-nop2p (derived fixture, not a recording)

A kiln record bundle written by discover/fixturegen_test.go in the exact
layout discover.Record produces. It was not recorded on a real machine: it
models an AMD Threadripper PRO workstation (one NUMA node, PCIe Gen5 root
ports) with two GeForce RTX 4090 (10de:2684), each directly on its own CPU
root port and root complex: 0000:00:01.1 -> 0000:01:00.0 and
0000:40:01.1 -> 0000:41:00.0 (each with its HDMI audio function .1). No
switch, no NVLink; nouveau is not loaded; the NVIDIA open kernel modules
535.154.05 are.

It was "recorded" as a non-root user: config files hold the first 64 bytes
only (ACS/AER unknown, port types inferred from the tree) and /dev/kmsg was
not readable (no kernel.log).

What a good audit reports:
* info: no GPU pair is closer than the host bridge: peer-to-peer between the
  two GPUs crosses root complexes (nvidia-smi topo -m would print SYS/NODE).
* must-not-flag: both GPUs at Gen1 x16 while idle (P8, 0 % utilization):
  power saving, not a bad link. Host max is Gen5, device max Gen4.
`,
	}
}

// h100HGX8: an 8x H100 SXM (HGX) server modelled on
// testdata/captures/lspci/h100-hgx-x8-lspci-vvv.txt.
func h100HGX8() *fxMachine {
	type unit struct {
		rp, up, nvmeDown, gpuDown, nicDown, nvme, gpu, nic string
		numa                                               int
		nvmeIf, ib                                         string
	}
	units := []unit{
		{"0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:17:01.0", "0000:17:02.0", "0000:18:00.0", "0000:19:00.0", "0000:1a:00.0", 0, "nvme0", "mlx5_0"},
		{"0000:37:01.0", "0000:38:00.0", "0000:39:00.0", "0000:39:01.0", "0000:39:02.0", "0000:3a:00.0", "0000:3b:00.0", "0000:3c:00.0", 0, "nvme1", "mlx5_1"},
		{"0000:48:01.0", "0000:49:00.0", "0000:4a:00.0", "0000:4a:01.0", "0000:4a:02.0", "0000:4b:00.0", "0000:4c:00.0", "0000:4d:00.0", 0, "nvme2", "mlx5_2"},
		{"0000:59:01.0", "0000:5a:00.0", "0000:5b:00.0", "0000:5b:01.0", "0000:5b:02.0", "0000:5c:00.0", "0000:5d:00.0", "0000:5e:00.0", 0, "nvme3", "mlx5_3"},
		{"0000:97:01.0", "0000:98:00.0", "0000:99:00.0", "0000:99:01.0", "0000:99:02.0", "0000:9a:00.0", "0000:9b:00.0", "0000:9c:00.0", 1, "nvme4", "mlx5_4"},
		{"0000:b7:01.0", "0000:b8:00.0", "0000:b9:00.0", "0000:b9:01.0", "0000:b9:02.0", "0000:ba:00.0", "0000:bb:00.0", "0000:bc:00.0", 1, "nvme5", "mlx5_5"},
		{"0000:c7:01.0", "0000:c8:00.0", "0000:c9:00.0", "0000:c9:01.0", "0000:c9:02.0", "0000:ca:00.0", "0000:cb:00.0", "0000:cc:00.0", 1, "nvme6", "mlx5_6"},
		{"0000:d7:01.0", "0000:d8:00.0", "0000:d9:00.0", "0000:d9:01.0", "0000:d9:02.0", "0000:da:00.0", "0000:db:00.0", "0000:dc:00.0", 1, "nvme7", "mlx5_7"},
	}
	sw := func(addr string, port, maxWidth, curGen, curWidth int, kid *fxDev) *fxDev {
		d := &fxDev{addr: addr, vendor: 0x1000, device: 0xc030, subVendor: 0x1028, subDevice: 0x224b, class: 0x060400,
			port: port, maxGen: 5, maxWidth: maxWidth, curGen: curGen, curWidth: curWidth, driver: "pcieport"}
		if port == portSwitchDown {
			d.acsCap = 0x005f
		}
		if kid != nil {
			d.kids = []*fxDev{kid}
		}
		return d
	}
	var roots []fxRoot
	for i, u := range units {
		gpu := &fxDev{addr: u.gpu, vendor: 0x10de, device: 0x2330, subVendor: 0x10de, subDevice: 0x16c1, class: 0x030200,
			port: portEndpoint, maxGen: 5, maxWidth: 16, curGen: 5, curWidth: 16, driver: "nvidia"}
		if i == 0 {
			// The capture shows CESta RxErr+ BadTLP+ Timeout+ on 19:00.0.
			gpu.aerCor = 1<<0 | 1<<6 | 1<<12
			gpu.aerCounts = map[string]uint64{"RxErr": 3, "BadTLP": 1, "Timeout": 1}
		}
		nvmeVendor, nvmeDevice := uint16(0x8086), uint16(0x0b60)
		if i < 2 {
			nvmeVendor, nvmeDevice = 0x1344, 0x51c3
		}
		nvme := &fxDev{addr: u.nvme, vendor: nvmeVendor, device: nvmeDevice, subVendor: 0x1028, subDevice: 0x2245, class: 0x010802,
			port: portEndpoint, maxGen: 4, maxWidth: 4, curGen: 4, curWidth: 4, driver: "nvme", nvme: u.nvmeIf}
		nic := &fxDev{addr: u.nic, vendor: 0x15b3, device: 0x1021, subVendor: 0x15b3, subDevice: 0x0041, class: 0x020000,
			port: portEndpoint, maxGen: 5, maxWidth: 16, curGen: 5, curWidth: 16, driver: "mlx5_core", ibIf: u.ib,
			netIf: fmt.Sprintf("ens%df0np0", 10+i)}
		mgmtBus := busOf(u.nvmeDown)
		mgmt := &fxDev{addr: fmt.Sprintf("0000:%02x:00.0", busOf(u.nic)+1+map[bool]int{true: 1, false: 0}[i == 0 || i == 4]),
			vendor: 0x1000, device: 0x00b2, subVendor: 0x1028, subDevice: 0x224b, class: 0x010700, port: portEndpoint,
			maxGen: 5, maxWidth: 1, curGen: 5, curWidth: 1}
		downs := []*fxDev{
			sw(u.nvmeDown, portSwitchDown, 4, 4, 4, nvme),
			sw(u.gpuDown, portSwitchDown, 16, 5, 16, gpu),
			sw(u.nicDown, portSwitchDown, 16, 5, 16, nic),
		}
		if i == 0 || i == 4 {
			// A ConnectX-6 Dx on the first switch of each socket.
			cx6 := fmt.Sprintf("0000:%02x:00", busOf(u.nic)+1)
			downs = append(downs, sw(fmt.Sprintf("0000:%02x:03.0", mgmtBus), portSwitchDown, 16, 4, 16,
				&fxDev{addr: cx6 + ".0", vendor: 0x15b3, device: 0x101d, subVendor: 0x15b3, subDevice: 0x0016, class: 0x020000,
					port: portEndpoint, maxGen: 4, maxWidth: 16, curGen: 4, curWidth: 16, driver: "mlx5_core", netIf: fmt.Sprintf("eno%dnp0", 1+i/4)}))
		}
		downs = append(downs, sw(fmt.Sprintf("0000:%02x:1f.0", mgmtBus), portSwitchDown, 1, 5, 1, mgmt))
		up := sw(u.up, portSwitchUp, 16, 5, 16, nil)
		up.kids = downs
		rp := &fxDev{addr: u.rp, vendor: 0x8086, device: 0x352a, class: 0x060400, port: portRootPort,
			maxGen: 5, maxWidth: 16, curGen: 5, curWidth: 16, acsCap: 0x005f, driver: "pcieport", kids: []*fxDev{up}}
		roots = append(roots, fxRoot{bus: fmt.Sprintf("0000:%02x", busOf(u.rp)), numa: u.numa, devs: []*fxDev{rp}})
	}
	// NVSwitches behind a Microchip/PMC-Sierra switch on root port 80:01.0.
	var nvsw []*fxDev
	for i := 0; i < 4; i++ {
		nvsw = append(nvsw, &fxDev{addr: fmt.Sprintf("0000:82:%02x.0", i), vendor: 0x11f8, device: 0x4128, class: 0x060400,
			port: portSwitchDown, maxGen: 4, maxWidth: 2, curGen: 4, curWidth: 2, driver: "pcieport",
			kids: []*fxDev{{addr: fmt.Sprintf("0000:%02x:00.0", 0x83+i), vendor: 0x10de, device: 0x22a3, subVendor: 0x10de, subDevice: 0x1796,
				class: 0x068000, port: portEndpoint, maxGen: 4, maxWidth: 2, curGen: 4, curWidth: 2, driver: "nvidia-nvswitch"}}})
	}
	roots = append(roots, fxRoot{bus: "0000:80", numa: 1, devs: []*fxDev{{addr: "0000:80:01.0", vendor: 0x8086, device: 0x352a, class: 0x060400,
		port: portRootPort, maxGen: 4, maxWidth: 16, curGen: 4, curWidth: 2, acsCap: 0x005f, driver: "pcieport",
		kids: []*fxDev{{addr: "0000:81:00.0", vendor: 0x11f8, device: 0x4128, class: 0x060400, port: portSwitchUp,
			maxGen: 4, maxWidth: 2, curGen: 4, curWidth: 2, driver: "pcieport", kids: nvsw}}}}})
	roots = append(roots, fxRoot{bus: "0000:00", numa: 0, devs: []*fxDev{
		{addr: "0000:00:00.0", vendor: 0x8086, device: 0x09a2, class: 0x088000},
		{addr: "0000:00:1c.0", vendor: 0x8086, device: 0x1bbc, class: 0x060400, port: portRootPort, maxGen: 3, maxWidth: 1, curGen: 3, curWidth: 1, driver: "pcieport",
			kids: []*fxDev{
				{addr: "0000:01:00.0", vendor: 0x14e4, device: 0x165f, subVendor: 0x1028, subDevice: 0x0b1d, class: 0x020000, port: portEndpoint,
					maxGen: 2, maxWidth: 1, curGen: 2, curWidth: 1, driver: "tg3", netIf: "eno8303"},
				{addr: "0000:01:00.1", vendor: 0x14e4, device: 0x165f, subVendor: 0x1028, subDevice: 0x0b1d, class: 0x020000, port: portEndpoint,
					maxGen: 2, maxWidth: 1, curGen: 2, curWidth: 1, driver: "tg3", netIf: "eno8403"},
			}},
		{addr: "0000:00:1c.4", vendor: 0x8086, device: 0x1bbe, class: 0x060400, port: portRootPort, maxGen: 2, maxWidth: 1, curGen: 2, curWidth: 1, driver: "pcieport",
			kids: []*fxDev{{addr: "0000:02:00.0", vendor: 0x1556, device: 0xbe00, class: 0x060400, kids: []*fxDev{
				{addr: "0000:03:00.0", vendor: 0x102b, device: 0x0536, subVendor: 0x1028, subDevice: 0x0b1d, class: 0x030000, driver: "mgag200"}}}}},
	}})
	// NVML readings: 18 active NVLinks per GPU into the four NVSwitches,
	// fabric registration complete, GPUs idle.
	nv := &NVMLReadings{DriverVersion: "535.183.01", NVMLVersion: "12.535.183.01", CUDADriverVersion: 12020}
	for i, u := range units {
		d := NVMLDevice{
			Index: i, Name: "NVIDIA H100 80GB HBM3", UUID: fmt.Sprintf("GPU-6a1f3e0c-52b7-4c0e-9d11-0000000000%02d", i),
			Serial: fmt.Sprintf("16521230%05d", 4100+i), BoardPartNumber: "692-2G520-0200-000",
			PCIBusID: u.gpu, PCIDeviceID: "2330", PCISubsystemID: "10de:16c1", VBIOS: "96.00.74.00.01",
			InfoROMImage: "G520.0200.00.05", InfoROMValid: boolp(true),
			MemoryTotalBytes: u64(85520809984), MemoryUsedBytes: u64(0), ComputeCapability: "9.0",
			PowerUsageMW: u32(71000), PowerLimitMW: u32(700000), DefaultPowerLimitMW: u32(700000), EnforcedPowerLimitMW: u32(700000),
			TemperatureC: u32(32), SlowdownC: u32(90), ShutdownC: u32(92), PerformanceState: intp(0),
			UtilizationGPU: u32(0), Persistence: boolp(true), ComputeMode: "Default",
			// Idle clocks and their maxima as the HGX H100 capture
			// (nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt) shows.
			Clocks: &NVMLClocks{GraphicsMHz: u32(345), SMMHz: u32(345), MemoryMHz: u32(2619),
				MaxGraphicsMHz: u32(1980), MaxSMMHz: u32(1980), MaxMemoryMHz: u32(2619)},
			// An idle H100's profiling counters, as the agent's sampler reads
			// them between two samples, and its energy counter.
			Activity:   &NVMLActivity{GraphicsPercent: f64p(0), SMPercent: f64p(0), TensorPercent: f64p(0), DRAMPercent: f64p(0)},
			EnergyMJ:   u64(uint64(86_400_000_000 + 1_000_000*i)),
			ECCEnabled: boolp(true), ECCPending: boolp(true), ECCVolatileCorrected: u64(0), ECCVolatileUncorrected: u64(0),
			ECCAggregateCorrected: u64(0), ECCAggregateUncorrected: u64(0),
			RemappedRows:      &NVMLRemappedRows{},
			ClockEventReasons: u64(1), Throttle: decodeClockEventReasons(1),
			PCIeCurrentGen: intp(5), PCIeMaxGen: intp(5), PCIeCurrentWidth: intp(16), PCIeMaxWidth: intp(16), PCIeReplays: u64(0),
			MIGEnabled: boolp(false), MIGPending: boolp(false),
			Fabric:   &NVMLFabric{State: "Completed", Status: "Success"},
			NUMANode: intp(u.numa),
		}
		for l := 0; l < 18; l++ {
			d.NVLinks = append(d.NVLinks, NVMLLink{Link: l, Active: true, Version: 4, RemotePCI: fmt.Sprintf("0000:%02x:00.0", 0x83+l%4), RemoteType: "nvswitch",
				Errors: &NVMLLinkErrors{}, TxKiB: u64(0), RxKiB: u64(0)})
		}
		nv.Devices = append(nv.Devices, d)
	}
	return &fxMachine{
		nvml:      nv,
		name:      "h100-hgx8-sysfs",
		hostname:  "hgx-h100-03",
		kernel:    "5.15.0-105-generic",
		osRelease: osRelease("ubuntu", "22.04", "Ubuntu 22.04.4 LTS"),
		cpuModel:  "Intel(R) Xeon(R) Platinum 8480+",
		threads:   224,
		memKB:     2113389568,
		numaCPUs:  []string{"0-55,112-167", "56-111,168-223"},
		numaMemKB: []uint64{1056694784, 1056694784},
		roots:     roots,
		files: map[string]string{
			"sys/module/nvidia/version":         "535.183.01\n",
			"sys/module/nvidia_uvm/version":     "535.183.01\n",
			"sys/module/nvidia_modeset/version": "535.183.01\n",
			"proc/driver/nvidia/version":        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\nGCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n",
			"usr/bin/nv-fabricmanager":          "",
			"usr/local/cuda-12.2/version.json":  cudaVersionJSON("12.2.140"),
		},
		links:     map[string]string{"usr/local/cuda": "/usr/local/cuda-12.2"},
		procs:     map[int]string{1: "systemd", 2217: "nv-fabricmanager", 2301: "nvidia-persiste"},
		kmsg:      []string{"6,1402,10402113,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024"},
		collected: collectedAt,
		readme: `# h100-hgx8-sysfs (derived fixture, not a recording)

A kiln record bundle written by discover/fixturegen_test.go in the exact
layout discover.Record produces. It was not recorded on a real machine: its
PCIe tree is modelled on testdata/captures/lspci/h100-hgx-x8-lspci-vvv.txt
(a Dell 8x H100 SXM5 HGX server, dual Xeon Platinum 8480+): eight Intel root
ports (15/37/48/59:01.0 on NUMA 0, 97/b7/c7/d7:01.0 on NUMA 1), each with a
Broadcom PEX890xx Gen5 switch holding one NVMe drive, one H100 (19, 3b, 4c,
5d, 9b, bb, cb, db:00.0), one ConnectX-7 and the switch management
endpoint; ConnectX-6 Dx NICs on the first switch of each socket; four
NVSwitches (83-86:00.0) behind a Microchip switch on root port 80:01.0
(Gen4 x2, as in the capture); onboard Broadcom NICs and a Matrox BMC VGA.

Differences from the capture: the switch device id (1000:c030) and the
NVMe/NIC subsystem ids are illustrative; the Gen4 NVMe drives run Gen4 x4 on
Gen5 switch ports as the capture's 17:00.0 does; GPU 0000:19:00.0 carries the capture's
AER correctable status (RxErr, BadTLP, Timeout). The fabric manager is
installed and running. nvml.json holds idle readings (clocks as in the HGX H100
nvidia-smi -q capture; idle GPM activity and an energy counter, as the agent's
sampler reads them): 18 active NVLinks per
GPU into the NVSwitches and the fabric registered (Completed/Success). It
serves BenchmarkDiscoverRecorded8GPU.
`,
	}
}

// TestFixtureConfigParses checks the generator's config spaces against the
// parser, so that a fixture cannot drift from the register layout.
func TestFixtureConfigParses(t *testing.T) {
	d := &fxDev{vendor: 0x1000, device: 0xc010, class: 0x060400, port: portSwitchDown, maxGen: 4, maxWidth: 16, curGen: 4, curWidth: 8,
		acsCap: acsCapSwitch, acsCtl: acsCtlLinux, aerCor: 0xc1}
	c, err := ParsePCIConfig(d.config())
	if err != nil {
		t.Fatal(err)
	}
	if c.PortType != portSwitchDown || c.MaxGen != 4 || c.CurWidth != 8 || c.ACS == nil || !c.ACS.ReqRedir || c.AER == nil {
		t.Fatalf("config round trip: %+v", c)
	}
	if !bytes.Equal(d.config(), d.config()) {
		t.Fatal("config is not deterministic")
	}
}

func f64p(v float64) *float64 { return &v }
