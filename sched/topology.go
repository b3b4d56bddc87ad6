package sched

import (
	"fmt"
	"math/bits"
	"strings"
	"sync"

	"kiln.dev/kiln/topo"
)

// Tier groups link classes into the levels the engine compares.
type Tier int

// Tiers from best to worst.
const (
	TierFabric     Tier = iota // NVLink (NV#) or xGMI
	TierSwitch                 // one PCIe switch or a bridge chain below one root port (PIX, PXB)
	TierHostBridge             // PHB
	TierNUMA                   // NODE
	TierSystem                 // SYS
	TierUnknown
)

// TierOfRank maps a topo rank to its tier.
func TierOfRank(rank int) Tier {
	switch {
	case rank < 300:
		return TierFabric
	case rank < 500:
		return TierSwitch
	case rank < 600:
		return TierHostBridge
	case rank < 700:
		return TierNUMA
	case rank < 1000:
		return TierSystem
	}
	return TierUnknown
}

// Topology is the link structure of a node, shared by nodes of the same
// shape: the rank of every pair, bandwidths and NUMA nodes. Pickers read it.
type Topology struct {
	n     int
	rank  []int32   // n*n
	gbps  []float64 // n*n
	numa  []int
	class []string // n*n
	// weight[i*n+j] is what pair (i, j) is worth to later requests; a
	// better tier is worth more than any number of worse pairs.
	weight []uint64
	// fabric[i] is the mask of devices joined to i by NVLink or xGMI.
	fabric []uint64

	mu    sync.RWMutex
	cache map[pickKey]uint64
}

type pickKey struct {
	free  uint64
	count uint8
	loc   uint8
}

// maxCache bounds the picks a Topology remembers.
const maxCache = 1 << 16

// NewTopology reads the link structure of a node.
func NewTopology(n *Node) *Topology {
	k := len(n.Devices)
	t := &Topology{n: k, rank: make([]int32, k*k), gbps: make([]float64, k*k), numa: make([]int, k),
		class: make([]string, k*k), weight: make([]uint64, k*k), fabric: make([]uint64, k), cache: map[pickKey]uint64{}}
	for i := range k {
		t.numa[i] = n.Devices[i].NUMA
		for j := range k {
			l := Link{Class: topo.ClassUnknown, Rank: rankUnknown}
			if i == j {
				l = Link{Class: topo.ClassSelf}
			} else if n.Links != nil {
				l = n.Links[i][j]
			}
			r := min(max(l.Rank, 0), rankUnknown)
			t.rank[i*k+j] = int32(r)
			t.gbps[i*k+j] = l.GBps
			t.class[i*k+j] = l.Class
			if i != j {
				t.weight[i*k+j] = tierWeight(TierOfRank(r))
				if TierOfRank(r) == TierFabric {
					t.fabric[i] |= 1 << j
				}
			}
		}
	}
	return t
}

// tierWeight: 7 bits per tier, so up to 127 pairs of one tier weigh less
// than one pair of the tier above (a 16-GPU node has at most 64 cut pairs).
func tierWeight(t Tier) uint64 {
	if t >= TierUnknown {
		return 0
	}
	return 1 << (7 * (int(TierUnknown) - 1 - int(t)))
}

// key is a string that equals for nodes with the same link structure.
func (t *Topology) key() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d|", t.n)
	for i := range t.rank {
		fmt.Fprintf(&b, "%d:%s:%g,", t.rank[i], t.class[i], t.gbps[i])
	}
	for _, x := range t.numa {
		fmt.Fprintf(&b, "%d,", x)
	}
	return b.String()
}

// Len is the number of devices.
func (t *Topology) Len() int { return t.n }

// Rank is the rank of the pair (i, j), smaller is better.
func (t *Topology) Rank(i, j int) int { return int(t.rank[i*t.n+j]) }

// Class is the link class of the pair (i, j).
func (t *Topology) Class(i, j int) string { return t.class[i*t.n+j] }

// GBps is the rated bandwidth per direction of the pair (i, j).
func (t *Topology) GBps(i, j int) float64 { return t.gbps[i*t.n+j] }

