package sched

import (
	"fmt"
	"math/bits"
	"strings"

	"kiln.dev/kiln/version"
)

// ConstraintFilter applies Request.Constraints to each device.
type ConstraintFilter struct{}

// Name implements Plugin.
func (ConstraintFilter) Name() string { return "constraints" }

// FilterDevice implements DeviceFilter.
func (ConstraintFilter) FilterDevice(r *Request, n *Node, d *Device) string {
	return MatchDevice(&r.Constraints, n, d)
}

// MatchDevice is the one meaning of every constraint: "" when device d of
// node n meets c, else why not, worded for a count of nodes ("have no
// A100 GPU"). Every placement policy judges a device by it. An unknown
// version never meets a floor; the driver floor is the GPU's own vendor's
// kernel driver (NVIDIA's, or amdgpu for an AMD GPU); a CUDA floor is met
// by NVIDIA GPUs only.
func MatchDevice(c *Constraints, n *Node, d *Device) string {
	if c.Vendor != "" && !strings.EqualFold(c.Vendor, d.Vendor) {
		return "have no " + c.Vendor + " GPU"
	}
	if len(c.Models) > 0 {
		ok := false
		for _, m := range c.Models {
			ok = ok || modelMatches(d.Model, m)
		}
		if !ok {
			return "have no GPU of model " + strings.Join(c.Models, " or ")
		}
	}
	if c.Architecture != "" && !strings.EqualFold(strings.TrimSpace(c.Architecture), strings.TrimSpace(d.Architecture)) {
		return "have no " + c.Architecture + " GPU"
	}
	if len(c.GFXTargets) > 0 {
		ok := false
		for _, t := range c.GFXTargets {
			ok = ok || strings.EqualFold(t, d.GFXTarget)
		}
		if !ok {
			return "have no GPU of target " + strings.Join(c.GFXTargets, " or ")
		}
	}
	if c.MinMemoryBytes > 0 && d.MemoryBytes < c.MinMemoryBytes {
		return fmt.Sprintf("have no GPU with %.0f GiB of memory", float64(c.MinMemoryBytes)/(1<<30))
	}
	if c.MinComputeCapability != "" {
		if cmp, ok := version.Compare(d.ComputeCapability, c.MinComputeCapability); !ok || cmp < 0 {
			return "have no GPU of compute capability " + c.MinComputeCapability + " or later"
		}
	}
	if c.MinDriver != "" {
		driver := n.Driver
		if strings.EqualFold(d.Vendor, "amd") {
			driver = n.AMDGPU
		}
		if cmp, ok := version.Compare(driver, c.MinDriver); !ok || cmp < 0 {
			return "run no driver " + c.MinDriver + " or later"
		}
	}
	if c.MinCUDA != "" {
		if cmp, ok := version.Compare(n.CUDA, c.MinCUDA); !ok || cmp < 0 || !strings.EqualFold(d.Vendor, "nvidia") {
			return "support no CUDA " + c.MinCUDA
		}
	}
	return ""
}

// modelMatches: equal, or the wanted name as whole words of the model
// ("A100" in "A100-SXM4-80GB", not "A10" in it); spaces, dashes and
// underscores count as one separator ("RTX 4090" is "RTX-4090").
func modelMatches(model, want string) bool {
	m, w := normModel(model), normModel(want)
	if w == "" || m == "" {
		return false
	}
	if m == w {
		return true
	}
	for off := 0; off+len(w) <= len(m); {
		i := strings.Index(m[off:], w)
		if i < 0 {
			return false
		}
		s, e := off+i, off+i+len(w)
		if !alnum(m, s-1) && !alnum(m, e) {
			return true
		}
		off = s + 1
	}
	return false
}

var modelSeparators = strings.NewReplacer("-", " ", "_", " ")

func normModel(s string) string {
	return strings.Join(strings.Fields(modelSeparators.Replace(strings.ToLower(s))), " ")
}

func alnum(s string, i int) bool {
	if i < 0 || i >= len(s) {
		return false
	}
	c := s[i]
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z'
}

// ResourceFilter checks the node's free CPU and host memory where its
// capacity is known.
type ResourceFilter struct{}

// Name implements Plugin.
func (ResourceFilter) Name() string { return "resources" }

