package kb

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// realName is a GPU name as a tool prints it and the catalog row it must
// find. from says where the printed form comes from: "capture" (a file in
// testdata/captures), "ogkm" (the product name NVIDIA's driver reports, per
// the open-gpu-kernel-modules README), "pci.ids" (what lspci prints, the
// bracketed name or the whole device string), "public" (nvidia-smi,
// deviceQuery or framework output found in public code), "rocm" (the ROCm
// specification table's name).
type realName struct {
	name, row, cc, gfx, from string
}

var realNames = []realName{
	// ----------------------------------------------------------- Hopper
	{"NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", "9.0", "", "capture"},
	{"GH100 [H100 SXM5 80GB]", "H100-SXM5-80GB", "9.0", "", "pci.ids"},
	{"NVIDIA H100 PCIe", "H100-PCIe-80GB", "9.0", "", "capture"},
	{"NVIDIA H100 NVL", "H100-NVL-94GB", "9.0", "", "ogkm"},
	{"GH100 [H100L 94GB]", "H100-NVL-94GB", "9.0", "", "pci.ids"},
	{"GH100 [H100 SXM5 94GB]", "H100-SXM5-94GB", "9.0", "", "pci.ids"},
	{"NVIDIA H800", "H800", "9.0", "", "capture"},
	{"NVIDIA H800 PCIe", "H800-PCIe", "9.0", "", "ogkm"},
	{"NVIDIA H800 NVL", "H800-NVL-94GB", "9.0", "", "ogkm"},
	{"NVIDIA H200", "H200-SXM-141GB", "9.0", "", "capture"},
	{"GH100 [H200 SXM 141GB]", "H200-SXM-141GB", "9.0", "", "pci.ids"},
	{"NVIDIA H200 NVL", "H200-NVL", "9.0", "", "ogkm"},
	{"NVIDIA GH200 480GB", "GH200", "9.0", "", "capture"},
	{"NVIDIA GH200 120GB", "GH200", "9.0", "", "ogkm"},
	{"NVIDIA GH200 144G HBM3e", "GH200-144GB-HBM3e", "9.0", "", "ogkm"},
	// -------------------------------------------------------- Blackwell
	{"NVIDIA B200", "B200-180GB", "10.0", "", "capture"},
	{"NVIDIA GB200", "GB200", "10.0", "", "capture"},
	{"NVIDIA B300 SXM6 AC", "B300-SXM6-288GB", "10.3", "", "ogkm"},
	{"NVIDIA GB300", "GB300", "10.3", "", "ogkm"},
	{"GB110 [GB300]", "GB300", "10.3", "", "pci.ids"},
	{"NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000-Blackwell-Max-Q", "12.0", "", "capture"},
	{"NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-Blackwell-Workstation", "12.0", "", "ogkm"},
	{"NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Blackwell-Server", "12.0", "", "ogkm"},
	{"GB202GL [RTX PRO 6000 Blackwell Server Edition]", "RTX-PRO-6000-Blackwell-Server", "12.0", "", "pci.ids"},
	{"NVIDIA GeForce RTX 5090", "RTX-5090", "12.0", "", "ogkm"},
	{"NVIDIA GeForce RTX 5090 D", "RTX-5090-D", "12.0", "", "ogkm"},
	{"NVIDIA GeForce RTX 5090 D v2", "RTX-5090-D", "12.0", "", "ogkm"},
	// ----------------------------------------------------------- Ampere
	{"NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", "8.0", "", "capture"},
	{"A100-SXM4-40GB", "A100-SXM4-40GB", "8.0", "", "capture"}, // driver 460 prints no "NVIDIA "
	{"NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", "8.0", "", "capture"},
	{"GA100 [A100 SXM4 80GB]", "A100-SXM4-80GB", "8.0", "", "capture"},
	{"NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB", "8.0", "", "capture"},
	{"NVIDIA A100 80GB PCIe", "A100-PCIe-80GB", "8.0", "", "ogkm"},
	{"NVIDIA A800-SXM4-80GB", "A800-SXM4-80GB", "8.0", "", "ogkm"},
	{"NVIDIA A800-SXM4-40GB", "A800-SXM4-40GB", "8.0", "", "ogkm"},
	{"NVIDIA A800 80GB PCIe", "A800-PCIe-80GB", "8.0", "", "ogkm"},
	{"NVIDIA A800 80GB PCIe LC", "A800-PCIe-80GB", "8.0", "", "ogkm"},
	{"NVIDIA A800 40GB Active", "A800-PCIe-40GB", "8.0", "", "ogkm"},
	{"GA100 [A800 40GB PCIe]", "A800-PCIe-40GB", "8.0", "", "pci.ids"},
	{"NVIDIA A30", "A30", "8.0", "", "ogkm"},
	{"GA100GL [A30 PCIe]", "A30", "8.0", "", "pci.ids"},
	{"NVIDIA A10", "A10", "8.6", "", "capture"},
	{"GA102GL [A10]", "A10", "8.6", "", "capture"},
	{"NVIDIA A10G", "A10G", "8.6", "", "capture"},
	{"NVIDIA A40", "A40", "8.6", "", "capture"},
	{"NVIDIA A16", "NVIDIA-A16", "8.6", "", "ogkm"},
	{"NVIDIA A2", "NVIDIA-A2", "8.6", "", "ogkm"},
	{"GA107 [A2 / A16]", "NVIDIA-A2-or-A16", "8.6", "", "pci.ids"},
	{"NVIDIA RTX A6000", "RTX-A6000", "8.6", "", "ogkm"},
	{"NVIDIA RTX A5000", "RTX-A5000", "8.6", "", "capture"},
	{"NVIDIA RTX A4000", "RTX-A4000", "8.6", "", "ogkm"},
	{"NVIDIA RTX A1000 6GB Laptop GPU", "RTX-A1000-6GB-Laptop", "8.6", "", "ogkm"},
	{"NVIDIA GeForce RTX 3090", "RTX-3090", "8.6", "", "capture"},
	{"NVIDIA GeForce RTX 3090 Ti", "RTX-3090-Ti", "8.6", "", "ogkm"},
	{"NVIDIA GeForce RTX 3080", "RTX-3080", "8.6", "", "capture"},
	{"NVIDIA GeForce RTX 3080 Ti", "RTX-3080-Ti", "8.6", "", "ogkm"},
	{"NVIDIA GeForce RTX 3060 Laptop GPU", "RTX-3060-Laptop", "8.6", "", "capture"},
	{"GA106M [GeForce RTX 3060 Mobile / Max-Q]", "RTX-3060-Laptop", "8.6", "", "pci.ids"},
	// -------------------------------------------------------------- Ada
	{"NVIDIA L4", "L4", "8.9", "", "ogkm"},
	{"NVIDIA L40", "L40", "8.9", "", "ogkm"},
	{"NVIDIA L40S", "L40S", "8.9", "", "capture"},
	{"NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada", "8.9", "", "ogkm"},
	{"NVIDIA GeForce RTX 4090", "RTX-4090", "8.9", "", "capture"},
	{"NVIDIA GeForce RTX 4090 D", "RTX-4090-D", "8.9", "", "ogkm"},
	{"NVIDIA GeForce RTX 4090 Laptop GPU", "RTX-4090-Laptop", "8.9", "", "ogkm"},
	{"NVIDIA GeForce RTX 4070 Laptop GPU", "RTX-4070-Laptop", "8.9", "", "capture"},
	// ----------------------------------------------------------- Turing
	{"Tesla T4", "T4", "7.5", "", "capture"},
	{"TU104GL [Tesla T4]", "T4", "7.5", "", "pci.ids"},
	{"Quadro RTX 6000", "Quadro-RTX-6000", "7.5", "", "ogkm"},
	{"Quadro RTX 8000", "Quadro-RTX-8000", "7.5", "", "ogkm"},
	{"TU102GL [Quadro RTX 6000/8000]", "Quadro-RTX-6000-or-8000", "7.5", "", "pci.ids"},
	{"Quadro RTX 5000", "Quadro-RTX-5000", "7.5", "", "ogkm"},
	{"TU104GL [Quadro RTX 5000]", "Quadro-RTX-5000", "7.5", "", "capture"},
	{"GeForce RTX 2080 Ti", "RTX-2080-Ti", "7.5", "", "capture"},
	{"TU102 [GeForce RTX 2080 Ti]", "RTX-2080-Ti", "7.5", "", "capture"},
	{"NVIDIA GeForce RTX 2080 SUPER", "RTX-2080-SUPER", "7.5", "", "capture"},
	{"NVIDIA GeForce RTX 2080", "RTX-2080", "7.5", "", "capture"},
	{"NVIDIA GeForce RTX 2070 SUPER", "RTX-2070-SUPER", "7.5", "", "ogkm"},
	{"NVIDIA GeForce RTX 2070", "RTX-2070", "7.5", "", "capture"},
	{"NVIDIA GeForce RTX 2060 SUPER", "RTX-2060-SUPER", "7.5", "", "ogkm"},
	{"TU104 [GeForce RTX 2060]", "RTX-2060", "7.5", "", "capture"},
	// ------------------------------------------------------------ Volta
	{"Tesla V100-SXM2-16GB", "V100-SXM2-16GB", "7.0", "", "public"},
	{"Tesla V100-SXM2-32GB", "V100-SXM2-32GB", "7.0", "", "public"},
	{"Tesla V100-PCIE-16GB", "V100-PCIe-16GB", "7.0", "", "public"},
	{"Tesla V100-PCIE-32GB", "V100-PCIe-32GB", "7.0", "", "public"},
	{"GV100GL [Tesla V100 PCIe 32GB]", "V100-PCIe-32GB", "7.0", "", "pci.ids"},
	{"Tesla V100S-PCIE-32GB", "V100S-PCIe-32GB", "7.0", "", "public"},
	{"GV100GL [Tesla V100S PCIe 32GB]", "V100S-PCIe-32GB", "7.0", "", "pci.ids"},
	{"NVIDIA TITAN V", "TITAN-V", "7.0", "", "capture"},
	// ----------------------------------------------------------- Pascal
	{"Tesla P100-PCIE-16GB", "P100-PCIe-16GB", "6.0", "", "public"},
	{"Tesla P100-PCIE-12GB", "P100-PCIe-12GB", "6.0", "", "public"},
	{"GP100GL [Tesla P100 PCIe 12GB]", "P100-PCIe-12GB", "6.0", "", "capture"},
	{"Tesla P100-SXM2-16GB", "P100-SXM2-16GB", "6.0", "", "public"},
	{"Tesla P40", "Tesla-P40", "6.1", "", "public"},
	{"GP102GL [Tesla P40]", "Tesla-P40", "6.1", "", "pci.ids"},
	{"Tesla P4", "Tesla-P4", "6.1", "", "public"},
	{"GRID P4-1Q", "Tesla-P4", "6.1", "", "capture"},
	{"Quadro P2000", "Quadro-P2000", "6.1", "", "capture"},
	{"GeForce GTX 1080 Ti", "GTX-1080-Ti", "6.1", "", "capture"},
	{"NVIDIA GeForce GTX 1080", "GTX-1080", "6.1", "", "pci.ids"},
	{"NVIDIA GB10", "GB10", "12.1", "", "DGX Spark nvidia-smi"},
	{"GP104 [GeForce GTX 1070]", "GTX-1070", "6.1", "", "capture"},
	{"NVIDIA GeForce GT 1030", "GT-1030", "6.1", "", "capture"},
	// ------------------------------------------- Kepler, Maxwell (captures)
	{"GK210GL [Tesla K80]", "Tesla-K80", "3.7", "", "capture"},
	{"Quadro K2200", "Quadro-K2200", "5.0", "", "capture"},
	{"GM107GL [Quadro K2200]", "Quadro-K2200", "5.0", "", "capture"},
	{"GM107 [GeForce GTX 750 Ti]", "GTX-750-Ti", "5.0", "", "capture"},
	// -------------------------------------------------------------- AMD
	{"AMD Instinct MI355X", "MI355X", "", "gfx950", "rocm"},
	{"Aqua Vanjaram [Instinct MI355X]", "MI355X", "", "gfx950", "pci.ids"},
	{"Aqua Vanjaram [Instinct MI350X]", "MI350X", "", "gfx950", "pci.ids"},
	{"AMD Instinct MI300X", "MI300X", "", "gfx942", "capture"},
	{"AMD Instinct MI300X OAM", "MI300X", "", "gfx942", "capture"},
	{"Aqua Vanjaram [Instinct MI300A]", "MI300A", "", "gfx942", "capture"},
	{"MI308X", "MI308X", "", "gfx942", "capture"},
	{"Aqua Vanjaram [Instinct MI325X VF]", "MI325X", "", "gfx942", "pci.ids"},
	{"AMD Instinct MI250X", "MI250X", "", "gfx90a", "rocm"},
	{"AMD Instinct MI250", "MI250", "", "gfx90a", "rocm"},
	{"Instinct MI210", "MI210", "", "gfx90a", "capture"},
	{"Arcturus GL-XL [Instinct MI100]", "MI100", "", "gfx908", "capture"},
	{"Radeon Instinct MI50 32GB", "MI50", "", "gfx906", "capture"},
	{"AMD Instinct MI60", "MI60", "", "gfx906", "rocm"},
	{"Navi 31 [Radeon Pro W7900]", "Radeon-PRO-W7900", "", "gfx1100", "pci.ids"},
	{"Navi 31 [Radeon Pro W7900 Dual Slot]", "Radeon-PRO-W7900", "", "gfx1100", "pci.ids"},
	{"AMD Radeon RX 7900 XTX", "RX-7900-XTX", "", "gfx1100", "rocm"},
	{"Navi 21 GL-XL [Radeon PRO W6800]", "Radeon-PRO-W6800", "", "gfx1030", "pci.ids"},
	{"Navi 21 [Radeon Pro V620]", "Radeon-PRO-V620", "", "gfx1030", "pci.ids"},
	{"Navi 21 [Radeon Pro V620 MxGPU]", "Radeon-PRO-V620", "", "gfx1030", "pci.ids"},
	{"Navi 22 [Radeon RX 6700/6700 XT / 6800M]", "RX-6700-XT", "", "gfx1031", "capture"},
}

