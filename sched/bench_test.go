package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"kiln.dev/kiln/topo"
)

// nodeShape is a node type of the Alibaba GPU trace (cluster-trace-gpu-v2023:
// 1,213 GPU nodes, 617 with 8 GPUs, 518 with 2, 54 with 4, 24 with 1).
type nodeShape struct {
	count     int
	model     string
	gpus      int
	cpuMilli  int64
	memGiB    uint64
	gpuMemGiB uint64
	layout    string // pairs, nvswitch, pcie
}

var alibabaShapes = []nodeShape{
	{549, "G2", 8, 96000, 384, 32, "pairs"},
	{39, "G3", 8, 128000, 768, 80, "nvswitch"},
	{29, "V100M32", 8, 96000, 512, 32, "pairs"},
	{387, "T4", 2, 104000, 512, 16, "pcie"},
	{107, "P100", 2, 64000, 256, 16, "pcie"},
	{24, "V100M16", 2, 64000, 256, 16, "pcie"},
	{54, "V100M16", 4, 96000, 384, 16, "pairs"},
	{24, "T4", 1, 32000, 128, 16, "pcie"},
}

func shapeLinks(gpus int, layout string) [][]Link {
	links := make([][]Link, gpus)
	for i := range links {
		links[i] = make([]Link, gpus)
		for j := range links[i] {
			var c topo.Cell
			switch {
			case i == j:
				c = topo.Cell{Class: "X"}
			case layout == "nvswitch":
				c = topo.Cell{Class: "NV18", Links: 18}
			case layout == "pairs" && i/2 == j/2:
				c = topo.Cell{Class: "NV2", Links: 2}
			case i/4 == j/4:
				c = topo.Cell{Class: "PIX"}
			default:
				c = topo.Cell{Class: "SYS"}
			}
			links[i][j] = Link{Class: c.Class, Rank: c.Rank()}
		}
	}
	return links
}

// alibabaNodes builds scale copies of the trace's 1,213 GPU nodes.
func alibabaNodes(scale int) []*Node {
	var out []*Node
	for s := 0; s < scale; s++ {
		for _, sh := range alibabaShapes {
			for k := 0; k < sh.count; k++ {
				n := &Node{Name: fmt.Sprintf("node-%d-%s-%d-%d", s, sh.model, sh.gpus, k), CPUMilli: sh.cpuMilli, MemoryBytes: sh.memGiB << 30,
					Driver: "535.54.03", CUDA: "12.2", Links: shapeLinks(sh.gpus, sh.layout)}
				for g := 0; g < sh.gpus; g++ {
					n.Devices = append(n.Devices, Device{Index: g, Vendor: "nvidia", Model: sh.model, MemoryBytes: sh.gpuMemGiB << 30, NUMA: g * 2 / max(sh.gpus, 2)})
				}
				out = append(out, n)
			}
		}
	}
	return out
}

// traceLikeRequest draws a request with the trace's mix: mostly shares of
// one GPU and single GPUs, some 2-, 4- and 8-GPU tasks.
func traceLikeRequest(rng *rand.Rand, id string) Request {
	r := Request{ID: id, CPUMilli: int64(1000 * (1 + rng.IntN(8))), MemoryBytes: uint64(2+rng.IntN(30)) << 30}
	switch x := rng.IntN(100); {
	case x < 45:
		r.GPUMilli = []int{100, 200, 250, 300, 500, 500, 500, 600, 700, 800}[rng.IntN(10)]
	case x < 85:
		r.GPUs = 1
	case x < 92:
		r.GPUs = 2
	case x < 96:
		r.GPUs = 4
	default:
		r.GPUs = 8
	}
	return r
}

// warm fills the cluster to about fill of its GPUs with trace-like tasks.
func warm(b testing.TB, c *Cluster, s *Scheduler, fill float64, rng *rand.Rand) (*State, []string) {
	st := NewState(c)
	total := 0
	for _, n := range c.nodes {
		total += 1000 * len(n.Devices)
	}
	used := 0
	var live []string
	for i := 0; float64(used) < fill*float64(total) && i < 10*total; i++ {
		r := traceLikeRequest(rng, fmt.Sprintf("w%d", i))
		a, err := s.Place(st, r)
		if err != nil {
			continue
		}
		if err := st.CommitOne(a); err != nil {
			b.Fatal(err)
		}
		for _, sh := range a.Devices {
			used += sh.Milli
		}
		live = append(live, r.ID)
	}
	return st, live
}

func BenchmarkPlace(b *testing.B) {
	kinds := []struct {
		name string
		req  func(rng *rand.Rand, id string) Request
	}{
		{"single", func(_ *rand.Rand, id string) Request {
			return Request{ID: id, GPUs: 1, CPUMilli: 4000, MemoryBytes: 16 << 30}
		}},
		{"fraction", func(rng *rand.Rand, id string) Request {
			return Request{ID: id, GPUMilli: 50 * (1 + rng.IntN(19)), GPUMemoryBytes: uint64(1+rng.IntN(8)) << 30, CPUMilli: 2000}
		}},
		{"eight", func(_ *rand.Rand, id string) Request {
			return Request{ID: id, GPUs: 8, CPUMilli: 32000, MemoryBytes: 128 << 30}
		}},
	}
	for _, scale := range []int{1, 10} {
		c, err := NewCluster(alibabaNodes(scale))
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range kinds {
			b.Run(fmt.Sprintf("nodes=%d/%s", len(c.nodes), k.name), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(42, uint64(scale)))
				s := Default(42)
				st, live := warm(b, c, s, 0.7, rng)
				durs := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					r := k.req(rng, fmt.Sprintf("b%d", i))
					t0 := time.Now()
					a, err := s.Place(st, r)
					durs = append(durs, time.Since(t0))
					if err != nil {
						continue
					}
					// Keep the load steady: commit, then release an older task.
					b.StopTimer()
					if err := st.CommitOne(a); err != nil {
						b.Fatal(err)
					}
					live = append(live, r.ID)
					j := rng.IntN(len(live))
					if err := st.Release(live[j]); err != nil {
						b.Fatal(err)
					}
					live[j] = live[len(live)-1]
					live = live[:len(live)-1]
					b.StartTimer()
				}
				b.StopTimer()
				slices.Sort(durs)
				if len(durs) > 0 {
					b.ReportMetric(float64(durs[len(durs)*99/100].Nanoseconds())/1e3, "p99-µs")
					b.ReportMetric(float64(durs[len(durs)/2].Nanoseconds())/1e3, "p50-µs")
				}
			})
		}
	}
}

// A short run of the latency benchmark's setting that asserts the target,
// with a wide margin for slow, shared test machines.
func TestPlacementLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("latency check skipped in -short mode")
	}
	c, err := NewCluster(alibabaNodes(1))
	if err != nil {
		t.Fatal(err)
	}
	if c.Groups() > 10 {
		t.Errorf("%d groups for 8 node types", c.Groups())
	}
	rng := rand.New(rand.NewPCG(1, 1))
	s := Default(1)
	st, _ := warm(t, c, s, 0.7, rng)
	var durs []time.Duration
	for i := 0; i < 500; i++ {
		r := traceLikeRequest(rng, fmt.Sprintf("q%d", i))
		t0 := time.Now()
		_, _ = s.Place(st, r)
		durs = append(durs, time.Since(t0))
	}
	slices.Sort(durs)
	if p99 := durs[len(durs)*99/100]; p99 > 20*time.Millisecond {
		t.Errorf("p99 placement latency %v at 1,213 nodes", p99)
	}
}
