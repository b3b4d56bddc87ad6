package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"kiln.dev/kiln/sched/frag"
)

// policy places tasks. The simulator filters nodes (frag.Fits), asks the
// policy to score every node that fits, picks the highest score (a uniformly
// random one among equal scores, as the Kubernetes scheduler does), then
// asks the policy which GPUs of that node to use.
type policy interface {
	// score rates node i for t, higher is better. It is called only for
	// nodes where t fits.
	score(i int, t *task) float64
	// gpus chooses the GPUs of node i for t, after score was called for
	// it; nil for a task without GPUs.
	gpus(i int, t *task) []int
}

// PolicyInfo describes a policy the simulator knows.
type PolicyInfo struct {
	Name  string
	Paper string // the policy's name in the paper's figures
	About string
}

// Policies lists the policies in the order the paper's figures use, then
// kiln's.
var Policies = []PolicyInfo{
	{"random", "Random", "random-fit: a random node where the task fits, a random GPU with room"},
	{"dotprod", "DotProd", "Tetris dot product of free (CPU, GPU) and request, normalised by the largest node; the most aligned node"},
	{"clustering", "GpuClustering", "put tasks of one kind (fractional, 1, 2, 4, 8 GPUs) together; then the fullest node"},
	{"packing", "GpuPacking", "partly used GPUs first, then idle GPUs of used nodes, then idle nodes"},
	{"bestfit", "BestFit", "the node with the least free CPU and GPU left after placing"},
	{"fgd", "FGD", "fragmentation gradient descent against the target workload (Weng et al., ATC '23)"},
	{"kiln", "kiln", "kiln's default: FGD's score against a memory-aware target that keeps the nodes scarce shapes need; GPUs a share closes first; capacity no popular share fills counts against a placement; ties broken by CPU per GPU and by sparing GPU models that constrained tasks need"},
}

// PolicyNames are the names of Policies.
func PolicyNames() []string {
	out := make([]string, len(Policies))
	for i, p := range Policies {
		out[i] = p.Name
	}
	return out
}

// ParsePolicies reads a comma-separated policy list; "all" means every one.
func ParsePolicies(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return PolicyNames(), nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.ToLower(strings.TrimSpace(p))
		if p == "" {
			continue
		}
		if !slices.Contains(PolicyNames(), p) {
			return nil, fmt.Errorf("unknown policy %q: want one of %s", p, strings.Join(PolicyNames(), ", "))
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no policy given: want one or more of %s", strings.Join(PolicyNames(), ", "))
	}
	return out, nil
}

// ParseSeeds reads a seed list: a range "42-51", numbers "42,43,50", or
// both ("42-45,50").
func ParseSeeds(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if lo, hi, ok := strings.Cut(part, "-"); ok && lo != "" {
			a, err1 := strconv.ParseInt(strings.TrimSpace(lo), 10, 64)
			b, err2 := strconv.ParseInt(strings.TrimSpace(hi), 10, 64)
			if err1 != nil || err2 != nil || b < a {
				return nil, fmt.Errorf("cannot read %q as a seed range like 42-51", part)
			}
			if b-a >= 1000 {
				return nil, fmt.Errorf("range %q has more than 1000 seeds", part)
			}
			for v := a; v <= b; v++ {
				out = append(out, v)
			}
			continue
		}
		v, err := strconv.ParseInt(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cannot read %q as a seed", part)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("no seed given")
	}
	return out, nil
}

// env is what a policy may read.
type env struct {
	c      *cluster
	rng    *rand.Rand
	shapes int // number of task shapes
	// memShapes is the number of (shape, memory) pairs (task.memShape).
	memShapes int
	target    *frag.Workload
	tasks     []frag.Task // the trace's tasks
}

func newPolicy(name string, e *env) policy {
	switch name {
	case "random":
		return &randomFit{e}
	case "dotprod":
		return &dotProduct{e}
	case "clustering":
		return &gpuClustering{e}
	case "packing":
		return &gpuPacking{e}
	case "bestfit":
		return &bestFit{e}
	case "fgd":
		return &fgd{env: e, cache: newScoreCache(len(e.c.nodes), e.shapes)}
	case "kiln":
		return newKilnPolicy(e)
	}
	panic("sim: unknown policy " + name)
}

// Normalisers of the authors' simulator: the largest node it expects.
const (
	maxSpecCPU = 128000 // milli-cores
	maxSpecGPU = 8000   // milli-GPU
)

// tightestGPUs is the "best" GPU choice of the authors' simulator: a
// fractional task takes the GPU with the least room that holds it, whole
// GPUs are the first idle ones.
func tightestGPUs(n frag.Node, t *task) []int {
	if !t.WantsGPU() {
		return nil
	}
	if t.Sharing() {
		return []int{frag.TightestGPU(n.Free, t.GPUMilli)}
	}
	return frag.FirstFree(n.Free, t.GPUMilli, t.GPUs)
}

type randomFit struct{ *env }

// score is a fresh random number: the highest of them is a uniformly random
// node among those that fit, as the authors' random-score plugin picks.
func (p *randomFit) score(int, *task) float64 { return p.rng.Float64() }

func (p *randomFit) gpus(i int, t *task) []int {
	n := p.c.nodes[i]
	if !t.Sharing() {
		return tightestGPUs(n, t)
	}
	pick, seen := -1, 0
	for g, f := range n.Free {
		if f >= t.GPUMilli {
			seen++
			if p.rng.IntN(seen) == 0 {
				pick = g
			}
		}
	}
	return []int{pick}
}