// NUMA is device i's NUMA node, -1 when unknown.
func (t *Topology) NUMA(i int) int { return t.numa[i] }

// Worst returns the slowest pair of a device set: its rank, the pair's
// bandwidth, and its indexes (-1 for sets of fewer than two).
func (t *Topology) Worst(set uint64) (rank int, gbps float64, a, b int) {
	a, b = -1, -1
	for x := set; x != 0; x &= x - 1 {
		i := bits.TrailingZeros64(x)
		for y := x & (x - 1); y != 0; y &= y - 1 {
			j := bits.TrailingZeros64(y)
			r, g := int(t.rank[i*t.n+j]), t.gbps[i*t.n+j]
			if a < 0 || r > rank || r == rank && g < gbps {
				rank, gbps, a, b = r, g, i, j
			}
		}
	}
	return rank, gbps, a, b
}

// Cut is the weight of the links between set and rest: what taking set
// breaks for later requests that would use rest.
func (t *Topology) Cut(set, rest uint64) uint64 {
	var c uint64
	for x := set; x != 0; x &= x - 1 {
		i := bits.TrailingZeros64(x)
		row := t.weight[i*t.n:]
		for y := rest &^ set; y != 0; y &= y - 1 {
			c += row[bits.TrailingZeros64(y)]
		}
	}
	return c
}

// inner is the weight of the links inside set.
func (t *Topology) inner(set uint64) uint64 {
	var c uint64
	for x := set; x != 0; x &= x - 1 {
		i := bits.TrailingZeros64(x)
		row := t.weight[i*t.n:]
		for y := x & (x - 1); y != 0; y &= y - 1 {
			c += row[bits.TrailingZeros64(y)]
		}
	}
	return c
}

// allows reports whether a set meets the locality asked for.
func (t *Topology) allows(set uint64, loc Locality) bool {
	if loc.SameNVLinkIsland {
		for x := set; x != 0; x &= x - 1 {
			i := bits.TrailingZeros64(x)
			if set&^(t.fabric[i]|1<<i) != 0 {
				return false
			}
		}
	}
	if loc.SameNUMA {
		first := -2
		for x := set; x != 0; x &= x - 1 {
			nn := t.numa[bits.TrailingZeros64(x)]
			if nn < 0 || first != -2 && nn != first {
				return false
			}
			first = nn
		}
	}
	return true
}

// Picker chooses count devices out of free (bit i = device i) on a node
// of topology t, meeting loc; ok is false when no such set exists.
type Picker interface {
	Pick(t *Topology, free uint64, count int, loc Locality) (set uint64, ok bool)
}

// TopologyPicker is kiln's picker: among the sets that meet the locality,
// the one whose slowest pair is fastest (rank, then bandwidth); among
// those, the one that cuts the least link weight to the devices left free
// (so a one-GPU request takes the GPU whose best partners are gone, and a
// free NVLink pair stays whole); then the best-connected inside; then the
// lowest devices. Sets are enumerated exhaustively up to Limit candidates
// (default 20,000; C(16,8) is 12,870) and grown greedily beyond. Picks are
// remembered per topology, so nodes of one shape share the work.
type TopologyPicker struct {
	Limit int
}

type setScore struct {
	rank  int
	gbps  float64
	cut   uint64
	inner uint64
	set   uint64
}

func (a setScore) better(b setScore) bool {
	switch {
	case a.rank != b.rank:
		return a.rank < b.rank
	case a.gbps != b.gbps:
		return a.gbps > b.gbps
	case a.cut != b.cut:
		return a.cut < b.cut
	case a.inner != b.inner:
		return a.inner > b.inner
	}
	return a.set < b.set
}

