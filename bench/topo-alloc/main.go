// Command topo-alloc measures how well GPU sets are chosen inside a node:
// on four server layouts (8 GPUs in NVLink pairs; 8 GPUs on two PCIe
// switches; 8 GPUs all-to-all through NVSwitches; 4 GPUs each on its own
// root port), built as snapshots and rated by topo.Build, a seeded stream
// of 1-, 2-, 4- and 8-GPU jobs arrives and leaves, and each multi-GPU job is
// checked: did its slowest GPU pair get the best link class the layout
// offers for that many GPUs?
//
// Three pickers run on the same stream inside kiln's scheduler:
//
//   - kiln: sched.TopologyPicker (slowest pair fastest, then keep
//     well-connected free sets whole).
//   - gpuallocator: NVIDIA's github.com/NVIDIA/go-gpuallocator v0.6.0,
//     used as a library: its BestEffort policy (the one NVIDIA's Kubernetes
//     device plugin uses) allocates from devices built out of kiln's
//     topology of the same layout (nvidia.go).
//   - random: a uniformly random set of free GPUs.
//
// Whether a job fits depends only on how many GPUs are free, so all three
// pickers accept exactly the same jobs; only the sets differ.
//
//	go run ./bench/topo-alloc -seeds 5 -jobs 4000
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"text/tabwriter"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/sched"
	"kiln.dev/kiln/sched/shapes"
	"kiln.dev/kiln/topo"
)

func main() {
	seeds := flag.Int("seeds", 5, "number of seeds (1..n)")
	jobs := flag.Int("jobs", 4000, "jobs per seed and layout")
	load := flag.Float64("load", 0.75, "offered load as a share of the node's GPUs")
	flag.Parse()
	if err := run(*seeds, *jobs, *load); err != nil {
		fmt.Fprintln(os.Stderr, "topo-alloc:", err)
		os.Exit(1)
	}
}

type picker struct {
	name string
	p    sched.Picker
}

// result counts, per job size, the multi-GPU jobs placed and how many got
// the best class of the layout (empty node) and the best of the GPUs free
// at that moment.
type result struct {
	placed, bestLayout, bestNow map[int]int
	accepted                    int
}

// layout is one server layout as a one-node cluster, with the library's
// picker for it.
type layout struct {
	c      *sched.Cluster
	node   *sched.Node
	t      *sched.Topology
	all    uint64 // every GPU of the node
	nvidia *nvidiaPicker
}

func newLayout(sh shapes.Shape) (*layout, error) {
	s := sh.Build(sh.Name)
	m, err := topo.Build(s, kb.Default())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sh.Name, err)
	}
	node, err := sched.NodeFromSnapshot(s, m, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sh.Name, err)
	}
	c, err := sched.NewCluster([]*sched.Node{node})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sh.Name, err)
	}
	nv, err := newNVIDIAPicker(s, node, kb.Default())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sh.Name, err)
	}
	return &layout{c: c, node: node, t: c.Topology(0), all: uint64(1)<<len(node.Devices) - 1, nvidia: nv}, nil
}