// FilterNode implements NodeFilter.
func (ResourceFilter) FilterNode(r *Request, ni *NodeInfo) string {
	n := ni.Node
	if r.CPUMilli > 0 && n.CPUMilli > 0 && r.CPUMilli > n.CPUMilli-ni.u.cpu {
		return "have too little free CPU"
	}
	if r.MemoryBytes > 0 && n.MemoryBytes > 0 && r.MemoryBytes > n.MemoryBytes-ni.u.mem {
		return "have too little free host memory"
	}
	return ""
}

// TopologyScore rates the slowest link of the GPUs chosen: 1 for a single
// GPU, 1 - rank/1000 for a set (NV18 0.92, PIX 0.70, SYS 0.30).
type TopologyScore struct{}

// Name implements Plugin.
func (TopologyScore) Name() string { return "topology" }

// Score implements ScorePlugin.
func (TopologyScore) Score(_ *Request, c *Candidate) float64 {
	if count(c.Set) < 2 {
		return 1
	}
	return 1 - float64(c.WorstRank)/rankUnknown
}

// PackScore prefers nodes that are fuller after the placement (GPU
// compute, else CPU), so that empty nodes stay empty for large requests.
type PackScore struct{}

// Name implements Plugin.
func (PackScore) Name() string { return "pack" }

// Score implements ScorePlugin.
func (PackScore) Score(r *Request, c *Candidate) float64 { return packing(r, c) }

func packing(r *Request, c *Candidate) float64 {
	used, capacity := c.GPUMilli()
	add := 0
	for _, sh := range c.Alloc.Devices {
		add += sh.Milli
	}
	if r.Kind() == KindMIG {
		used, capacity, add = 0, 0, 0
		for k := range c.Node.Devices {
			d := &c.Node.Devices[k]
			if !d.MIGEnabled || d.MIG == nil || !d.Healthy() {
				continue
			}
			v := viewMIG(d, c.u.devs[k].mig)
			used += v.compute
			capacity += d.MIG.ComputeSlices
		}
		for _, sh := range c.Alloc.Devices {
			if sh.MIG != nil && sh.MIG.Existing < 0 {
				add += sh.MIG.Compute
			}
		}
	}
	if capacity > 0 {
		return float64(used+add) / float64(capacity)
	}
	if cpu := c.Node.CPUMilli; cpu > 0 {
		return float64(c.u.cpu+r.CPUMilli) / float64(cpu)
	}
	return 0.5
}

// KeepSetsScore prefers placements that take whole GPUs whose good links
// lead to few free GPUs: 1 - (link weight cut to the GPUs left free) /
// (link weight to every other GPU). A share of an already shared GPU cuts
// nothing and scores 1.
type KeepSetsScore struct{}

// Name implements Plugin.
func (KeepSetsScore) Name() string { return "keep-sets" }

// Score implements ScorePlugin.
func (KeepSetsScore) Score(_ *Request, c *Candidate) float64 {
	free := c.FreeWhole()
	taken := c.Set & free
	if taken == 0 {
		return 1
	}
	all := uint64(0)
	for k := range c.Node.Devices {
		if c.Node.Devices[k].Healthy() && !c.Node.Devices[k].MIGEnabled {
			all |= 1 << k
		}
	}
	den := c.Topo.Cut(taken, all)
	if den == 0 {
		return 1
	}
	return 1 - float64(c.Topo.Cut(taken, free))/float64(den)
}

// RandomPicker picks a pseudo-random set of the asked size, drawn from the
// seed and the free mask; with a locality it tries up to 64 draws and then
// falls back to TopologyPicker.
type RandomPicker struct{ Seed uint64 }

// Pick implements Picker.
func (p RandomPicker) Pick(t *Topology, free uint64, n int, loc Locality) (uint64, bool) {
	if n <= 0 || bits.OnesCount64(free) < n {
		return 0, false
	}
	pos := make([]int, 0, bits.OnesCount64(free))
	for x := free; x != 0; x &= x - 1 {
		pos = append(pos, bits.TrailingZeros64(x))
	}
	h := mix(p.Seed ^ free*0x9e3779b97f4a7c15 ^ uint64(n))
	for try := 0; try < 64; try++ {
		for i := len(pos) - 1; i > 0; i-- {
			h = mix(h)
			j := int(h % uint64(i+1))
			pos[i], pos[j] = pos[j], pos[i]
		}
		var set uint64
		for _, k := range pos[:n] {
			set |= 1 << k
		}
		if t.allows(set, loc) {
			return set, true
		}
	}
	return TopologyPicker{}.Pick(t, free, n, loc)
}
