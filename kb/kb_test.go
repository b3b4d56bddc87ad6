package kb

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const captures = "../testdata/captures"

func TestDefaultLoads(t *testing.T) {
	k := Default()
	if len(k.GPUs) < 30 || len(k.CUDA) < 50 || len(k.MIG) < 4 {
		t.Fatalf("tables too small: %d gpus, %d cuda, %d mig", len(k.GPUs), len(k.CUDA), len(k.MIG))
	}
	if err := k.validateMIG(); err != nil {
		t.Fatal(err)
	}
}

func TestEveryRowHasSource(t *testing.T) {
	k := Default()
	for _, g := range k.GPUs {
		if strings.TrimSpace(g.Source) == "" {
			t.Errorf("gpu %s has no source", g.Name)
		}
	}
	for _, c := range k.CUDA {
		if strings.TrimSpace(c.Source) == "" {
			t.Errorf("cuda %s has no source", c.Version)
		}
	}
	for _, m := range k.MIG {
		if strings.TrimSpace(m.Source) == "" {
			t.Errorf("mig %s has no source", m.Name)
		}
	}
}

func TestGPURowsWellFormed(t *testing.T) {
	k := Default()
	names := map[string]bool{}
	ids := map[string]string{}
	hex4 := regexp.MustCompile(`^[0-9a-f]{4}$`)
	classes := map[string]bool{"datacenter": true, "workstation": true, "consumer": true}
	vendors := map[string]bool{"nvidia": true, "amd": true, "intel": true}
	for _, g := range k.GPUs {
		if names[strings.ToLower(g.Name)] {
			t.Errorf("duplicate model name %s", g.Name)
		}
		names[strings.ToLower(g.Name)] = true
		if !classes[g.Class] {
			t.Errorf("%s: class %q", g.Name, g.Class)
		}
		if !vendors[g.Vendor] {
			t.Errorf("%s: vendor %q", g.Name, g.Vendor)
		}
		for _, id := range g.DeviceIDs {
			if !hex4.MatchString(id) {
				t.Errorf("%s: device id %q is not 4 lowercase hex digits", g.Name, id)
			}
			key := g.Vendor + ":" + id
			if other, dup := ids[key]; dup {
				t.Errorf("device id %s on both %s and %s", key, other, g.Name)
			}
			ids[key] = g.Name
		}
		if g.Interconnect != "" && g.InterconnectGen > 0 && k.LinkGBpsUni(g.Interconnect, g.InterconnectGen) == 0 {
			t.Errorf("%s: %s gen %d is not in interconnects.yaml", g.Name, g.Interconnect, g.InterconnectGen)
		}
		if g.Vendor == "nvidia" && g.ComputeCapability == "" {
			t.Errorf("%s: no compute capability", g.Name)
		}
		if g.MIG {
			if _, ok := k.MIGProfiles(g.Name); !ok && !strings.HasPrefix(g.Name, "B300") {
				t.Errorf("%s is MIG-capable but has no MIG geometry", g.Name)
			}
		}
	}
}

// Every name and pattern of a row must find that same row, so no pattern
// of one model captures another model's name.
func TestMatchPatternsAreUnambiguous(t *testing.T) {
	k := Default()
	for _, g := range k.GPUs {
		for _, m := range append([]string{g.Name}, g.Match...) {
			for _, form := range []string{m, "NVIDIA " + m, "AMD " + m, "[" + m + "]"} {
				got, ok := k.GPUByName(form)
				if !ok || got.Name != g.Name {
					t.Errorf("GPUByName(%q) = %q, %v; want %q", form, got.Name, ok, g.Name)
				}
			}
		}
	}
}

