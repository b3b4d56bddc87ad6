package kfd

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"testing"
	"testing/fstest"

	"kiln.dev/kiln/snapshot"
)

const (
	mi210Dir   = "../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie"
	mi300xTarG = "../testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz"
)

func TestGFXTarget(t *testing.T) {
	for _, tc := range []struct {
		v    uint64
		want string
	}{
		{90010, "gfx90a"},
		{90402, "gfx942"},
		{110000, "gfx1100"},
		{90012, "gfx90c"},
		{110501, "gfx1151"},
		{100300, "gfx1030"},
		{90008, "gfx908"},
		{0x0b0501, "gfx1151"}, // hex-packed form
		{0, ""},
		{91600, ""}, // minor 16 cannot be one hex digit
	} {
		if got := GFXTarget(tc.v); got != tc.want {
			t.Errorf("GFXTarget(%d) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestPCIAddress(t *testing.T) {
	for _, tc := range []struct {
		dom, loc uint64
		want     string
	}{
		{0, 25344, "0000:63:00.0"},
		{0, 1287, "0000:05:00.7"},
		{0, 58624, "0000:e5:00.0"},
		{1, 0x0108, "0001:01:01.0"},
		{0x10000, 0, ""},
	} {
		if got := PCIAddress(tc.dom, tc.loc); got != tc.want {
			t.Errorf("PCIAddress(%d, %d) = %q, want %q", tc.dom, tc.loc, got, tc.want)
		}
	}
}

func gpuByPCI(t *testing.T, s *snapshot.Snapshot, addr string) snapshot.GPU {
	t.Helper()
	for _, g := range s.GPUs {
		if g.PCIAddress == addr {
			return g
		}
	}
	t.Fatalf("no GPU %s", addr)
	return snapshot.GPU{}
}

func TestReadMI210TwoHives(t *testing.T) {
	s, err := Read(os.DirFS(mi210Dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 8 {
		t.Fatalf("GPUs = %d, want 8", len(s.GPUs))
	}
	if len(s.Host.NUMANodes) != 2 {
		t.Errorf("NUMA nodes = %d, want 2", len(s.Host.NUMANodes))
	}
	hives := map[string][]int{}
	for _, g := range s.GPUs {
		if g.GFXTarget != "gfx90a" || g.DeviceID != "740f" || g.Vendor != "amd" {
			t.Errorf("GPU %s: gfx %q device %q vendor %q, want gfx90a 740f amd", g.PCIAddress, g.GFXTarget, g.DeviceID, g.Vendor)
		}
		if g.Partition != nil {
			t.Errorf("GPU %s: partition %+v on an MI210", g.PCIAddress, g.Partition)
		}
		if g.MemoryTotalBytes != 0 {
			t.Errorf("GPU %s: memory %d from local_mem_size 0", g.PCIAddress, g.MemoryTotalBytes)
		}
		if len(g.KFDNodes) != 1 {
			t.Fatalf("GPU %s: KFD nodes %v", g.PCIAddress, g.KFDNodes)
		}
		hives[g.XGMIHive] = append(hives[g.XGMIHive], g.KFDNodes[0])
	}
	if got := hives["12609507387757274807"]; len(got) != 4 || !sameSet(got, []int{2, 3, 4, 5}) {
		t.Errorf("hive 12609507387757274807 = nodes %v, want 2-5", got)
	}
	if got := hives["18091350218769748594"]; len(got) != 4 || !sameSet(got, []int{6, 7, 8, 9}) {
		t.Errorf("hive 18091350218769748594 = nodes %v, want 6-9", got)
	}
	g := gpuByPCI(t, s, "0000:63:00.0")
	if g.KFDNodes[0] != 2 || g.NUMANode == nil || *g.NUMANode != 0 || g.UniqueID != "0x1901ead3a2ecd4a6" {
		t.Errorf("0000:63:00.0 = nodes %v numa %v unique %q", g.KFDNodes, g.NUMANode, g.UniqueID)
	}
	g = gpuByPCI(t, s, "0000:e3:00.0") // node 6, hive 2, socket 1
	if g.KFDNodes[0] != 6 || g.NUMANode == nil || *g.NUMANode != 1 {
		t.Errorf("0000:e3:00.0 = nodes %v numa %v, want node 6 on NUMA 1", g.KFDNodes, g.NUMANode)
	}

	var xgmi, pcie int
	for _, l := range s.Links {
		switch l.Kind {
		case snapshot.LinkXGMI:
			xgmi++
			if l.Weight != 15 || l.Hops != 1 || l.BandwidthGBpsUni != 50 {
				t.Errorf("xgmi %s-%s: weight %d hops %d bw %v, want 15 1 50", l.A, l.B, l.Weight, l.Hops, l.BandwidthGBpsUni)
			}
			if gpuByPCI(t, s, l.A).XGMIHive != gpuByPCI(t, s, l.B).XGMIHive {
				t.Errorf("xgmi link %s-%s crosses hives", l.A, l.B)
			}
		case snapshot.LinkPCIe:
			pcie++
			if l.Weight != 72 {
				t.Errorf("pcie %s-%s: weight %d, want 72", l.A, l.B, l.Weight)
			}
		}
	}
	// Two fully connected hives of 4: 2 x 6 xGMI pairs; 4 x 4 cross-hive PCIe paths.
	if xgmi != 12 || pcie != 16 {
		t.Errorf("links: %d xgmi, %d pcie; want 12, 16", xgmi, pcie)
	}
}

func sameSet(a, b []int) bool {
	m := map[int]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		m[x]--
	}
	for _, v := range m {
		if v != 0 {
			return false
		}
	}
	return true
}

// untar unpacks a .tar.gz capture into memory.
func untar(t testing.TB, file string) fstest.MapFS {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	m := fstest.MapFS{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		m[path.Clean(strings.TrimPrefix(h.Name, "./"))] = &fstest.MapFile{Data: b}
	}
	return m
}

func TestReadMI300XCPX(t *testing.T) {
	s, err := Read(untar(t, mi300xTarG)) // nested mi300x-x8-cpx/topology/
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 8 {
		t.Fatalf("GPUs = %d, want 8 physical MI300X (63 partition nodes)", len(s.GPUs))
	}
	nodes := 0
	for _, g := range s.GPUs {
		nodes += len(g.KFDNodes)
		if g.GFXTarget != "gfx942" || g.DeviceID != "74a1" || g.XGMIHive != "15188982192727901047" {
			t.Errorf("GPU %s: gfx %q device %q hive %q", g.PCIAddress, g.GFXTarget, g.DeviceID, g.XGMIHive)
		}
		if g.Partition == nil || g.Partition.Compute != "CPX" {
			t.Errorf("GPU %s: partition %+v, want CPX", g.PCIAddress, g.Partition)
		}
		if g.MemoryTotalBytes != 0 {
			t.Errorf("GPU %s: memory %d read from local_mem_size 0", g.PCIAddress, g.MemoryTotalBytes)
		}
	}
	if nodes != 63 {
		t.Errorf("partition nodes = %d, want 63", nodes)
	}
	g := gpuByPCI(t, s, "0000:05:00.0")
	if g.Partition.Count != 8 || !sameSet(g.KFDNodes, []int{2, 3, 4, 5, 6, 7, 8, 9}) ||
		g.UniqueID != "0xe3aa140f9a5f9e31" || g.NUMANode == nil || *g.NUMANode != 0 {
		t.Errorf("0000:05:00.0 = %+v nodes %v unique %q numa %v", g.Partition, g.KFDNodes, g.UniqueID, g.NUMANode)
	}
	g = gpuByPCI(t, s, "0000:e5:00.0")
	if g.Partition.Count != 7 || len(g.KFDNodes) != 7 || g.NUMANode == nil || *g.NUMANode != 1 {
		t.Errorf("0000:e5:00.0 = %+v nodes %v numa %v, want 7 partitions on NUMA 1", g.Partition, g.KFDNodes, g.NUMANode)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, "0000:e5:00.0 shows 7") {
		t.Errorf("notes = %+v, want one about 0000:e5:00.0's 7 partitions", s.Notes)
	}
	if len(s.Links) != 28 {
		t.Errorf("links = %d, want 28 (every pair of 8 GPUs)", len(s.Links))
	}
	for _, l := range s.Links {
		if l.Kind != snapshot.LinkXGMI || l.Weight != 41 || l.A == l.B {
			t.Errorf("link %+v, want xgmi weight 41 between two GPUs", l)
		}
	}
	if len(s.Host.NUMANodes) != 2 {
		t.Errorf("NUMA nodes = %d, want 2", len(s.Host.NUMANodes))
	}
}

func TestReadErrors(t *testing.T) {
	cpu := "cpu_cores_count 8\nsimd_count 0\n"
	for name, fsys := range map[string]fstest.MapFS{
		"empty":          {"x": {Data: []byte("1")}},
		"no KFD keys":    {"nodes/0/properties": {Data: []byte("foo 1\n")}},
		"bad properties": {"nodes/0/properties": {Data: []byte(cpu)}, "nodes/1/properties": {Data: []byte("simd_count\n")}},
		"link without ends": {
			"nodes/0/properties":            {Data: []byte(cpu)},
			"nodes/0/io_links/0/properties": {Data: []byte("type 2\nweight 20\n")},
		},
	} {
		if _, err := Read(fsys); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestRootFindsNestedTopology(t *testing.T) {
	fsys := fstest.MapFS{
		"host1/topology/nodes/0/properties":             {Data: []byte("cpu_cores_count 8\nsimd_count 0\n")},
		"host1/topology/nodes/1/properties":             {Data: []byte("cpu_cores_count 0\nsimd_count 64\ngfx_target_version 110000\nlocation_id 768\ndevice_id 29772\n")},
		"host1/topology/nodes/1/io_links/0/properties":  {Data: []byte("type 2\nnode_from 1\nnode_to 0\nweight 20\n")},
		"host1/topology/nodes/1/mem_banks/0/properties": {Data: []byte("heap_type 1\nsize_in_bytes 25753026560\n")},
		"host1/topology/generation_id":                  {Data: []byte("3\n")},
	}
	s, err := Read(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 1 || s.GPUs[0].GFXTarget != "gfx1100" || s.GPUs[0].PCIAddress != "0000:03:00.0" ||
		s.GPUs[0].MemoryTotalBytes != 25753026560 || s.GPUs[0].Partition != nil {
		t.Errorf("GPUs = %+v", s.GPUs)
	}
}

// TestMissingNodes: a copy of the tree that lacks a node, or holds one whose
// properties are empty (a hung GPU's sysfs reads fail), is the trace of a
// GPU the kernel knew: a tool-error event says which; a whole tree gives
// none.
func TestMissingNodes(t *testing.T) {
	cpu := []byte("cpu_cores_count 8\nsimd_count 0\n")
	gpu := func(loc int) []byte {
		return fmt.Appendf(nil, "cpu_cores_count 0\nsimd_count 304\ngfx_target_version 90402\nlocation_id %d\ndevice_id 29857\nunique_id %d\n", loc, loc)
	}
	whole := fstest.MapFS{
		"nodes/0/properties": {Data: cpu},
		"nodes/1/properties": {Data: gpu(768)},
		"nodes/2/properties": {Data: gpu(1024)},
	}
	s, err := Read(whole)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Events) != 0 {
		t.Errorf("whole tree: events %+v", s.Events)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"gap": {
			"nodes/0/properties": {Data: cpu},
			"nodes/2/properties": {Data: gpu(1024)},
		},
		"empty properties": {
			"nodes/0/properties": {Data: cpu},
			"nodes/1/properties": {Data: []byte("")},
			"nodes/2/properties": {Data: gpu(1024)},
		},
		"dangling link": {
			"nodes/0/properties":            {Data: cpu},
			"nodes/1/properties":            {Data: gpu(768)},
			"nodes/1/io_links/0/properties": {Data: []byte("type 11\nnode_from 1\nnode_to 2\nweight 15\n")},
		},
	} {
		s, err := Read(fsys)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(s.Events) != 1 || s.Events[0].Kind != snapshot.EventToolError || !strings.Contains(s.Events[0].Message, "node") {
			t.Errorf("%s: events %+v, want one tool error naming the node", name, s.Events)
		}
	}
}
