package kfd

import (
	"os"
	"testing"
	"testing/fstest"

	"kiln.dev/kiln/snapshot"
)

func FuzzParseProperties(f *testing.F) {
	for _, p := range []string{"nodes/0/properties", "nodes/2/properties", "nodes/2/io_links/1/properties"} {
		b, err := os.ReadFile(mi210Dir + "/" + p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("a b c\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseProperties(data)
		if err != nil {
			return
		}
		for k := range p {
			p.Uint(k)
		}
	})
}

// FuzzRead builds a two-node tree from fuzzed GPU properties and io_link
// properties and checks the snapshot's invariants.
func FuzzRead(f *testing.F) {
	cpu, err := os.ReadFile(mi210Dir + "/nodes/0/properties")
	if err != nil {
		f.Fatal(err)
	}
	gpu, _ := os.ReadFile(mi210Dir + "/nodes/2/properties")
	link, _ := os.ReadFile(mi210Dir + "/nodes/2/io_links/0/properties")
	xgmi, _ := os.ReadFile(mi210Dir + "/nodes/2/io_links/1/properties")
	f.Add(gpu, link, gpu)
	f.Add(gpu, xgmi, []byte("simd_count 1\nlocation_id 99999999\nunique_id 1\n"))
	f.Add([]byte("simd_count 1\nnum_xcc 1\nunique_id 7\n"), xgmi, []byte("simd_count 1\nnum_xcc 1\nunique_id 7\n"))
	f.Fuzz(func(t *testing.T, node2, link2, node3 []byte) {
		fsys := fstest.MapFS{
			"nodes/0/properties":             {Data: cpu},
			"nodes/2/properties":             {Data: node2},
			"nodes/2/io_links/0/properties":  {Data: link2},
			"nodes/3/properties":             {Data: node3},
			"nodes/3/p2p_links/0/properties": {Data: link2},
		}
		s, err := Read(fsys)
		if err != nil {
			return
		}
		for _, g := range s.GPUs {
			if g.PCIAddress != "" {
				if c, err := snapshot.CanonicalPCI(g.PCIAddress); err != nil || c != g.PCIAddress {
					t.Errorf("PCI address %q is not canonical", g.PCIAddress)
				}
			}
			if g.Partition != nil && g.Partition.Count < 0 {
				t.Errorf("negative partition count %d", g.Partition.Count)
			}
			if g.NUMANode != nil && *g.NUMANode < 0 {
				t.Errorf("negative NUMA node")
			}
		}
		for _, l := range s.Links {
			if l.A == l.B || l.Weight < 0 || l.Hops < 0 {
				t.Errorf("bad link %+v", l)
			}
		}
	})
}
