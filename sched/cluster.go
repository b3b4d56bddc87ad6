package sched

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
)

// Cluster is a frozen inventory: the nodes, their topologies (shared by
// nodes of one shape) and the groups of nodes that are identical for the
// device filters.
type Cluster struct {
	nodes  []*Node
	topos  []*Topology
	groups []*group
	// nodeGroup and nodePos place each node in its group.
	nodeGroup []int
	nodePos   []int
	maxDev    int
}

// group is a set of nodes whose devices and software are identical as far
// as the device filters can see: a filter's answer for one holds for all.
type group struct {
	rep   *Node
	nodes []int
	ndev  int
	// mig is the node positions with a MIG-enabled device.
	mig bitset
}

// NewCluster freezes the nodes. The nodes must not change afterwards.
func NewCluster(nodes []*Node) (*Cluster, error) {
	c := &Cluster{nodes: nodes, topos: make([]*Topology, len(nodes)), nodeGroup: make([]int, len(nodes)), nodePos: make([]int, len(nodes))}
	shapes := map[string]*Topology{}
	groups := map[string]int{}
	var errs []error
	names := map[string]bool{}
	for i, n := range nodes {
		if n == nil {
			errs = append(errs, fmt.Errorf("node %d is nil", i))
			continue
		}
		if err := n.validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if names[n.Name] && n.Name != "" {
			errs = append(errs, fmt.Errorf("node name %q is used twice", n.Name))
		}
		names[n.Name] = true
		t := NewTopology(n)
		if s, ok := shapes[t.key()]; ok {
			t = s
		} else {
			shapes[t.key()] = t
		}
		c.topos[i] = t
		k := groupKey(n)
		g, ok := groups[k]
		if !ok {
			g = len(c.groups)
			groups[k] = g
			c.groups = append(c.groups, &group{rep: n, ndev: len(n.Devices)})
		}
		c.nodeGroup[i] = g
		c.nodePos[i] = len(c.groups[g].nodes)
		c.groups[g].nodes = append(c.groups[g].nodes, i)
		c.maxDev = max(c.maxDev, len(n.Devices))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("sched: %w", errors.Join(errs...))
	}
	for _, g := range c.groups {
		g.mig = newBitset(len(g.nodes))
		for p, ni := range g.nodes {
			for _, d := range nodes[ni].Devices {
				if d.MIGEnabled {
					g.mig.set(p)
					break
				}
			}
		}
	}
	return c, nil
}

// groupKey is equal for nodes the device filters cannot tell apart.
func groupKey(n *Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|%d", n.Driver, n.CUDA, n.ROCm, len(n.Devices))
	for _, d := range n.Devices {
		geo := ""
		if d.MIG != nil {
			geo = d.MIG.Name
		}
		fmt.Fprintf(&b, "|%s/%s/%s/%s/%s/%d/%s/%t", d.Vendor, d.Model, d.Architecture, d.ComputeCapability, d.GFXTarget, d.MemoryBytes, geo, d.MIGEnabled)
	}
	return b.String()
}

// Nodes returns the nodes in cluster order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Topology returns the topology of node i.
func (c *Cluster) Topology(i int) *Topology { return c.topos[i] }

// Groups is the number of groups of identical nodes.
func (c *Cluster) Groups() int { return len(c.groups) }

// bitset is a set of small non-negative integers.
type bitset []uint64

func newBitset(n int) bitset    { return make(bitset, (n+63)/64) }
func (b bitset) set(i int)      { b[i>>6] |= 1 << (i & 63) }
func (b bitset) clear(i int)    { b[i>>6] &^= 1 << (i & 63) }
func (b bitset) has(i int) bool { return b[i>>6]&(1<<(i&63)) != 0 }
func (b bitset) clone() bitset  { return append(bitset(nil), b...) }
func (b bitset) each(f func(int) bool) bool {
	for w, x := range b {
		for ; x != 0; x &= x - 1 {
			if !f(w<<6 | bits.TrailingZeros64(x)) {
				return false
			}
		}
	}
	return true
}