// Names that must find no row: a tool's placeholder, a board the catalog
// does not have, one that extends a catalog name with a letter or digit, a
// bare name that more than one board prints, or a name cut short.
var notGPUNames = []string{
	"NVIDIA Graphics Device", // driver 418 on a GTX 1660 Ti (capture gtx1660ti-418.43-graphics-device)
	"Graphics Device",
	"Tesla X99",
	"NVIDIA H300",
	"NVIDIA H100",       // ogkm: 2339's name; as a pattern it would take every H100 variant
	"NVIDIA H20",        // a China variant the catalog lacks
	"NVIDIA A30X",       // 10de:20b9, not the A30
	"NVIDIA A100X",      // 10de:20b8, not an A100 row
	"NVIDIA RTX A4000H", // 10de:24b1, not the RTX A4000
	"NVIDIA A1000",      // not an A10 or A100
	"NVIDIA L400",       // not an L4 or L40
	"NVIDIA L20",        // not in the catalog
	"NVIDIA T400",       // not a T4
	"Navi 31 [Radeon Pro W7900D]",
	"Navi 21 Pro-XLA [Radeon Pro W6800X/Radeon Pro W6800X Duo]",
	"Navi 14 [Radeon RX 5500/5500M / Pro 5500M]", // capture apple-t2-cometlake-navi14; not in the catalog
	"GV102",                       // an old pci.ids name of 10de:1e07 (capture nvidia-bug-report/rtx2080ti-x4)
	"NVIDIA GeForce ...",          // summary table cut the name (capture geforce-525.125.06-fan-err)
	"NVIDIA A100-SXM...",          // cut (capture a100-sxm-80gb-x2-mig-mixed)
	"Tesla V100-PCIE...",          // cut (capture v100-azure-fragment-pwr-err)
	"NVIDIA RTX A1000 6GB Lap...", // cut (capture rtx-a1000-laptop)
	"Device 2330",                 // lspci without a name for the id
	"0x1002",                      // rocm-smi 4.3's bogus card series (capture rx6700xt-rocm4.3)
	"N/A",
	"ERR!",
	"",
}

