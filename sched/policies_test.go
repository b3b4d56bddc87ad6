package sched

// Policies the property tests hold to the same invariants as Default.

// SpreadScore prefers emptier nodes (the opposite of PackScore).
type SpreadScore struct{}

// Name implements Plugin.
func (SpreadScore) Name() string { return "spread" }

// Score implements ScorePlugin.
func (SpreadScore) Score(r *Request, c *Candidate) float64 { return 1 - packing(r, c) }

// RandomScore gives every candidate a pseudo-random score drawn from the
// seed, the request id and the node.
type RandomScore struct{ Seed uint64 }

// Name implements Plugin.
func (RandomScore) Name() string { return "random" }

// Score implements ScorePlugin.
func (s RandomScore) Score(r *Request, c *Candidate) float64 {
	return float64(mix(s.Seed^hashString(r.ID)^uint64(c.Index)*0x2545f4914f6cdd1d)>>11) / (1 << 53)
}

// Spread returns a policy that spreads load: the default filters and
// picker, scored by emptiness.
func Spread(seed uint64) *Scheduler {
	s := Default(seed)
	s.Name = "spread"
	s.Scores = []Weighted{{SpreadScore{}, 1}, {TopologyScore{}, 1}}
	return s
}

// Random returns a policy that places at random among every feasible node
// and picks GPU sets at random: a baseline.
func Random(seed uint64) *Scheduler {
	s := Default(seed)
	s.Name = "random"
	s.Picker = RandomPicker{Seed: seed}
	s.Scores = []Weighted{{RandomScore{Seed: seed}, 1}}
	s.MaxScored = 0
	return s
}
