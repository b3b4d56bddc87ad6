package sched

import (
	"bytes"
	"context"
	"testing"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/sched/shapes"
	"kiln.dev/kiln/snapshot"
)

// FuzzNodeFromSnapshot feeds snapshots (JSON) to NodeFromSnapshot: it must
// not panic, and a node it returns is one the engine accepts and can place
// on without over-committing.
func FuzzNodeFromSnapshot(f *testing.F) {
	add := func(s *snapshot.Snapshot) {
		var b bytes.Buffer
		if err := snapshot.Encode(&b, s); err != nil {
			f.Fatal(err)
		}
		f.Add(b.Bytes())
	}
	for _, sh := range shapes.All() {
		add(sh.Build(sh.Name))
	}
	for _, p := range []string{
		"../testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml",
		"../testdata/captures/nvidia-smi-nvlink/a100-sxm4-80gb-x8-azure-nvlink-s.txt",
		"../testdata/captures/rocm-smi/mi300x-x8-concise.txt",
		"../testdata/captures/nvidia-smi-topo/b300x8-cx8-bond-topo-m.txt",
	} {
		s, err := capture.Load(context.Background(), p)
		if err != nil {
			f.Fatal(err)
		}
		add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := snapshot.Decode(bytes.NewReader(data))
		if err != nil {
			return
		}
		n, err := NodeFromSnapshot(s, nil, nil)
		if err != nil {
			return
		}
		if len(n.Devices) != len(s.GPUs) || len(n.Links) != len(n.Devices) {
			t.Fatalf("%d devices, %d link rows for %d GPUs", len(n.Devices), len(n.Links), len(s.GPUs))
		}
		if n.CPUMilli < 0 {
			t.Fatalf("negative CPU %d", n.CPUMilli)
		}
		n.Name = "fuzz"
		c, err := NewCluster([]*Node{n})
		if err != nil {
			t.Fatalf("NodeFromSnapshot returned a node NewCluster refuses: %v", err)
		}
		st := NewState(c)
		sch := Default(1)
		for i, r := range []Request{{GPUs: 2}, {GPUMilli: 300, GPUMemoryBytes: 1 << 30}, {MIGProfile: "1g.10gb"}, {GPUs: 1, Locality: Locality{SameNUMA: true}}} {
			r.ID = string(rune('a' + i))
			if a, err := sch.Place(st, r); err == nil {
				if err := st.CommitOne(a); err != nil {
					t.Fatalf("commit of a fresh placement: %v", err)
				}
			}
		}
		if err := st.Verify(); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzPlace throws arbitrary request fields at a mixed cluster.
func FuzzPlace(f *testing.F) {
	f.Add(2, 0, uint64(0), "", int64(1000), uint64(1<<30), "H100", true, false)
	f.Add(0, 500, uint64(8<<30), "", int64(0), uint64(0), "", false, false)
	f.Add(0, 0, uint64(0), "3g.40gb", int64(0), uint64(0), "", false, true)
	f.Add(-3, 1200, uint64(1<<62), "x", int64(-5), uint64(1<<63), "A10", true, true)
	c := propCluster(f)
	f.Fuzz(func(t *testing.T, gpus, milli int, gmem uint64, profile string, cpu int64, mem uint64, model string, nv, numa bool) {
		st := NewState(c)
		sch := Default(3)
		for i := 0; i < 3; i++ {
			r := Request{ID: string(rune('a' + i)), GPUs: gpus, GPUMilli: milli, GPUMemoryBytes: gmem, MIGProfile: profile,
				CPUMilli: cpu, MemoryBytes: mem, Locality: Locality{SameNVLinkIsland: nv, SameNUMA: numa}}
			if model != "" {
				r.Constraints.Models = []string{model}
			}
			a, err := sch.Place(st, r)
			if err != nil {
				continue
			}
			if err := st.CommitOne(a); err != nil {
				t.Fatalf("commit of a fresh placement: %v", err)
			}
		}
		if err := st.Verify(); err != nil {
			t.Fatal(err)
		}
	})
}