func TestRealGPUNames(t *testing.T) {
	k := Default()
	if len(realNames) < 40 {
		t.Fatalf("only %d names", len(realNames))
	}
	for _, tc := range realNames {
		g, ok := k.GPUByName(tc.name)
		if !ok || g.Name != tc.row {
			t.Errorf("GPUByName(%q) = %q, %v; want %q (%s)", tc.name, g.Name, ok, tc.row, tc.from)
			continue
		}
		if g.ComputeCapability != tc.cc || g.GFXTarget != tc.gfx {
			t.Errorf("%q -> %s: cc %q gfx %q; want cc %q gfx %q", tc.name, g.Name, g.ComputeCapability, g.GFXTarget, tc.cc, tc.gfx)
		}
	}
	for _, name := range notGPUNames {
		if g, ok := k.GPUByName(name); ok {
			t.Errorf("GPUByName(%q) = %q; want no match", name, g.Name)
		}
	}
}

// Every catalog row is found by at least one real name above, so a row
// cannot go missing (or be added) without this table noticing.
func TestEveryRowHasARealName(t *testing.T) {
	named := map[string]bool{}
	for _, tc := range realNames {
		named[tc.row] = true
	}
	for _, g := range Default().GPUs {
		if !named[g.Name] {
			t.Errorf("no real name in realNames finds row %s", g.Name)
		}
	}
	for row := range named {
		found := false
		for _, g := range Default().GPUs {
			found = found || g.Name == row
		}
		if !found {
			t.Errorf("realNames expects row %s, which the catalog lacks", row)
		}
	}
}