func run(seeds, jobs int, load float64) error {
	names := []string{"kiln", "gpuallocator", "random"}
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "layout\tjob GPUs\tbest class\tjobs placed\t")
	for _, n := range names {
		fmt.Fprintf(w, "%s\t", n)
	}
	fmt.Fprintf(w, "%s (vs free GPUs)\t\n", names[0])
	for _, sh := range shapes.All() {
		l, err := newLayout(sh)
		if err != nil {
			return err
		}
		c, t, all, node := l.c, l.t, l.all, l.node
		pickers := []picker{{names[0], sched.TopologyPicker{}}, {names[1], l.nvidia}, {names[2], nil}}
		results := make([]result, len(pickers))
		for i, p := range pickers {
			r := result{placed: map[int]int{}, bestLayout: map[int]int{}, bestNow: map[int]int{}}
			for seed := 1; seed <= seeds; seed++ {
				pk := p.p
				if pk == nil {
					pk = sched.RandomPicker{Seed: uint64(seed)}
				}
				if err := stream(c, pk, uint64(seed), jobs, load, t, all, &r); err != nil {
					return fmt.Errorf("%s, %s: %w", sh.Name, p.name, err)
				}
			}
			results[i] = r
		}
		for i := range results {
			if results[i].accepted != results[0].accepted {
				return fmt.Errorf("%s: pickers accepted different jobs (%d vs %d)", sh.Name, results[i].accepted, results[0].accepted)
			}
		}
		for _, k := range []int{2, 4, 8} {
			if k > len(node.Devices) {
				continue
			}
			best, _ := t.BestRank(all, k)
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t", sh.Name, k, className(t, all, k, best), results[0].placed[k])
			for _, r := range results {
				fmt.Fprintf(w, "%s\t", pct(r.bestLayout[k], r.placed[k]))
			}
			fmt.Fprintf(w, "%s\t\n", pct(results[0].bestNow[k], results[0].placed[k]))
		}
		fmt.Fprintf(w, "%s\tall multi\t\t%d\t", sh.Name, sum(results[0].placed))
		for _, r := range results {
			fmt.Fprintf(w, "%s\t", pct(sum(r.bestLayout), sum(r.placed)))
		}
		fmt.Fprintf(w, "%s\t\n", pct(sum(results[0].bestNow), sum(results[0].placed)))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Printf("\nShare of multi-GPU jobs whose slowest GPU pair has the best link class the layout offers for that\n"+
		"many GPUs (an empty node); the last column: the best class the GPUs free at arrival allowed.\n"+
		"%d seeds x %d jobs per layout; job sizes 1/2/4/8 GPUs at 40/30/20/10 %% (sizes above the node's\n"+
		"GPU count are not drawn); exponential durations for an offered load of %.0f %% of the GPUs;\n"+
		"a job that does not fit is dropped.\n"+
		"gpuallocator: the BestEffort policy of NVIDIA's github.com/NVIDIA/go-gpuallocator v0.6.0 (the\n"+
		"library, as NVIDIA's device plugin uses it), given kiln's topology of each layout as NVML would\n"+
		"report it: the PCIe level of every pair plus the NVLinks bonded between them.\n", seeds, jobs, 100*load)
	for _, sh := range shapes.All() {
		fmt.Printf("  %-16s %s\n", sh.Name, sh.Describe)
	}
	return nil
}

func className(t *sched.Topology, all uint64, k, rank int) string {
	set, _ := sched.TopologyPicker{}.Pick(t, all, k, sched.Locality{})
	_, _, a, b := t.Worst(set)
	if a < 0 {
		return "-"
	}
	if r := t.Rank(a, b); r != rank {
		return fmt.Sprintf("rank %d", rank)
	}
	return t.Class(a, b)
}

func sum(m map[int]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func pct(a, b int) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
}

type job struct {
	id  string
	end float64
}

// stream runs one seeded arrival stream on the one-node cluster c.
func stream(c *sched.Cluster, pk sched.Picker, seed uint64, jobs int, load float64, t *sched.Topology, all uint64, r *result) error {
	rng := rand.New(rand.NewPCG(seed, 0x70b0))
	ngpu := len(c.Nodes()[0].Devices)
	sizes, weights := []int{}, []float64{}
	for i, k := range []int{1, 2, 4, 8} {
		if k <= ngpu {
			sizes = append(sizes, k)
			weights = append(weights, []float64{40, 30, 20, 10}[i])
		}
	}
	wsum, mean := 0.0, 0.0
	for i, wt := range weights {
		wsum += wt
		mean += wt * float64(sizes[i])
	}
	mean /= wsum
	// One arrival per time unit; Little's law gives the mean duration.
	meanDur := load * float64(ngpu) / mean
	s := sched.Default(seed)
	s.Picker = pk
	st := sched.NewState(c)
	var running []job
	for i := 0; i < jobs; i++ {
		now := float64(i)
		kept := running[:0]
		for _, j := range running {
			if j.end <= now {
				if err := st.Release(j.id); err != nil {
					return err
				}
				continue
			}
			kept = append(kept, j)
		}
		running = kept
		x := rng.Float64() * wsum
		k := sizes[len(sizes)-1]
		for i, wt := range weights {
			if x < wt {
				k = sizes[i]
				break
			}
			x -= wt
		}
		dur := rng.ExpFloat64() * meanDur
		id := fmt.Sprintf("j%d", i)
		free := st.Node(0).FreeWhole()
		a, err := s.Place(st, sched.Request{ID: id, GPUs: k})
		if err != nil {
			continue
		}
		if err := st.CommitOne(a); err != nil {
			return err
		}
		r.accepted++
		running = append(running, job{id: id, end: now + dur})
		if k < 2 {
			continue
		}
		var set uint64
		for _, sh := range a.Devices {
			set |= 1 << sh.Device
		}
		got, _, _, _ := t.Worst(set)
		bestAll, _ := t.BestRank(all, k)
		bestNow, _ := t.BestRank(free, k)
		r.placed[k]++
		if got <= bestAll {
			r.bestLayout[k]++
		}
		if got <= bestNow {
			r.bestNow[k]++
		}
	}
	return nil
}
