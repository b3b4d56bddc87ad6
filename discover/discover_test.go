package discover

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/snapshot"
)

func replayFixture(t testing.TB, name string) *snapshot.Snapshot {
	t.Helper()
	dir := filepath.Join(fixturesDir, name)
	if !IsBundle(dir) {
		t.Fatalf("%s is not a record bundle", dir)
	}
	s, err := Replay(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func gpuAt(t *testing.T, s *snapshot.Snapshot, addr string) snapshot.GPU {
	t.Helper()
	for _, g := range s.GPUs {
		if g.PCIAddress == addr {
			return g
		}
	}
	t.Fatalf("no GPU %s", addr)
	return snapshot.GPU{}
}

func pciAt(t *testing.T, s *snapshot.Snapshot, addr string) snapshot.PCIDevice {
	t.Helper()
	for _, d := range s.PCI {
		if d.Address == addr {
			return d
		}
	}
	t.Fatalf("no PCI device %s", addr)
	return snapshot.PCIDevice{}
}

func countKinds(s *snapshot.Snapshot) map[string]int {
	out := map[string]int{}
	for _, d := range s.PCI {
		out[d.Kind]++
	}
	return out
}

func TestReplayPCIe4DowntrainedACS(t *testing.T) {
	s := replayFixture(t, "pcie4-downtrained-acs")
	if len(s.GPUs) != 4 {
		t.Fatalf("GPUs = %d, want 4", len(s.GPUs))
	}
	want := map[string]int{"gpu": 4, "nic": 2, "nvme": 1, "root-port": 4, "switch-upstream": 2, "switch-downstream": 5}
	if got := countKinds(s); !reflect.DeepEqual(got, want) {
		t.Errorf("PCI kinds = %v, want %v (the ASPEED VGA and the host bridge must not be kept)", got, want)
	}

	g := gpuAt(t, s, "0000:41:00.0")
	if g.Index != 0 || g.Vendor != snapshot.VendorNVIDIA || g.DeviceID != "26b9" || g.SubsystemID != "10de:1851" {
		t.Errorf("GPU 41: index %d vendor %q device %q subsystem %q", g.Index, g.Vendor, g.DeviceID, g.SubsystemID)
	}
	if g.PCIe == nil || g.PCIe.CurrentGen != 4 || g.PCIe.CurrentWidth != 8 || g.PCIe.MaxGen != 4 || g.PCIe.MaxWidth != 16 || g.PCIe.HostMaxGen != 4 {
		t.Errorf("GPU 41 link = %+v, want Gen4 x8 of Gen4 x16, host max Gen4", g.PCIe)
	}
	if g.PCIe == nil || g.PCIe.Replays == nil || *g.PCIe.Replays != 1843 {
		t.Errorf("GPU 41 replays from nvml.json: %+v", g.PCIe)
	}
	if g.UtilizationGPU == nil || *g.UtilizationGPU != 90 {
		t.Errorf("GPU 41 utilization = %v, want 90 from nvml.json", g.UtilizationGPU)
	}
	if want := []string{"0000:40:00.0", "0000:3f:00.0", "0000:3e:02.0"}; !reflect.DeepEqual(g.Upstream, want) {
		t.Errorf("GPU 41 upstream = %v, want %v", g.Upstream, want)
	}
	if g.NUMANode == nil || *g.NUMANode != 0 || g.CPUAffinity != "0-31,64-95" {
		t.Errorf("GPU 41 NUMA %v CPUs %q", g.NUMANode, g.CPUAffinity)
	}
	if g2 := gpuAt(t, s, "0000:c2:00.0"); g2.NUMANode == nil || *g2.NUMANode != 1 || g2.PCIe.CurrentWidth != 16 {
		t.Errorf("GPU c2: NUMA %v link %+v", g2.NUMANode, g2.PCIe)
	}

	for addr, kind := range map[string]string{"0000:3e:02.0": "root-port", "0000:3f:00.0": "switch-upstream", "0000:40:00.0": "switch-downstream"} {
		if d := pciAt(t, s, addr); d.Kind != kind {
			t.Errorf("%s kind = %q, want %q", addr, d.Kind, kind)
		}
	}
	dp := pciAt(t, s, "0000:40:00.0")
	if dp.ACS == nil || !dp.ACS.ReqRedir || !dp.ACS.CmpltRedir || !dp.ACS.SrcValid || !dp.ACS.UpstreamFwd || dp.ACS.DirectTrans || dp.ACS.EgressCtrl {
		t.Errorf("downstream port 40:00.0 ACS = %+v, want SrcValid ReqRedir CmpltRedir UpstreamFwd", dp.ACS)
	}
	if dp.Parent != "0000:3f:00.0" || dp.Link == nil || dp.Link.CurrentWidth != 8 || dp.Link.MaxWidth != 16 {
		t.Errorf("downstream port 40:00.0 parent %q link %+v", dp.Parent, dp.Link)
	}
	gd := pciAt(t, s, "0000:41:00.0")
	if gd.AER == nil || !reflect.DeepEqual(gd.AER.Correctable, []string{"RxErr", "BadTLP", "BadDLLP"}) ||
		gd.AER.Counts["correctable/RxErr"] != 212 || gd.AER.Counts["correctable/TOTAL_ERR_COR"] != 258 {
		t.Errorf("GPU 41 AER = %+v", gd.AER)
	}
	if gd.Driver != "nvidia" {
		t.Errorf("GPU 41 driver = %q", gd.Driver)
	}
	nic := pciAt(t, s, "0000:43:00.0")
	if nic.Kind != "nic" || nic.Class != "020700" || nic.Interface != "mlx5_0" || nic.Parent != "0000:40:02.0" || nic.NUMANode == nil || *nic.NUMANode != 0 {
		t.Errorf("IB NIC = %+v", nic)
	}
	if d := pciAt(t, s, "0000:01:00.0"); d.Interface != "eno1" || d.Driver != "ixgbe" {
		t.Errorf("onboard NIC = %+v", d)
	}
	if d := pciAt(t, s, "0000:17:00.0"); d.Kind != "nvme" || d.Interface != "nvme0n1" {
		t.Errorf("NVMe = %+v", d)
	}

	h := s.Host
	if h.Hostname != "gpu-pcie-07" || h.OS != "ubuntu" || h.OSVersion != "22.04" || h.Kernel != "5.15.0-112-generic" || h.Arch != "x86_64" ||
		h.CPUs != 128 || h.CPUModel != "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz" || h.MemoryBytes != 527958280*1024 ||
		len(h.NUMANodes) != 2 || h.NUMANodes[1].CPUs != "32-63,96-127" || h.CPUSet != "0-127" || h.OnlineCPUs != "0-127" {
		t.Errorf("host = %+v", h)
	}
	d := s.Drivers
	if d.NVIDIAKernel != "550.90.07" || d.NVIDIAOpenKernel == nil || *d.NVIDIAOpenKernel || d.NouveauLoaded == nil || *d.NouveauLoaded ||
		d.CUDADriver != "12.4" || len(d.Toolkits) != 1 || d.Toolkits[0].Version != "12.4.131" {
		t.Errorf("drivers = %+v", d)
	}
	var aer int
	for _, e := range s.Events {
		if e.Kind == snapshot.EventAER && e.Device == "0000:41:00.0" {
			aer++
		}
	}
	if aer == 0 {
		t.Errorf("no AER event for 0000:41:00.0 from kernel.log: %+v", s.Events)
	}
	for _, n := range s.Notes {
		t.Errorf("unexpected note: %+v", n)
	}
}

func TestReplayConsumer2NoP2P(t *testing.T) {
	s := replayFixture(t, "consumer2-nop2p")
	if len(s.GPUs) != 2 {
		t.Fatalf("GPUs = %d, want 2 (the HDMI audio functions are not GPUs)", len(s.GPUs))
	}
	for _, addr := range []string{"0000:01:00.0", "0000:41:00.0"} {
		g := gpuAt(t, s, addr)
		if len(g.Upstream) != 1 {
			t.Errorf("%s upstream = %v, want one root port", addr, g.Upstream)
			continue
		}
		rp := pciAt(t, s, g.Upstream[0])
		// Only 64 bytes of config space: the kind comes from the tree.
		if rp.Kind != snapshot.KindRootPort || rp.ACS != nil || rp.Parent != "" {
			t.Errorf("%s root port = %+v", addr, rp)
		}
		if g.PCIe == nil || g.PCIe.CurrentGen != 1 || g.PCIe.MaxGen != 4 || g.PCIe.HostMaxGen != 5 {
			t.Errorf("%s link = %+v, want Gen1 (idle) of Gen4, host Gen5", addr, g.PCIe)
		}
	}
	if a, b := gpuAt(t, s, "0000:01:00.0").Upstream[0], gpuAt(t, s, "0000:41:00.0").Upstream[0]; a == b {
		t.Errorf("both GPUs on root port %s", a)
	}
	if d := s.Drivers; d.NouveauLoaded == nil || *d.NouveauLoaded || d.NVIDIAOpenKernel == nil || !*d.NVIDIAOpenKernel {
		t.Errorf("drivers = %+v", d)
	}
	var short, nolog bool
	for _, n := range s.Notes {
		short = short || strings.Contains(n.Message, "readable only in part")
		nolog = nolog || n.Source == "kmsg"
	}
	if !short {
		t.Errorf("no note about the 64-byte config space: %+v", s.Notes)
	}
	if nolog {
		t.Errorf("a bundle without kernel.log must not try to read one: %+v", s.Notes)
	}
}

func TestReplayH100HGX8(t *testing.T) {
	s := replayFixture(t, "h100-hgx8-sysfs")
	want := map[string]int{"gpu": 8, "nvswitch": 4, "nic": 12, "nvme": 8, "root-port": 10, "switch-upstream": 9, "switch-downstream": 30}
	if got := countKinds(s); !reflect.DeepEqual(got, want) {
		t.Errorf("PCI kinds = %v, want %v", got, want)
	}
	// Each GPU shares its PEX890xx switch with one ConnectX-7.
	for _, g := range s.GPUs {
		if len(g.Upstream) != 3 || g.Model != "H100-SXM5-80GB" {
			t.Errorf("%s: upstream %v model %q", g.PCIAddress, g.Upstream, g.Model)
			continue
		}
		sw := g.Upstream[1]
		nics := 0
		for _, d := range s.PCI {
			if d.Kind == snapshot.KindNIC && d.Parent != "" && pciAt(t, s, d.Parent).Parent == sw && d.DeviceID == "1021" {
				nics++
			}
		}
		if nics != 1 {
			t.Errorf("%s: %d ConnectX-7 under switch %s, want 1", g.PCIAddress, nics, sw)
		}
	}
	if g := gpuAt(t, s, "0000:9b:00.0"); g.NUMANode == nil || *g.NUMANode != 1 {
		t.Errorf("GPU 9b NUMA = %v", g.NUMANode)
	}
	if d := pciAt(t, s, "0000:19:00.0"); d.AER == nil || !reflect.DeepEqual(d.AER.Correctable, []string{"RxErr", "BadTLP", "Timeout"}) {
		t.Errorf("GPU 19 AER = %+v", d.AER)
	}
	if d := pciAt(t, s, "0000:17:00.0"); d.Link == nil || d.Link.CurrentGen != 4 || d.Link.MaxGen != 5 {
		t.Errorf("NVMe port 17:00.0 link = %+v", d.Link)
	}
	if fm := s.Drivers.FabricManager; fm == nil || fm.Installed == nil || !*fm.Installed || fm.Running == nil || !*fm.Running {
		t.Errorf("fabric manager = %+v", fm)
	}
	if d := pciAt(t, s, "0000:86:00.0"); d.Kind != snapshot.KindNVSwitch || d.Driver != "nvidia-nvswitch" || d.Parent != "0000:82:03.0" {
		t.Errorf("NVSwitch = %+v", d)
	}
}

// comparable drops what differs between a run and its replay by design:
// where the data came from.
func comparable(t *testing.T, s *snapshot.Snapshot) string {
	t.Helper()
	c := *s
	c.Sources, c.Notes = nil, nil
	b, err := json.MarshalIndent(&c, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRecordReplayRoundTrip(t *testing.T) {
	for _, m := range fixtures() {
		t.Run(m.name, func(t *testing.T) {
			root := t.TempDir()
			m.writeTree(t, root)
			opts := Options{Root: root, SkipNVML: true, nvml: m.nvml, collected: m.collected, arch: "x86_64"}
			live, err := Run(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "bundle")
			if err := Record(context.Background(), opts, dir); err != nil {
				t.Fatal(err)
			}
			if !IsBundle(dir) {
				t.Fatal("IsBundle = false on a fresh recording")
			}
			back, err := Replay(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if a, b := comparable(t, live), comparable(t, back); a != b {
				t.Errorf("replay differs from the run:\n%s", firstDiff(a, b))
			}
			if len(live.GPUs) == 0 {
				t.Error("no GPUs found")
			}
		})
	}
}

func TestIsBundle(t *testing.T) {
	if IsBundle(t.TempDir()) {
		t.Error("an empty directory is not a bundle")
	}
	if IsBundle("../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie") {
		t.Error("a KFD capture is not a bundle")
	}
	if _, err := Replay(context.Background(), t.TempDir()); err == nil {
		t.Error("Replay of an empty directory must fail")
	}
}

func TestRunMissingPieces(t *testing.T) {
	s, err := Run(context.Background(), Options{Root: t.TempDir(), SkipNVML: true})
	if err != nil {
		t.Fatalf("an empty root is not an error: %v", err)
	}
	if len(s.GPUs) != 0 || s.GPUs == nil {
		t.Errorf("GPUs = %#v, want an empty list", s.GPUs)
	}
	var msgs []string
	for _, n := range s.Notes {
		msgs = append(msgs, n.Message)
	}
	all := strings.Join(msgs, "\n")
	for _, want := range []string{"PCI devices unknown", "kernel log not read"} {
		if !strings.Contains(all, want) {
			t.Errorf("notes lack %q:\n%s", want, all)
		}
	}

	// A GPU without its driver.
	m := consumer2NoP2P()
	m.files = map[string]string{"sys/module/snd_hda_intel/uevent": ""}
	root := t.TempDir()
	m.writeTree(t, root)
	s, err = Run(context.Background(), Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	msgs = msgs[:0]
	for _, n := range s.Notes {
		msgs = append(msgs, n.Source+": "+n.Message)
	}
	all = strings.Join(msgs, "\n")
	for _, want := range []string{"no NVIDIA driver loaded: /sys/module/nvidia absent", "NVML not queried"} {
		if !strings.Contains(all, want) {
			t.Errorf("notes lack %q:\n%s", want, all)
		}
	}
}

func TestAMDGPU(t *testing.T) {
	hw := "hwmon/hwmon4/"
	m := consumer2NoP2P()
	m.nvml = nil
	m.files = map[string]string{"sys/module/amdgpu/uevent": "", "opt/rocm/.info/version": "6.1.2-119\n"}
	m.roots = m.roots[:1]
	m.roots[0].devs = []*fxDev{{addr: "0000:00:01.1", vendor: 0x1022, device: 0x14ab, class: 0x060400, port: portRootPort,
		maxGen: 4, maxWidth: 16, curGen: 4, curWidth: 16, driver: "pcieport",
		kids: []*fxDev{{addr: "0000:03:00.0", vendor: 0x1002, device: 0x740f, subVendor: 0x1002, subDevice: 0x0c34, class: 0x038000,
			port: portEndpoint, maxGen: 4, maxWidth: 16, curGen: 4, curWidth: 16, driver: "amdgpu",
			files: map[string]string{
				"mem_info_vram_total": "68702699520\n", "mem_info_vram_used": "11182080\n", "vbios_version": "113-D67301-063\n",
				"unique_id": "c1a3b2d4e5f60718\n", "serial_number": "692235000123\n", "product_name": "Instinct MI210\n",
				"gpu_busy_percent": "37\n", "pcie_replay_count": "2\n", "numa_node": "-1\n",
				hw + "temp1_input": "34000\n", hw + "temp1_label": "edge\n", hw + "temp1_crit": "100000\n",
				hw + "temp2_input": "38000\n", hw + "temp2_label": "junction\n",
				hw + "temp3_input": "45000\n", hw + "temp3_label": "mem\n",
				hw + "power1_average": "43000000\n", hw + "power1_cap": "300000000\n", hw + "power1_cap_max": "300000000\n",
			}}}}}
	root := t.TempDir()
	m.writeTree(t, root)
	s, err := Run(context.Background(), Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 1 {
		t.Fatalf("GPUs = %d", len(s.GPUs))
	}
	g := s.GPUs[0]
	if g.Vendor != snapshot.VendorAMD || g.Model != "Instinct MI210" || g.MemoryTotalBytes != 68702699520 || g.MemoryUsedBytes != 11182080 ||
		g.VBIOS != "113-D67301-063" || g.UUID != "c1a3b2d4e5f60718" || g.Serial != "692235000123" {
		t.Errorf("AMD GPU = %+v", g)
	}
	if g.NUMANode == nil || *g.NUMANode != -1 {
		t.Errorf("numa_node -1 must be kept as -1 (platform reports no affinity), got %v", g.NUMANode)
	}
	if g.UtilizationGPU == nil || *g.UtilizationGPU != 37 || g.PCIe == nil || g.PCIe.Replays == nil || *g.PCIe.Replays != 2 || g.PCIe.CurrentWidth != 16 {
		t.Errorf("AMD utilization %v link %+v", g.UtilizationGPU, g.PCIe)
	}
	if tc := g.Temperature; tc == nil || *tc.EdgeC != 34 || *tc.JunctionC != 38 || *tc.MemoryC != 45 || *tc.CriticalC != 100 {
		t.Errorf("AMD temperatures = %+v", tc)
	}
	if p := g.Power; p == nil || *p.DrawW != 43 || *p.LimitW != 300 {
		t.Errorf("AMD power = %+v", p)
	}
	if s.Drivers.ROCm != "6.1.2-119" {
		t.Errorf("ROCm = %q", s.Drivers.ROCm)
	}
	var kfdNote bool
	for _, n := range s.Notes {
		kfdNote = kfdNote || n.Source == "kfd"
	}
	if !kfdNote {
		t.Errorf("no note about the missing KFD topology: %+v", s.Notes)
	}
}

func TestKFDMerged(t *testing.T) {
	// The MI210 KFD capture placed where the driver publishes it.
	root := t.TempDir()
	src := "../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie"
	dst := filepath.Join(root, filepath.FromSlash(kfdTopology))
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	s, err := Run(context.Background(), Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 8 {
		t.Fatalf("GPUs from KFD = %d, want 8", len(s.GPUs))
	}
	xgmi := 0
	for _, l := range s.Links {
		if l.Kind == snapshot.LinkXGMI {
			xgmi++
		}
	}
	if xgmi == 0 {
		t.Error("no xGMI links merged from the KFD topology")
	}
	// Recording keeps the topology so that a replay sees it too.
	dir := filepath.Join(t.TempDir(), "b")
	if err := Record(context.Background(), Options{Root: root}, dir); err != nil {
		t.Fatal(err)
	}
	back, err := Replay(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.GPUs) != 8 || len(back.Links) != len(s.Links) {
		t.Errorf("replay: %d GPUs %d links, want 8 and %d", len(back.GPUs), len(back.Links), len(s.Links))
	}
}

func TestLiveKernelLogDoesNotBlock(t *testing.T) {
	if _, err := os.Stat("/dev/kmsg"); err != nil {
		t.Skip("no /dev/kmsg")
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := readKernelLog(Options{}, &reader{root: "/"})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil && !strings.Contains(err.Error(), "kernel log not read") {
			t.Errorf("error not worded for a user: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("reading /dev/kmsg blocked")
	}
}

func BenchmarkDiscoverRecorded8GPU(b *testing.B) {
	dir := filepath.Join(fixturesDir, "h100-hgx8-sysfs")
	ctx := context.Background()
	for b.Loop() {
		s, err := Replay(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		if len(s.GPUs) != 8 {
			b.Fatalf("GPUs = %d", len(s.GPUs))
		}
	}
}
