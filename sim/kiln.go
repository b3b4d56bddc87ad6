package sim

import "kiln.dev/kiln/sched/frag"

// kilnPolicy runs frag.Kiln with the simulator's caches.
type kilnPolicy struct {
	*env
	k     *frag.Kiln
	cache *scoreCache
}

func newKilnPolicy(e *env) *kilnPolicy {
	capBy := map[string]int64{}
	for _, n := range e.c.caps {
		capBy[n.Model] += int64(n.GPUs) * frag.MilliPerGPU
	}
	return &kilnPolicy{
		env:   e,
		k:     frag.NewKiln(e.target, frag.ModelPressure(e.tasks, capBy)),
		cache: newScoreCache(len(e.c.nodes), e.shapes),
	}
}

func (p *kilnPolicy) score(i int, t *task) float64 {
	ver := p.c.version[i]
	if v, _, ok := p.cache.get(i, t.shape, ver); ok {
		return v
	}
	v, gpu := p.k.ScoreMemo(p.c.memo, p.c.nodes[i], p.c.caps[i].CPU, t.Task, p.c.fragNode[i])
	p.cache.put(i, t.shape, ver, v, gpu)
	return v
}

func (p *kilnPolicy) gpus(i int, t *task) []int {
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