func TestGPUByNameWordBoundaries(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ name, want string }{
		{"NVIDIA A10", "A10"},
		{"NVIDIA A10G", "A10G"},
		{"NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"},
		{"NVIDIA L4", "L4"},
		{"NVIDIA L40", "L40"},
		{"NVIDIA L40S", "L40S"},
		{"NVIDIA B200", "B200-180GB"},
		{"NVIDIA GB200", "GB200"},
		{"NVIDIA H200", "H200-SXM-141GB"},
		{"NVIDIA H100 PCIe", "H100-PCIe-80GB"},
		{"NVIDIA B300 SXM6 AC", "B300-SXM6-288GB"},
		{"Tesla T4", "T4"},
		{"Tesla V100-SXM2-16GB", "V100-SXM2-16GB"},
		{"Tesla V100-SXM2-32GB", "V100-SXM2-32GB"},
		{"Tesla P100-PCIE-16GB", "P100-PCIe-16GB"},
		{"NVIDIA A100-PCIE-40GB", "A100-PCIe-40GB"},
		{"NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"},
		{"AMD Instinct MI250X", "MI250X"},
		{"AMD Instinct MI250", "MI250"},
		{"AMD Instinct MI210", "MI210"},
		{"AMD Instinct MI300A", "MI300A"},
		{"AMD Instinct MI308X", "MI308X"},
		{"AMD Instinct MI325X", "MI325X"},
		{"AMD Radeon RX 7900 XTX", "RX-7900-XTX"},
	} {
		got, ok := k.GPUByName(tc.name)
		if !ok || got.Name != tc.want {
			t.Errorf("GPUByName(%q) = %q, %v; want %q", tc.name, got.Name, ok, tc.want)
		}
	}
	for _, name := range []string{"", "NVIDIA GeForce ...", "Device 2330", "NVIDIA A1000", "NVIDIA L400", "NVIDIA H20"} {
		if got, ok := k.GPUByName(name); ok {
			t.Errorf("GPUByName(%q) = %q; want no match", name, got.Name)
		}
	}
}

// readCapture returns a capture file's text, failing the test if it is missing.
func readCapture(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(captures, rel))
	if err != nil {
		t.Fatalf("read capture: %v", err)
	}
	return string(b)
}

// Every GPU name printed in the captures maps to the right row.
func TestNamesPrintedInCaptures(t *testing.T) {
	k := Default()
	cases := []struct {
		file string
		re   string // first group is the printed name
		want string
		n    int // how many times the name is printed
	}{
		{"nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt", `Product Name\s+: (.+)`, "H100-SXM5-80GB", 8},
		{"nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt", `Product Name\s+: (.+)`, "RTX-4090", 8},
		{"nvidia-smi-q/rtx4090x8-535.154.05-gen5host-idle.txt", `Product Name\s+: (.+)`, "RTX-4090", 8},
		{"nvidia-smi-q/a100-sxm4-40gb-x8-azure-460.32.03.txt", `Product Name\s+: (.+)`, "A100-SXM4-40GB", 8},
		{"nvidia-smi-q/titanv-560.35.03.txt", `Product Name\s+: (.+)`, "TITAN-V", 1},
		{"nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml", `<product_name>(.+)</product_name>`, "A100-SXM4-80GB", 1},
		{"nvidia-smi-q-xml/a10g-aws-515.105.01.xml", `<product_name>(.+)</product_name>`, "A10G", 1},
		{"nvidia-smi-q-xml/rtx-a5000-x2-590.44.01.xml", `<product_name>(.+)</product_name>`, "RTX-A5000", 2},
		{"nvidia-smi-q-xml/rtx-pro-6000-blackwell-maxq-590.44.01.xml", `<product_name>(.+)</product_name>`, "RTX-PRO-6000-Blackwell-Max-Q", 1},
		{"nvidia-smi-q-xml/rtx3080-windows-536.40.xml", `<product_name>(.+)</product_name>`, "RTX-3080", 1},
		{"nvidia-smi-q-xml/rtx3090-590.44.01.xml", `<product_name>(.+)</product_name>`, "RTX-3090", 1},
		{"nvidia-smi-q-xml/quadro-p2000-525.125.06.xml", `<product_name>(.+)</product_name>`, "Quadro-P2000", 1},
		{"nvidia-smi-summary/h100x8-550.90.07.txt", `\|\s+\d+\s+(NVIDIA H100[^|]*?)\s+On\s+\|`, "H100-SXM5-80GB", 8},
		{"nvidia-smi-nvlink/a100-sxm4-80gb-x8-azure-nvlink-s.txt", `GPU \d+: (.+) \(UUID`, "A100-SXM4-80GB", 8},
		{"lspci/azure-nd-a100-v4-lspci-nn.txt", `3D controller \[0302\]: NVIDIA Corporation (GA100 \[[^\]]+\])`, "A100-SXM4-80GB", 8},
		{"rocm-smi/mi100-x4-rocm6.0.2-showall.json", `"Card series": "(.+)"`, "MI100", 4},
		{"rocm-smi/mi50-rocm5.x-showall.json", `"Card series": "(.+)"`, "MI50", 1},
		{"rocm-smi/rx6700xt-rocm6.1.2-showall.json", `"Card Series": "(.+)"`, "RX-6700-XT", 1},
		{"rocm-smi/rx6700xt-rocm6.1.2-showall.json", `"Device Name": "(.+)"`, "RX-6700-XT", 1},
		{"rocm-smi/mi300x-x8-concise.txt", `(?m)^\s+(AMD Instinct \S+)\s*$`, "MI300X", 8},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			text := readCapture(t, tc.file)
			ms := regexp.MustCompile(tc.re).FindAllStringSubmatch(text, -1)
			if len(ms) != tc.n {
				t.Fatalf("found %d printed names, want %d", len(ms), tc.n)
			}
			for _, m := range ms {
				name := strings.TrimSpace(m[1])
				got, ok := k.GPUByName(name)
				if !ok || got.Name != tc.want {
					t.Errorf("GPUByName(%q) = %q, %v; want %q", name, got.Name, ok, tc.want)
				}
			}
		})
	}
	// The summary table truncates a long name; it must not be taken for a model.
	text := readCapture(t, "nvidia-smi-summary/geforce-525.125.06-fan-err.txt")
	if !strings.Contains(text, "NVIDIA GeForce ...") {
		t.Fatal("truncated name not in capture")
	}
	if got, ok := k.GPUByName("NVIDIA GeForce ..."); ok {
		t.Errorf("truncated name matched %s", got.Name)
	}
}

