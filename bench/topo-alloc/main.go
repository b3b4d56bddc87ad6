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
//   - best-effort: a re-implementation written for this benchmark from the
//     documented behaviour of NVIDIA's go-gpuallocator BestEffort policy
//     (its README: "allocate GPUs in topological order, considering both
//     NVLINKs between GPUs and their placement in the PCIe hierarchy ...
//     optimized to assume that all future allocations will be of size
//     'num'"). The library itself is not used: the Go module proxy refuses
//     github.com/NVIDIA/go-gpuallocator. No code of it was copied; the
//     scoring of link classes below is kiln's own.
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
	"math/bits"
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

func run(seeds, jobs int, load float64) error {
	pickers := []picker{
		{"kiln", sched.TopologyPicker{}},
		{"best-effort", bestEffort{}},
		{"random", nil},
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "layout\tjob GPUs\tbest class\tjobs placed\t")
	for _, p := range pickers {
		fmt.Fprintf(w, "%s\t", p.name)
	}
	fmt.Fprintf(w, "%s (vs free GPUs)\t\n", pickers[0].name)
	for _, sh := range shapes.All() {
		s := sh.Build(sh.Name)
		m, err := topo.Build(s, kb.Default())
		if err != nil {
			return err
		}
		node, err := sched.NodeFromSnapshot(s, m, nil)
		if err != nil {
			return err
		}
		c, err := sched.NewCluster([]*sched.Node{node})
		if err != nil {
			return err
		}
		t := c.Topology(0)
		all := uint64(1)<<len(node.Devices) - 1
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
		"best-effort: kiln's re-implementation of the documented behaviour of NVIDIA go-gpuallocator's\n"+
		"BestEffort policy (the module proxy refuses github.com/NVIDIA/go-gpuallocator, so the library\n"+
		"is not used; no code of it is copied).\n", seeds, jobs, 100*load)
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

// bestEffort follows the documented behaviour of go-gpuallocator's
// BestEffort policy: split the free GPUs into groups of the requested size
// so that the links inside the groups are as good as possible in total, as
// if every later request had that size too, and hand out the best group.
// One GPU is the first free one. A pair is worth more the better its link
// (kiln's rank: more NVLinks, then PIX, PXB, PHB, NODE, SYS).
type bestEffort struct{}

func (bestEffort) Pick(t *sched.Topology, free uint64, k int, loc sched.Locality) (uint64, bool) {
	n := bits.OnesCount64(free)
	if k <= 0 || n < k {
		return 0, false
	}
	if loc != (sched.Locality{}) {
		return sched.TopologyPicker{}.Pick(t, free, k, loc)
	}
	if k == 1 {
		return free & -free, true
	}
	b := &partition{t: t, k: k, bestTotal: -1}
	b.split(free, n%k, 0, nil)
	return b.group, b.group != 0
}

// partition searches the ways to split the free GPUs into groups of k
// (with n mod k GPUs left over) for the best total worth.
type partition struct {
	t         *sched.Topology
	k         int
	bestTotal int
	group     uint64
}

// worth adds up the pairs of a group, a better link worth more.
func (p *partition) worth(set uint64) int {
	w := 0
	for x := set; x != 0; x &= x - 1 {
		i := bits.TrailingZeros64(x)
		for y := x & (x - 1); y != 0; y &= y - 1 {
			w += 1000 - p.t.Rank(i, bits.TrailingZeros64(y))
		}
	}
	return w
}

func (p *partition) split(left uint64, spare, total int, groups []uint64) {
	if c := bits.OnesCount64(left); c < p.k {
		if c > spare {
			return
		}
		if total > p.bestTotal {
			p.bestTotal = total
			bw := -1
			for _, g := range groups {
				if w := p.worth(g); w > bw {
					p.group, bw = g, w
				}
			}
		}
		return
	}
	first := left & -left
	rest := left &^ first
	if spare > 0 {
		p.split(rest, spare-1, total, groups)
	}
	var cand []uint64
	for x := rest; x != 0; x &= x - 1 {
		cand = append(cand, x&-x)
	}
	var choose func(from int, g uint64, need int)
	choose = func(from int, g uint64, need int) {
		if need == 0 {
			p.split(left&^g, spare, total+p.worth(g), append(groups, g))
			return
		}
		for i := from; i <= len(cand)-need; i++ {
			choose(i+1, g|cand[i], need-1)
		}
	}
	choose(0, first, p.k-1)
}
