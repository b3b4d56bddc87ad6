package capture

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

const lspciCaptures = "../testdata/captures/"

func lspciReadCapture(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(lspciCaptures, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func lspciParseCapture(t testing.TB, rel string) *snapshot.Snapshot {
	t.Helper()
	s, err := ParseLspci(lspciReadCapture(t, rel))
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return s
}

func lspciDevice(t *testing.T, s *snapshot.Snapshot, addr string) snapshot.PCIDevice {
	t.Helper()
	for _, d := range s.PCI {
		if d.Address == addr {
			return d
		}
	}
	t.Fatalf("no PCI function %s", addr)
	return snapshot.PCIDevice{}
}

func lspciKinds(s *snapshot.Snapshot) map[string]int {
	m := map[string]int{}
	for _, d := range s.PCI {
		m[d.Kind]++
	}
	return m
}

func lspciGPUAddrs(s *snapshot.Snapshot) []string {
	var a []string
	for _, g := range s.GPUs {
		a = append(a, g.PCIAddress)
	}
	return a
}

func TestLspciH100VVV(t *testing.T) {
	s := lspciParseCapture(t, "lspci/h100-hgx-x8-lspci-vvv.txt")
	if len(s.PCI) != 517 {
		t.Errorf("got %d PCI functions, want 517", len(s.PCI))
	}
	k := lspciKinds(s)
	for kind, want := range map[string]int{
		snapshot.KindGPU: 8, snapshot.KindNVSwitch: 4, snapshot.KindNIC: 14, snapshot.KindNVMe: 8,
		snapshot.KindRootPort: 11, snapshot.KindSwitchUp: 9, snapshot.KindSwitchDown: 38,
		snapshot.KindHostBridge: 3, snapshot.KindBridge: 1,
	} {
		if k[kind] != want {
			t.Errorf("%d functions of kind %s, want %d (all kinds: %v)", k[kind], kind, want, k)
		}
	}
	wantGPUs := []string{"0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0", "0000:9b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0"}
	if got := lspciGPUAddrs(s); !reflect.DeepEqual(got, wantGPUs) {
		t.Fatalf("GPUs %v, want %v", got, wantGPUs)
	}
	full := snapshot.PCIeLink{CurrentGen: 5, MaxGen: 5, CurrentWidth: 16, MaxWidth: 16}
	for i, g := range s.GPUs {
		if g.Index != i || g.Vendor != snapshot.VendorNVIDIA || g.DeviceID != "2330" || g.SubsystemID != "10de:16c1" {
			t.Errorf("GPU %s: index %d vendor %q device %q subsystem %q", g.PCIAddress, g.Index, g.Vendor, g.DeviceID, g.SubsystemID)
		}
		if g.Model != "" {
			t.Errorf("GPU %s: model %q, want none (lspci printed only \"Device 2330\")", g.PCIAddress, g.Model)
		}
		if g.PCIe == nil || *g.PCIe != full {
			t.Errorf("GPU %s: PCIe %+v, want Gen5 x16 of Gen5 x16", g.PCIAddress, g.PCIe)
		}
		wantNUMA := 0
		if i >= 4 {
			wantNUMA = 1
		}
		if g.NUMANode == nil || *g.NUMANode != wantNUMA {
			t.Errorf("GPU %s: NUMA %v, want %d", g.PCIAddress, g.NUMANode, wantNUMA)
		}
		if len(g.Upstream) != 3 {
			t.Errorf("GPU %s: upstream %v, want 3 bridges", g.PCIAddress, g.Upstream)
		}
	}
	if got, want := s.GPUs[0].Upstream, []string{"0000:17:01.0", "0000:16:00.0", "0000:15:01.0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("GPU 0000:19:00.0 upstream %v, want %v", got, want)
	}

	gpu := lspciDevice(t, s, "0000:19:00.0")
	if gpu.Kind != snapshot.KindGPU || gpu.VendorID != "10de" || gpu.Class != "0302" || gpu.Driver != "nvidia" ||
		gpu.Parent != "0000:17:01.0" || gpu.Name != "NVIDIA Corporation Device 2330" {
		t.Errorf("0000:19:00.0 = %+v", gpu)
	}
	if gpu.AER == nil || !reflect.DeepEqual(gpu.AER.Correctable, []string{"RxErr", "BadTLP", "Timeout"}) || len(gpu.AER.Uncorrectable) != 0 {
		t.Errorf("0000:19:00.0 AER %+v, want correctable RxErr BadTLP Timeout", gpu.AER)
	}
	g3b := lspciDevice(t, s, "0000:3b:00.0")
	if g3b.AER == nil || !reflect.DeepEqual(g3b.AER.Correctable, []string{"RxErr", "BadTLP", "BadDLLP"}) || len(g3b.AER.Uncorrectable) != 0 {
		t.Errorf("0000:3b:00.0 AER %+v, want correctable RxErr BadTLP BadDLLP", g3b.AER)
	}
	if d := lspciDevice(t, s, "0000:4a:00.0"); d.AER == nil || !reflect.DeepEqual(d.AER.Uncorrectable, []string{"UnsupReq"}) {
		t.Errorf("0000:4a:00.0 AER %+v, want uncorrectable UnsupReq", d.AER)
	}

	// Switch downstream port to a Gen4 NVMe drive: 16GT/s (downgraded) of 32GT/s, x4.
	dp := lspciDevice(t, s, "0000:17:00.0")
	if dp.Kind != snapshot.KindSwitchDown || dp.Parent != "0000:16:00.0" || dp.Name != "Broadcom / LSI PEX890xx PCIe Gen 5 Switch" || dp.VendorID != "1000" {
		t.Errorf("0000:17:00.0 = %+v", dp)
	}
	if want := (snapshot.PCIeLink{CurrentGen: 4, MaxGen: 5, CurrentWidth: 4, MaxWidth: 4}); dp.Link == nil || *dp.Link != want {
		t.Errorf("0000:17:00.0 link %+v, want %+v", dp.Link, want)
	}
	if dp.ACS == nil || *dp.ACS != (snapshot.ACS{}) {
		t.Errorf("0000:17:00.0 ACS %+v, want present with every control bit off", dp.ACS)
	}
	if d := lspciDevice(t, s, "0000:18:00.0"); d.Kind != snapshot.KindNVMe || d.Parent != "0000:17:00.0" {
		t.Errorf("0000:18:00.0 = %+v", d)
	}
	if d := lspciDevice(t, s, "0000:17:03.0"); d.Link == nil || *d.Link != (snapshot.PCIeLink{CurrentGen: 4, MaxGen: 5, CurrentWidth: 16, MaxWidth: 16}) {
		t.Errorf("0000:17:03.0 link %+v, want Gen4 x16 of Gen5 x16", d.Link)
	}
	if d := lspciDevice(t, s, "0000:80:01.0"); d.Kind != snapshot.KindRootPort || d.Link == nil ||
		*d.Link != (snapshot.PCIeLink{CurrentGen: 4, MaxGen: 4, CurrentWidth: 2, MaxWidth: 16}) {
		t.Errorf("0000:80:01.0 = %+v link %+v, want root port Gen4 x2 of x16", d, d.Link)
	}
	rp := lspciDevice(t, s, "0000:00:0c.0")
	if rp.Kind != snapshot.KindRootPort || rp.Parent != "" || rp.Link == nil ||
		*rp.Link != (snapshot.PCIeLink{CurrentGen: 2, MaxGen: 3, CurrentWidth: 1, MaxWidth: 1}) {
		t.Errorf("0000:00:0c.0 = %+v link %+v", rp, rp.Link)
	}
	if rp.ACS == nil || *rp.ACS != (snapshot.ACS{SrcValid: true}) {
		t.Errorf("0000:00:0c.0 ACS %+v, want SrcValid only", rp.ACS)
	}
	if d := lspciDevice(t, s, "0000:16:00.0"); d.Kind != snapshot.KindSwitchUp || d.Parent != "0000:15:01.0" {
		t.Errorf("0000:16:00.0 = %+v", d)
	}
	if d := lspciDevice(t, s, "0000:15:01.0"); d.Kind != snapshot.KindRootPort || d.Parent != "" || d.VendorID != "8086" || d.DeviceID != "352a" {
		t.Errorf("0000:15:01.0 = %+v", d)
	}
	for _, a := range []string{"0000:83:00.0", "0000:84:00.0", "0000:85:00.0", "0000:86:00.0"} {
		d := lspciDevice(t, s, a)
		if d.Kind != snapshot.KindNVSwitch || d.DeviceID != "22a3" || d.Class != "0680" || d.Driver != "nvidia-nvswitch" || d.Parent == "" {
			t.Errorf("%s = %+v, want an NVSwitch below a bridge", a, d)
		}
	}
	if d := lspciDevice(t, s, "0000:1a:00.0"); d.Kind != snapshot.KindNIC || d.VendorID != "15b3" || d.Parent != "0000:17:02.0" {
		t.Errorf("0000:1a:00.0 = %+v", d)
	}
	if d := lspciDevice(t, s, "0000:03:00.0"); d.Kind != snapshot.KindOther || d.Class != "0300" || d.VendorID != "102b" {
		t.Errorf("Matrox BMC display 0000:03:00.0 = %+v, want kind other", d)
	}
	if d := lspciDevice(t, s, "0000:00:00.4"); d.Class != "0807" {
		t.Errorf("0000:00:00.4 class %q, want 0807 as printed", d.Class)
	}
	if len(s.Notes) != 0 {
		t.Errorf("notes: %v", s.Notes)
	}
}

func TestLspciAzureNN(t *testing.T) {
	s := lspciParseCapture(t, "lspci/azure-nd-a100-v4-lspci-nn.txt")
	if len(s.PCI) != 31 {
		t.Errorf("%d PCI functions, want 31", len(s.PCI))
	}
	k := lspciKinds(s)
	if k[snapshot.KindGPU] != 8 || k[snapshot.KindNVSwitch] != 6 || k[snapshot.KindNIC] != 9 || k[snapshot.KindNVMe] != 8 {
		t.Errorf("kinds %v, want 8 GPUs, 6 NVSwitches, 9 NICs, 8 NVMe", k)
	}
	want := []string{"0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0004:00:00.0", "000b:00:00.0", "000c:00:00.0", "000d:00:00.0", "000e:00:00.0"}
	if got := lspciGPUAddrs(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("GPUs %v, want %v", got, want)
	}
	for _, g := range s.GPUs {
		if g.Model != "GA100 [A100 SXM4 80GB]" || g.DeviceID != "20b2" || g.Vendor != snapshot.VendorNVIDIA || g.PCIe != nil || len(g.Upstream) != 0 {
			t.Errorf("GPU %+v", g)
		}
	}
	sw := lspciDevice(t, s, "000a:00:00.0")
	if sw.Kind != snapshot.KindNVSwitch || sw.VendorID != "10de" || sw.DeviceID != "1af1" || sw.Class != "0680" {
		t.Errorf("000a:00:00.0 = %+v", sw)
	}
	ib := lspciDevice(t, s, "0108:00:00.0")
	if ib.Kind != snapshot.KindNIC || ib.Class != "0207" || ib.DeviceID != "101c" || ib.Name != "Mellanox Technologies MT28908 Family [ConnectX-6 Virtual Function]" {
		t.Errorf("0108:00:00.0 = %+v", ib)
	}
	if d := lspciDevice(t, s, "f392:00:00.0"); d.Kind != snapshot.KindNVMe || d.VendorID != "1414" {
		t.Errorf("f392:00:00.0 = %+v", d)
	}
}

func TestLspciGB200Plain(t *testing.T) {
	s := lspciParseCapture(t, "lspci/gb200-lspci.txt")
	if len(s.PCI) != 87 {
		t.Errorf("%d PCI functions, want 87", len(s.PCI))
	}
	k := lspciKinds(s)
	if k[snapshot.KindGPU] != 4 || k[snapshot.KindNVSwitch] != 0 || k[snapshot.KindNIC] != 9 || k[snapshot.KindNVMe] != 9 || k[snapshot.KindBridge] != 61 {
		t.Errorf("kinds %v", k)
	}
	want := []string{"0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"}
	if got := lspciGPUAddrs(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("GPUs %v, want %v", got, want)
	}
	for _, g := range s.GPUs {
		if g.Vendor != snapshot.VendorNVIDIA || g.DeviceID != "2941" || g.Model != "" {
			t.Errorf("GPU %+v", g)
		}
	}
	if d := lspciDevice(t, s, "0008:00:00.0"); d.VendorID != "10de" || d.DeviceID != "22b1" || d.Class != "0604" || d.Kind != snapshot.KindBridge {
		t.Errorf("0008:00:00.0 = %+v", d)
	}
	if d := lspciDevice(t, s, "0005:07:00.0"); d.Kind != snapshot.KindOther || d.VendorID != "1a03" || d.Class != "0300" {
		t.Errorf("ASPEED display 0005:07:00.0 = %+v, want kind other", d)
	}
	if d := lspciDevice(t, s, "0006:03:00.0"); d.Kind != snapshot.KindNIC || d.Class != "0200" {
		t.Errorf("0006:03:00.0 = %+v", d)
	}
}

// A listing with -nn -k, a warning line, an NVIDIA audio function, an AMD
// accelerator and a numeric-only (-n) line.
const lspciMixed = `lspci: Unable to load libkmod resources: error -12
0000:01:00.0 VGA compatible controller [0300]: NVIDIA Corporation AD102 [GeForce RTX 4090] [10de:2684] (rev a1)
	Subsystem: ASUSTeK Computer Inc. Device [1043:889d]
	Kernel driver in use: nvidia
0000:01:00.1 Audio device [0403]: NVIDIA Corporation AD102 High Definition Audio Controller [10de:22ba] (rev a1)
	Kernel driver in use: snd_hda_intel
0000:83:00.0 Processing accelerators [1200]: Advanced Micro Devices, Inc. [AMD/ATI] Aqua Vanjaram [Instinct MI300X] [1002:74a1]
	Kernel driver in use: amdgpu
0000:84:00.0 Non-Volatile memory controller [0108]: Device [1e0f:0007] (rev 01)
85:00.0 0302: 10de:2330 (rev a1)
`

func TestLspciMixedListing(t *testing.T) {
	if !detectLspci("x", []byte(lspciMixed)) {
		t.Fatal("listing not detected")
	}
	s, err := ParseLspci([]byte(lspciMixed))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0000:01:00.0", "0000:83:00.0", "0000:85:00.0"}
	if got := lspciGPUAddrs(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("GPUs %v, want %v (audio is not a GPU)", got, want)
	}
	if g := s.GPUs[0]; g.Model != "AD102 [GeForce RTX 4090]" || g.SubsystemID != "1043:889d" || g.DeviceID != "2684" {
		t.Errorf("GPU 0 %+v", g)
	}
	if g := s.GPUs[1]; g.Vendor != snapshot.VendorAMD || g.Model != "Aqua Vanjaram [Instinct MI300X]" {
		t.Errorf("GPU 1 %+v", g)
	}
	if g := s.GPUs[2]; g.DeviceID != "2330" || g.Vendor != snapshot.VendorNVIDIA {
		t.Errorf("GPU 2 %+v", g)
	}
	if d := lspciDevice(t, s, "0000:01:00.1"); d.Kind != snapshot.KindOther || d.Class != "0403" || d.Driver != "snd_hda_intel" {
		t.Errorf("audio %+v", d)
	}
	if d := lspciDevice(t, s, "0000:84:00.0"); d.Kind != snapshot.KindNVMe || d.VendorID != "1e0f" || d.DeviceID != "0007" {
		t.Errorf("NVMe %+v", d)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, "libkmod") {
		t.Errorf("notes %v, want the lspci warning", s.Notes)
	}
}

// lspciTreeTV is drawn the way lspci -tv draws (pciutils ls-tree.c): three
// root buses, a PEX-style switch, NVSwitches below a PMC switch, -nn ids on
// the GPU.
const lspciTreeTV = `-+-[0000:80]-+-00.0  Intel Corporation Device 09a2
 |           +-01.0-[81-86]----00.0-[82-86]--+-00.0-[83]----00.0  NVIDIA Corporation Device 22a3
 |           |                               \-01.0-[84]----00.0  NVIDIA Corporation GH100 [H100 NVSwitch]
 |           \-02.0-[87]--
 +-[0000:15]-+-00.0  Intel Corporation Device 09a2
 |           +-01.0-[16-1c]----00.0-[17-1c]--+-00.0-[18]----00.0  Micron Technology Inc Device 51c3
 |           |                               +-01.0-[19]----00.0  NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330]
 |           |                               +-02.0-[1a]----00.0  Mellanox Technologies MT2910 Family [ConnectX-7]
 |           |                               \-03.0-[1b]--+-00.0  Mellanox Technologies MT2892 Family [ConnectX-6 Dx]
 |           |                                            \-00.1  Mellanox Technologies MT2892 Family [ConnectX-6 Dx]
 |           \-1f.4  Intel Corporation Device 1bc9
 \-[0000:00]-+-00.0  Intel Corporation Device 09a2
             \-0e.0-[02-03]----00.0-[03]----00.0  Matrox Electronics Systems Ltd. Integrated Matrox G200eW3 Graphics Controller
`

// lspciTreeGB200 has one device on each root bus ("---" after the bus).
const lspciTreeGB200 = `-+-[0019:00]---00.0-[01]----00.0  NVIDIA Corporation Device 2941
 +-[0018:00]---00.0-[01]----00.0  NVIDIA Corporation Device 2941
 \-[0006:00]---00.0-[01-09]----00.0-[02-09]--+-00.0-[03]--+-00.0  Mellanox Technologies MT43244 BlueField-3 integrated ConnectX-7 network controller
                                             |            \-00.1  Mellanox Technologies MT43244 BlueField-3 integrated ConnectX-7 network controller
                                             \-02.0-[04-09]--
`

func TestLspciTree(t *testing.T) {
	if !detectLspci("tree.txt", []byte(lspciTreeTV)) {
		t.Fatal("tree not detected")
	}
	s, err := ParseLspci([]byte(lspciTreeTV))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.PCI) != 25 {
		t.Errorf("%d functions, want 25", len(s.PCI))
	}
	if len(s.GPUs) != 1 {
		t.Fatalf("GPUs %v, want one", lspciGPUAddrs(s))
	}
	g := s.GPUs[0]
	if g.PCIAddress != "0000:19:00.0" || g.DeviceID != "2330" || g.Model != "GH100 [H100 SXM5 80GB]" {
		t.Errorf("GPU %+v", g)
	}
	if want := []string{"0000:17:01.0", "0000:16:00.0", "0000:15:01.0"}; !reflect.DeepEqual(g.Upstream, want) {
		t.Errorf("upstream %v, want %v", g.Upstream, want)
	}
	for addr, want := range map[string][2]string{
		"0000:15:01.0": {snapshot.KindRootPort, ""},
		"0000:16:00.0": {snapshot.KindSwitchUp, "0000:15:01.0"},
		"0000:17:03.0": {snapshot.KindSwitchDown, "0000:16:00.0"},
		"0000:1b:00.1": {snapshot.KindNIC, "0000:17:03.0"},
		"0000:15:1f.4": {snapshot.KindOther, ""},
		"0000:83:00.0": {snapshot.KindNVSwitch, "0000:82:00.0"},
		"0000:84:00.0": {snapshot.KindNVSwitch, "0000:82:01.0"},
		"0000:80:02.0": {snapshot.KindRootPort, ""},
		"0000:03:00.0": {snapshot.KindOther, "0000:02:00.0"},
	} {
		d := lspciDevice(t, s, addr)
		if d.Kind != want[0] || d.Parent != want[1] {
			t.Errorf("%s: kind %q parent %q, want %q below %q", addr, d.Kind, d.Parent, want[0], want[1])
		}
	}

	s, err = ParseLspci([]byte(lspciTreeGB200))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := lspciGPUAddrs(s), []string{"0019:01:00.0", "0018:01:00.0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("GPUs %v, want %v", got, want)
	}
	if got := s.GPUs[0].Upstream; !reflect.DeepEqual(got, []string{"0019:00:00.0"}) {
		t.Errorf("GB200 GPU upstream %v, want its root port", got)
	}
	if d := lspciDevice(t, s, "0006:03:00.1"); d.Kind != snapshot.KindNIC || d.Parent != "0006:02:00.0" {
		t.Errorf("0006:03:00.1 = %+v", d)
	}
	if d := lspciDevice(t, s, "0006:02:02.0"); d.Parent != "0006:01:00.0" {
		t.Errorf("0006:02:02.0 parent %q", d.Parent)
	}
}

// Each detector claims its own captures and nothing else in the shared set.
func TestTopoLinkDetectors(t *testing.T) {
	detectors := map[string]func(string, []byte) bool{
		"lspci":             detectLspci,
		"nvidia-smi-topo":   detectTopoM,
		"nvidia-smi-nvlink": detectNVLinkS,
	}
	n := 0
	err := filepath.WalkDir(lspciCaptures, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(lspciCaptures, p)
		folder, _, _ := strings.Cut(filepath.ToSlash(rel), "/")
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n++
		for kind, det := range detectors {
			if got := det(filepath.Base(p), b); got != (folder == kind) {
				t.Errorf("%s: detect %s = %v", rel, kind, got)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("walked %d capture files; is the capture folder there?", n)
	}
	for _, s := range []string{"", "\n\n", "00:00.0\n", "-[\n", "GPU 0: x\n"} {
		for kind, det := range detectors {
			if det("x", []byte(s)) {
				t.Errorf("detect %s claims %q", kind, s)
			}
		}
	}
}

// ParseBytes routes each capture to its importer.
func TestTopoLinkParseBytes(t *testing.T) {
	for rel, kind := range map[string]string{
		"lspci/h100-hgx-x8-lspci-vvv.txt":                        "lspci",
		"lspci/azure-nd-a100-v4-lspci-nn.txt":                    "lspci",
		"lspci/gb200-lspci.txt":                                  "lspci",
		"nvidia-smi-topo/b300x8-cx8-bond-topo-m.txt":             "nvidia-smi-topo",
		"nvidia-smi-topo/rtx4090x8-all-sys-topo-m.txt":           "nvidia-smi-topo",
		"nvidia-smi-nvlink/a100-sxm4-80gb-x8-azure-nvlink-s.txt": "nvidia-smi-nvlink",
	} {
		s, err := ParseBytes(rel, lspciReadCapture(t, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		if len(s.Sources) != 1 || s.Sources[0].Kind != kind {
			t.Errorf("%s: sources %+v, want kind %s", rel, s.Sources, kind)
		}
	}
}

func TestLspciErrors(t *testing.T) {
	for _, in := range []string{"", "hello\n", "\tNUMA node: 0\n"} {
		if _, err := ParseLspci([]byte(in)); err == nil {
			t.Errorf("ParseLspci(%q): no error", in)
		}
	}
	if _, err := ParseLspci([]byte("00:00.0 Host bridge: Intel Corporation Device 09a2\n\tNUMA node: zero\n")); err == nil ||
		!strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad NUMA node: err %v, want one naming line 2", err)
	}
}

// Bridges whose bus numbers point at each other must not make a loop.
func TestLspciBusCycle(t *testing.T) {
	in := "01:00.0 PCI bridge: Intel Corporation Device 352a\n\tBus: primary=01, secondary=02, subordinate=02, sec-latency=0\n" +
		"02:00.0 PCI bridge: Intel Corporation Device 352a\n\tBus: primary=02, secondary=01, subordinate=01, sec-latency=0\n" +
		"02:01.0 3D controller: NVIDIA Corporation Device 2330\n" +
		"03:00.0 PCI bridge: Intel Corporation Device 352a\n\tBus: primary=03, secondary=03, subordinate=ff, sec-latency=0\n"
	s, err := ParseLspci([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 1 || !reflect.DeepEqual(s.GPUs[0].Upstream, []string{"0000:01:00.0"}) {
		t.Fatalf("GPUs %+v", s.GPUs)
	}
	if d := lspciDevice(t, s, "0000:03:00.0"); d.Parent != "" {
		t.Errorf("0000:03:00.0 parent %q, want none", d.Parent)
	}
	a, b := lspciDevice(t, s, "0000:01:00.0"), lspciDevice(t, s, "0000:02:00.0")
	if a.Parent != "" && b.Parent != "" {
		t.Errorf("loop kept: %s below %s below %s", a.Address, a.Parent, b.Parent)
	}
}

func BenchmarkParseLspciH100(b *testing.B) {
	data := lspciReadCapture(b, "lspci/h100-hgx-x8-lspci-vvv.txt")
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := ParseLspci(data); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzParseLspci(f *testing.F) {
	h100, err := os.ReadFile(filepath.Join(lspciCaptures, "lspci/h100-hgx-x8-lspci-vvv.txt"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(h100[:40000]) // whole functions up to the first GPU's switch
	// A path whose last element is shorter than an address panicked.
	f.Add([]byte(strings.Repeat("0", 120) + "\n::/00.0 0"))
	for _, rel := range []string{"lspci/azure-nd-a100-v4-lspci-nn.txt", "lspci/gb200-lspci.txt"} {
		b, err := os.ReadFile(filepath.Join(lspciCaptures, rel))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(lspciMixed))
	f.Add([]byte(lspciTreeTV))
	f.Add([]byte(lspciTreeGB200))
	f.Fuzz(func(t *testing.T, data []byte) {
		detectLspci("f", data)
		s, err := ParseLspci(data)
		if err != nil {
			return
		}
		addrs := map[string]bool{}
		for _, d := range s.PCI {
			if c, err := snapshot.CanonicalPCI(d.Address); err != nil || c != d.Address {
				t.Fatalf("address %q is not canonical", d.Address)
			}
			if addrs[d.Address] {
				t.Fatalf("address %s listed twice", d.Address)
			}
			addrs[d.Address] = true
			if d.Kind == "" {
				t.Fatalf("%s has no kind", d.Address)
			}
			if d.Parent == d.Address {
				t.Fatalf("%s is its own parent", d.Address)
			}
			if l := d.Link; l != nil && (l.CurrentGen < 0 || l.CurrentGen > 6 || l.MaxGen < 0 || l.MaxGen > 6 || l.CurrentWidth < 0 || l.MaxWidth < 0) {
				t.Fatalf("%s: link %+v", d.Address, l)
			}
			if d.NUMANode != nil && *d.NUMANode < 0 {
				t.Fatalf("%s: NUMA %d", d.Address, *d.NUMANode)
			}
		}
		if len(s.GPUs) > len(s.PCI) {
			t.Fatalf("%d GPUs from %d functions", len(s.GPUs), len(s.PCI))
		}
		for _, g := range s.GPUs {
			if !addrs[g.PCIAddress] {
				t.Fatalf("GPU %q is not among the functions", g.PCIAddress)
			}
			for _, u := range g.Upstream {
				if !addrs[u] || u == g.PCIAddress {
					t.Fatalf("GPU %s: upstream %q", g.PCIAddress, u)
				}
			}
		}
	})
}
