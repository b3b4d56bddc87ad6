package sim

import "kiln.dev/kiln/sched/frag"

// kilnPolicy runs frag.Kiln with the simulator's caches. Kiln measures
// against its own target workload (frag.KilnTarget), so it keeps its own
// memo of node states.
type kilnPolicy struct {
	*env
	k     *frag.Kiln
	memo  *frag.Memo
	cache *scoreCache
}

func newKilnPolicy(e *env) *kilnPolicy {
	caps := make([]frag.Node, len(e.c.caps))
	for i, n := range e.c.caps {
		free := make([]int32, n.GPUs)
		for g := range free {
			free[g] = frag.MilliPerGPU
		}
		caps[i] = frag.Node{Model: n.Model, CPU: n.CPU, Memory: n.Memory, Free: free}
	}
	k := frag.NewKilnFor(e.target, e.tasks, caps)
	return &kilnPolicy{
		env:   e,
		k:     k,
		memo:  frag.NewMemo(k.Target),
		cache: newScoreCache(len(e.c.nodes), e.memShapes),
	}
}

func (p *kilnPolicy) score(i int, t *task) float64 {
	ver := p.c.version[i]
	if v, _, ok := p.cache.get(i, t.memShape, ver); ok {
		return v
	}
	n := p.c.nodes[i]
	v, gpu := p.k.ScoreMemo(p.memo, n, p.c.caps[i].CPU, t.Task, p.memo.Amount(n))
	p.cache.put(i, t.memShape, ver, v, gpu)
	return v
}

func (p *kilnPolicy) gpus(i int, t *task) []int {
	if !t.Sharing() {
		return tightestGPUs(p.c.nodes[i], t)
	}
	_, gpu, ok := p.cache.get(i, t.memShape, p.c.version[i])
	if !ok {
		p.score(i, t)
		_, gpu, _ = p.cache.get(i, t.memShape, p.c.version[i])
	}
	return []int{gpu}
}