type bestFit struct{ *env }

// score: 100 * (1 - (free CPU after / 128 cores + free GPU after / 8 GPUs) / 2),
// truncated to an integer as in the authors' simulator.
func (p *bestFit) score(i int, t *task) float64 {
	n := &p.c.nodes[i]
	cpu := float64(n.CPU-t.CPU) / maxSpecCPU * 0.5
	gpu := float64(n.FreeGPU()-t.GPUTotal()) / maxSpecGPU * 0.5
	return float64(int64((1 - (cpu + gpu)) * 100))
}

func (p *bestFit) gpus(i int, t *task) []int { return tightestGPUs(p.c.nodes[i], t) }

type dotProduct struct{ *env }

// score: 100 * (1 - <free, request> / 2) with both vectors normalised by
// (128 cores, 8 GPUs), truncated. The authors' code ranks a smaller dot
// product higher, so among nodes that fit it prefers those with less left.
func (p *dotProduct) score(i int, t *task) float64 {
	n := &p.c.nodes[i]
	a0, a1 := float64(n.CPU)/maxSpecCPU, float64(n.FreeGPU())/maxSpecGPU
	b0, b1 := float64(t.CPU)/maxSpecCPU, float64(t.GPUTotal())/maxSpecGPU
	dot := a0*b0 + a1*b1
	return float64(int64(100 * (1 - dot/2)))
}

func (p *dotProduct) gpus(i int, t *task) []int { return tightestGPUs(p.c.nodes[i], t) }

type gpuClustering struct{ *env }

func (p *gpuClustering) score(i int, t *task) float64 {
	if !t.WantsGPU() {
		return 0
	}
	left := p.c.nodes[i].FreeGPU()
	base := 25 * (maxSpecGPU - left) / maxSpecGPU
	switch same, kinds := p.c.affinity[i][kind(t)], p.c.kinds[i]; {
	case same > 0 && kinds == 1:
		return float64(base + 75)
	case same > 0:
		return float64(base + 50)
	case kinds == 0:
		return float64(base + 25)
	default:
		return float64(base)
	}
}

func (p *gpuClustering) gpus(i int, t *task) []int { return tightestGPUs(p.c.nodes[i], t) }

type gpuPacking struct{ *env }

func (p *gpuPacking) score(i int, t *task) float64 {
	if !t.WantsGPU() {
		return 0
	}
	n := &p.c.nodes[i]
	if p.c.idle[i] == len(n.Free) {
		free := int64(p.c.idle[i])
		return float64(max(33-free, free))
	}
	// GPUs in increasing free capacity (stable by index).
	var idx [maxNodeGPUs]int
	k := len(n.Free)
	for g := 0; g < k; g++ {
		idx[g] = g
	}
	slices.SortStableFunc(idx[:k], func(a, b int) int { return int(n.Free[a] - n.Free[b]) })
	need := t.GPUs
	idleUsed := int64(0)
	var share int64
	for _, g := range idx[:k] {
		if need == 0 {
			break
		}
		if t.GPUMilli <= n.Free[g] {
			need--
			if n.Free[g] == frag.MilliPerGPU {
				idleUsed++
			}
			share += int64(n.Free[g]) * 100 / frag.MilliPerGPU
		}
	}
	if idleUsed > 0 {
		return float64(max(50-idleUsed, 33))
	}
	return float64(max(100-share/10, 50))
}

func (p *gpuPacking) gpus(i int, t *task) []int { return tightestGPUs(p.c.nodes[i], t) }

// scoreCache keeps a policy's score of each (node, task shape) until the
// node changes.
type scoreCache struct {
	shapes int
	ver    []uint32
	val    []float64
	gpu    []int16
}

func newScoreCache(nodes, shapes int) *scoreCache {
	n := nodes * shapes
	return &scoreCache{shapes: shapes, ver: make([]uint32, n), val: make([]float64, n), gpu: make([]int16, n)}
}

func (s *scoreCache) get(i, shape int, ver uint32) (float64, int, bool) {
	k := i*s.shapes + shape
	if s.ver[k] != ver {
		return 0, 0, false
	}
	return s.val[k], int(s.gpu[k]), true
}

func (s *scoreCache) put(i, shape int, ver uint32, v float64, gpu int) {
	k := i*s.shapes + shape
	s.ver[k], s.val[k], s.gpu[k] = ver, v, int16(gpu)
}

// fgd is the paper's policy: integer scores (sigmoid of the fragmentation
// reduction), GPU choice by the same integer score.
type fgd struct {
	*env
	cache *scoreCache
}

func (p *fgd) score(i int, t *task) float64 {
	ver := p.c.version[i]
	if v, _, ok := p.cache.get(i, t.shape, ver); ok {
		return v
	}
	gpu, delta := p.c.memo.FGD(p.c.nodes[i], t.Task, p.c.fragNode[i], true)
	v := float64(frag.PaperScore(delta))
	p.cache.put(i, t.shape, ver, v, gpu)
	return v
}

func (p *fgd) gpus(i int, t *task) []int {
	if !t.Sharing() {
		return tightestGPUs(p.c.nodes[i], t)
	}
	_, gpu, ok := p.cache.get(i, t.shape, p.c.version[i])
	if !ok {
		p.score(i, t)
		_, gpu, _ = p.cache.get(i, t.shape, p.c.version[i])
	}
	return []int{gpu}
}