// Device ids of boards whose name alone cannot tell them apart, and of the
// added rows, map to the right row (pci.ids).
func TestAddedDeviceIDs(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ vendor, id, row string }{
		{"nvidia", "25b6", "NVIDIA-A2-or-A16"},
		{"nvidia", "1e30", "Quadro-RTX-6000-or-8000"},
		{"nvidia", "1e78", "Quadro-RTX-6000-or-8000"},
		{"nvidia", "1e36", "Quadro-RTX-6000"},
		{"nvidia", "2321", "H100-NVL-94GB"},
		{"nvidia", "2324", "H800"},
		{"nvidia", "233b", "H200-NVL"},
		{"nvidia", "2342", "GH200"},
		{"nvidia", "31c2", "GB300"},
		{"nvidia", "2bb5", "RTX-PRO-6000-Blackwell-Server"},
		{"nvidia", "20f3", "A800-SXM4-80GB"},
		{"nvidia", "20b7", "A30"},
		{"nvidia", "2235", "A40"},
		{"nvidia", "1db4", "V100-PCIe-16GB"},
		{"nvidia", "1db6", "V100-PCIe-32GB"},
		{"nvidia", "1df6", "V100S-PCIe-32GB"},
		{"nvidia", "15f7", "P100-PCIe-12GB"},
		{"nvidia", "1bb3", "Tesla-P4"},
		{"nvidia", "1b38", "Tesla-P40"},
		{"nvidia", "1e07", "RTX-2080-Ti"},
		{"nvidia", "1e87", "RTX-2080"},
		{"nvidia", "2860", "RTX-4070-Laptop"},
		{"nvidia", "2520", "RTX-3060-Laptop"},
		{"nvidia", "2b85", "RTX-5090"},
		{"nvidia", "102d", "Tesla-K80"},
		{"amd", "75a3", "MI355X"},
		{"amd", "74b9", "MI325X"},
		{"amd", "7448", "Radeon-PRO-W7900"},
		{"amd", "73a3", "Radeon-PRO-W6800"},
		{"amd", "73ae", "Radeon-PRO-V620"},
	} {
		g, ok := k.GPUByDeviceID(tc.vendor, tc.id)
		if !ok || g.Name != tc.row {
			t.Errorf("GPUByDeviceID(%s, %s) = %q, %v; want %q", tc.vendor, tc.id, g.Name, ok, tc.row)
		}
	}
	// The device ids the captures print, where the name is absent or cut.
	for _, tc := range []struct{ file, re, vendor, row string }{
		{"nvidia-smi-q/h800-525.105.17-q-i0-ecc-off.txt", `Device Id\s+: 0x([0-9A-F]{4})10DE`, "nvidia", "H800"},
		{"nvidia-smi-q/rtx4070-laptop-wsl2-566.36.txt", `Device Id\s+: 0x([0-9A-F]{4})10DE`, "nvidia", "RTX-4070-Laptop"},
		{"nvidia-smi-q/rtx2080super-linux-610.57.04-kmd-load.txt", `Device Id\s+: 0x([0-9A-F]{4})10DE`, "nvidia", "RTX-2080-SUPER"},
		{"nvidia-smi-q-xml/gt1030-470.74-x4-card.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "GT-1030"},
		{"nvidia-smi-q-xml/rtx2070-x2-590.44.01-x8x8.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "RTX-2070"},
		{"nvidia-smi-q-xml/grid-p4-1q-vgpu-windows-513.46.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "Tesla-P4"},
		{"nvidia-bug-report/gtx1080ti-x4-384.59-nouveau-loaded.log", `VGA compatible controller \[0300\]: NVIDIA Corporation Device \[10de:([0-9a-f]{4})\]`, "nvidia", "GTX-1080-Ti"},
		{"nvidia-bug-report/rtx2080ti-x4-440.31-xid62-xid13-xid31.log", `NVIDIA Corporation GV102 \[10de:([0-9a-f]{4})\]`, "nvidia", "RTX-2080-Ti"},
		{"rocm-smi/navi21-x2-rocm6.1.1-concise.txt", `(0x73a3),`, "amd", "Radeon-PRO-W6800"},
	} {
		ms := regexp.MustCompile(tc.re).FindAllStringSubmatch(readCapture(t, tc.file), -1)
		if len(ms) == 0 {
			t.Errorf("%s: no device id found", tc.file)
		}
		for _, m := range ms {
			if g, ok := k.GPUByDeviceID(tc.vendor, m[1]); !ok || g.Name != tc.row {
				t.Errorf("%s: GPUByDeviceID(%s, %s) = %q, %v; want %q", tc.file, tc.vendor, m[1], g.Name, ok, tc.row)
			}
		}
	}
}

// capturedNamePatterns pull the GPU names tools printed out of the
// captures, one line at a time: nvidia-smi -q (text, XML), -L, the summary
// table, bug reports, lspci device strings, rocm-smi and amd-smi. guard is a
// substring the line must hold before the pattern is tried.
var capturedNamePatterns = []struct {
	guard string
	re    *regexp.Regexp
}{
	{"Product Name", regexp.MustCompile(`Product Name\s+: (.+)`)},
	{"<product_name>", regexp.MustCompile(`<product_name>([^<]+)</product_name>`)},
	{"(UUID", regexp.MustCompile(`GPU \d+: (.+?) \(UUID`)},
	{"|", regexp.MustCompile(`^\|\s+\d+\s+(.+?)\s{2,}(?:On|Off|WDDM|TCC)\s+\|`)},
	{"Model:", regexp.MustCompile(`^Model:\s+(.+)$`)},
	{"NVIDIA Corporation", regexp.MustCompile(`(?:3D controller|VGA compatible controller|Display controller|Processing accelerators)(?: \[[0-9a-f]{4}\])?: NVIDIA Corporation (.+?)(?: \[[0-9a-f]{4}:[0-9a-f]{4}\])?(?: \(rev [0-9a-f]+\))?(?: \(prog-if [^)]*\))?\s*$`)},
	{"[AMD/ATI]", regexp.MustCompile(`(?:3D controller|VGA compatible controller|Display controller|Processing accelerators)(?: \[[0-9a-f]{4}\])?: Advanced Micro Devices, Inc\. \[AMD/ATI\] (.+?)(?: \[[0-9a-f]{4}:[0-9a-f]{4}\])?(?: \(rev [0-9a-f]+\))?(?: \(prog-if [^)]*\))?\s*$`)},
	{"Card ", regexp.MustCompile(`"Card [sS]eries": "([^"]+)"`)},
	{"Device Name", regexp.MustCompile(`"Device Name": "([^"]+)"`)},
	{"market_name", regexp.MustCompile(`"market_name": "([^"]+)"`)},
	{"product_name", regexp.MustCompile(`"product_name": "([^"]+)"`)},
	{"MARKET_NAME", regexp.MustCompile(`^\s*MARKET_NAME: (.+)$`)},
	{"Instinct", regexp.MustCompile(`^\s{4,}((?:AMD )?Instinct MI\w+)\s*$`)},
}

// Every GPU name printed in a capture is in realNames (with its row) or in
// notGPUNames, so a new capture with a new name needs a decision here.
func TestEveryCapturedNameIsDecided(t *testing.T) {
	decided := map[string]bool{}
	for _, tc := range realNames {
		decided[tc.name] = true
	}
	for _, n := range notGPUNames {
		decided[n] = true
	}
	seen := map[string]string{}
	scan := func(name string, text []byte) {
		for _, line := range strings.Split(string(text), "\n") {
			line = strings.TrimRight(line, "\r")
			for _, p := range capturedNamePatterns {
				if !strings.Contains(line, p.guard) {
					continue
				}
				m := p.re.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				n := strings.TrimSpace(m[1])
				if n == "Device" || strings.HasPrefix(n, "Device ") {
					continue // lspci found no name for the id
				}
				if strings.HasSuffix(n, "...") {
					// The summary table cut the name; the parser leaves the
					// model unknown and never looks it up. (Where the cut
					// falls after a whole model name, as in "NVIDIA GeForce
					// RTX 2080 ..." for a 2080 SUPER, a lookup would take
					// the visible prefix.)
					continue
				}
				if _, ok := seen[n]; !ok {
					seen[n] = name
				}
			}
		}
	}
	err := filepath.WalkDir(captures, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(captures, p)
		if filepath.Dir(rel) == "." {
			return nil // README, SOURCE and expected files describe the captures
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(p, ".tar.gz") {
			return scanTarGz(b, func(name string, data []byte) { scan(rel+":"+name, data) })
		}
		scan(rel, b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 40 {
		t.Fatalf("found only %d printed names in the captures", len(seen))
	}
	for n, where := range seen {
		if !decided[n] {
			t.Errorf("%s prints GPU name %q, which neither realNames nor notGPUNames has", where, n)
		}
	}
}

func scanTarGz(b []byte, each func(name string, data []byte)) error {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		each(h.Name, data)
	}
}