// Every PCI device id in the captures maps to the right row.
func TestDeviceIDsInCaptures(t *testing.T) {
	k := Default()
	cases := []struct {
		file, re, vendor, want string
		n                      int
	}{
		{"nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt", `Device Id\s+: 0x([0-9A-F]{4})10DE`, "nvidia", "H100-SXM5-80GB", 8},
		{"nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt", `Device Id\s+: 0x([0-9A-F]{4})10DE`, "nvidia", "RTX-4090", 8},
		{"nvidia-smi-q/a100-sxm4-40gb-x8-azure-460.32.03.txt", `Device Id\s+: 0x([0-9A-F]{4})10DE`, "nvidia", "A100-SXM4-40GB", 8},
		{"nvidia-smi-q/titanv-560.35.03.txt", `Device Id\s+: 0x([0-9A-F]{4})10DE`, "nvidia", "TITAN-V", 1},
		{"nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "A100-SXM4-80GB", 1},
		{"nvidia-smi-q-xml/rtx-a5000-x2-590.44.01.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "RTX-A5000", 2},
		{"nvidia-smi-q-xml/rtx-pro-6000-blackwell-maxq-590.44.01.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "RTX-PRO-6000-Blackwell-Max-Q", 1},
		{"nvidia-smi-q-xml/rtx3080-windows-536.40.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "RTX-3080", 1},
		{"nvidia-smi-q-xml/rtx3090-590.44.01.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "RTX-3090", 1},
		{"nvidia-smi-q-xml/quadro-p2000-525.125.06.xml", `<pci_device_id>([0-9A-F]{4})10DE<`, "nvidia", "Quadro-P2000", 1},
		{"lspci/h100-hgx-x8-lspci-vvv.txt", `3D controller: NVIDIA Corporation Device ([0-9a-f]{4})`, "nvidia", "H100-SXM5-80GB", 8},
		{"lspci/azure-nd-a100-v4-lspci-nn.txt", `3D controller \[0302\]: .*\[10de:([0-9a-f]{4})\]`, "nvidia", "A100-SXM4-80GB", 8},
		{"lspci/gb200-lspci.txt", `3D controller: NVIDIA Corporation Device ([0-9a-f]{4})`, "nvidia", "GB200", 4},
		{"dmesg/nvrm-fallen-off-bus-no-xid.log", `PCI ID: 10de:([0-9a-f]{4})`, "nvidia", "L40", 1},
		{"rocm-smi/mi100-x4-rocm6.0.2-showall.json", `"Device ID": "0x([0-9a-f]{4})"`, "amd", "MI100", 4},
		{"rocm-smi/mi50-rocm5.x-showall.json", `"GPU ID": "0x([0-9a-f]{4})"`, "amd", "MI50", 1},
		{"rocm-smi/rx6700xt-rocm6.1.2-showall.json", `"Device ID": "0x([0-9a-f]{4})"`, "amd", "RX-6700-XT", 1},
		{"rocm-smi/mi300x-x8-concise.txt", `\[0x([0-9a-f]{4}) : 0x00\]`, "amd", "MI300X", 8},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			ms := regexp.MustCompile(tc.re).FindAllStringSubmatch(readCapture(t, tc.file), -1)
			if len(ms) != tc.n {
				t.Fatalf("found %d device ids, want %d", len(ms), tc.n)
			}
			for _, m := range ms {
				got, ok := k.GPUByDeviceID(tc.vendor, m[1])
				if !ok || got.Name != tc.want {
					t.Errorf("GPUByDeviceID(%s, %s) = %q, %v; want %q", tc.vendor, m[1], got.Name, ok, tc.want)
				}
			}
		})
	}
	if got, ok := k.GPUByDeviceID("nvidia", "0x2330"); !ok || got.Name != "H100-SXM5-80GB" {
		t.Errorf("0x2330 prefix: %q %v", got.Name, ok)
	}
	if _, ok := k.GPUByDeviceID("amd", "2330"); ok {
		t.Error("device id matched across vendors")
	}
}

// KFD topology prints device ids in decimal.
func TestKFDDeviceIDs(t *testing.T) {
	k := Default()
	want := map[string]string{}
	err := filepath.WalkDir(filepath.Join(captures, "kfd-topology/mi210-x8-xgmi-pcie/nodes"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Base(p) != "properties" || filepath.Base(filepath.Dir(filepath.Dir(p))) != "nodes" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		want[p] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gpus := 0
	for p, text := range want {
		id := kfdDeviceID(text)
		if id == 0 {
			continue // CPU node
		}
		gpus++
		got, ok := k.GPUByDeviceID("amd", fmt.Sprintf("%04x", id))
		if !ok || got.Name != "MI210" || got.GFXTarget != "gfx90a" {
			t.Errorf("%s: device %d -> %q %v", p, id, got.Name, ok)
		}
	}
	if gpus != 8 {
		t.Errorf("found %d MI210 nodes, want 8", gpus)
	}

	// The MI300X CPX capture is a tarball of the topology tree.
	f, err := os.Open(filepath.Join(captures, "kfd-topology/mi300x-x8-cpx.tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	partitions := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(h.Name, "/properties") || !strings.Contains(filepath.Dir(filepath.Dir(h.Name)), "nodes") || filepath.Base(filepath.Dir(filepath.Dir(h.Name))) != "nodes" {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		id := kfdDeviceID(string(b))
		if id == 0 {
			continue
		}
		partitions++
		got, ok := k.GPUByDeviceID("amd", fmt.Sprintf("%04x", id))
		if !ok || got.Name != "MI300X" || got.GFXTarget != "gfx942" {
			t.Errorf("%s: device %d -> %q %v", h.Name, id, got.Name, ok)
		}
	}
	if partitions == 0 {
		t.Error("no MI300X partitions read from the tarball")
	}
}

func kfdDeviceID(props string) int {
	m := regexp.MustCompile(`(?m)^device_id (\d+)$`).FindStringSubmatch(props)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// Facts the doctor relies on, read back from the table.
func TestGPUFacts(t *testing.T) {
	k := Default()
	get := func(name string) GPUModel {
		t.Helper()
		g, ok := k.GPUByName(name)
		if !ok {
			t.Fatalf("no row for %q", name)
		}
		return g
	}
	h := get("NVIDIA H100 80GB HBM3")
	if h.InterconnectLinks != 18 || h.InterconnectGen != 4 || !h.NVSwitch || !h.MIG || !h.ECC || h.PCIeGen != 5 || h.PCIeWidth != 16 || h.Class != "datacenter" {
		t.Errorf("H100 SXM: %+v", h)
	}
	if a := get("A100-SXM4-80GB"); a.InterconnectLinks != 12 || a.PCIeGen != 4 || !a.NVSwitch {
		t.Errorf("A100 SXM4 80GB: %+v", a)
	}
	if v := get("Tesla V100-SXM2-32GB"); v.InterconnectLinks != 6 || v.InterconnectGen != 2 {
		t.Errorf("V100: %+v", v)
	}
	if b := get("NVIDIA B200"); b.InterconnectLinks != 18 || b.InterconnectGen != 5 {
		t.Errorf("B200: %+v", b)
	}
	if m := get("AMD Instinct MI300X"); m.InterconnectLinks != 7 || m.Interconnect != "xgmi" || m.GFXTarget != "gfx942" {
		t.Errorf("MI300X: %+v", m)
	}
	if m := get("MI250X"); m.InterconnectLinks != 8 {
		t.Errorf("MI250X: %+v", m)
	}
	if g := get("NVIDIA RTX A5000"); !g.ECC || g.Class != "workstation" {
		t.Errorf("RTX A5000 supports ECC and is a workstation card: %+v", g)
	}
	if g := get("NVIDIA GeForce RTX 4090"); g.ECC || g.Class != "consumer" || g.PCIeGen != 4 {
		t.Errorf("RTX 4090 has no ECC, is consumer, Gen4: %+v", g)
	}
	if g := get("NVIDIA L40S"); g.MIG {
		t.Error("L40S is not MIG-capable")
	}
	if g := get("Tesla T4"); g.MIG || g.PCIeGen != 3 {
		t.Errorf("T4: %+v", g)
	}
}

func FuzzGPUByName(f *testing.F) {
	for _, s := range []string{"NVIDIA H100 80GB HBM3", "A100-SXM4-40GB", "NVIDIA GeForce ...", "Navi 22 [Radeon RX 6700/6700 XT / 6800M]", "L4", "", "\xff\xfeA10"} {
		f.Add(s)
	}
	k := Default()
	f.Fuzz(func(t *testing.T, name string) {
		g, ok := k.GPUByName(name)
		if !ok {
			return
		}
		if g.Name == "" || g.Source == "" {
			t.Fatalf("GPUByName(%q) returned an empty row", name)
		}
		// The row's own name must find the same row.
		if again, _ := k.GPUByName(g.Name); again.Name != g.Name {
			t.Fatalf("row %s does not find itself (got %s)", g.Name, again.Name)
		}
	})
}

// TestBoardAndGCDBandwidth: the catalog gives a board's memory bandwidth as
// its data sheet does, and a GCD of a two-GCD board (what the OS sees as a
// GPU) its half.
func TestBoardAndGCDBandwidth(t *testing.T) {
	k := Default()
	for _, tc := range []struct {
		name          string
		board, device float64
	}{
		{"MI250", 3276.8, 1638.4},
		{"MI250X", 3276.8, 1638.4},
		{"MI210", 1638.4, 1638.4},
		{"H100-SXM5-80GB", 3350, 3350},
	} {
		m, ok := k.GPUByName(tc.name)
		if !ok {
			t.Fatalf("%s: not in the catalog", tc.name)
		}
		if m.MemoryBandwidthGBps != tc.board || m.DeviceMemoryBandwidthGBps() != tc.device {
			t.Errorf("%s: board %v GB/s, device %v GB/s; want %v and %v", tc.name, m.MemoryBandwidthGBps, m.DeviceMemoryBandwidthGBps(), tc.board, tc.device)
		}
	}
}