// Pick implements Picker.
func (p TopologyPicker) Pick(t *Topology, free uint64, count int, loc Locality) (uint64, bool) {
	if count <= 0 || bits.OnesCount64(free) < count {
		return 0, false
	}
	var lb uint8
	if loc.SameNVLinkIsland {
		lb |= 1
	}
	if loc.SameNUMA {
		lb |= 2
	}
	key := pickKey{free: free, count: uint8(count), loc: lb}
	t.mu.RLock()
	set, hit := t.cache[key]
	t.mu.RUnlock()
	if hit {
		return set, set != 0
	}
	set = p.search(t, free, count, loc)
	t.mu.Lock()
	if len(t.cache) < maxCache {
		t.cache[key] = set
	}
	t.mu.Unlock()
	return set, set != 0
}

func (p TopologyPicker) score(t *Topology, set, free uint64) setScore {
	r, g, _, _ := t.Worst(set)
	return setScore{rank: r, gbps: g, cut: t.Cut(set, free), inner: t.inner(set), set: set}
}

func (p TopologyPicker) search(t *Topology, free uint64, count int, loc Locality) uint64 {
	limit := p.Limit
	if limit <= 0 {
		limit = 20000
	}
	nfree := bits.OnesCount64(free)
	if nfree == count {
		if t.allows(free, loc) {
			return free
		}
		return 0
	}
	pos := make([]int, 0, nfree)
	for x := free; x != 0; x &= x - 1 {
		pos = append(pos, bits.TrailingZeros64(x))
	}
	if nfree < 63 && binomial(nfree, count) <= limit {
		var best setScore
		found := false
		// Gosper's hack over compact positions.
		for c := uint64(1)<<count - 1; c < uint64(1)<<nfree; {
			var set uint64
			for x := c; x != 0; x &= x - 1 {
				set |= 1 << pos[bits.TrailingZeros64(x)]
			}
			if t.allows(set, loc) {
				s := p.score(t, set, free)
				if !found || s.better(best) {
					best, found = s, true
				}
			}
			u := c & -c
			v := c + u
			c = v + ((v ^ c) / u >> 2)
		}
		if !found {
			return 0
		}
		return best.set
	}
	return p.greedy(t, free, count, loc, pos)
}

// greedy grows a set from every free device, each step adding the device
// whose worst link to the set is best (then the smallest cut), and keeps
// the best result.
func (p TopologyPicker) greedy(t *Topology, free uint64, count int, loc Locality, pos []int) uint64 {
	var best setScore
	found := false
	for _, seed := range pos {
		set := uint64(1) << seed
		for bits.OnesCount64(set) < count {
			next, nextRank, nextCut := -1, 0, uint64(0)
			for _, j := range pos {
				if set&(1<<j) != 0 || !t.allows(set|1<<j, loc) {
					continue
				}
				r := 0
				for x := set; x != 0; x &= x - 1 {
					r = max(r, t.Rank(bits.TrailingZeros64(x), j))
				}
				c := t.Cut(1<<j, free&^set)
				if next < 0 || r < nextRank || r == nextRank && c < nextCut {
					next, nextRank, nextCut = j, r, c
				}
			}
			if next < 0 {
				break
			}
			set |= 1 << next
		}
		if bits.OnesCount64(set) != count {
			continue
		}
		s := p.score(t, set, free)
		if !found || s.better(best) {
			best, found = s, true
		}
	}
	if !found {
		return 0
	}
	return best.set
}

func binomial(n, k int) int {
	if k < 0 || k > n {
		return 0
	}
	k = min(k, n-k)
	r := 1
	for i := 1; i <= k; i++ {
		r = r * (n - k + i) / i
		if r > 1<<40 {
			return r
		}
	}
	return r
}

// BestRank is the best worst-pair rank any set of count devices out of
// free can have: what a perfect picker achieves. It enumerates, so it is
// meant for evaluation, not for the placement path.
func (t *Topology) BestRank(free uint64, count int) (int, bool) {
	s, ok := TopologyPicker{Limit: 1 << 30}.Pick(&Topology{n: t.n, rank: t.rank, gbps: t.gbps, numa: t.numa, class: t.class,
		weight: t.weight, fabric: t.fabric, cache: map[pickKey]uint64{}}, free, count, Locality{})
	if !ok {
		return 0, false
	}
	r, _, _, _ := t.Worst(s)
	return r, true
}
