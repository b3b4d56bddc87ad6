package kb

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
)

// MIGModel is the MIG geometry of one or more GPU models: how many compute
// and memory slices the GPU has and which GPU-instance profiles fit where.
type MIGModel struct {
	// Name of the geometry ("A100-80GB").
	Name string `json:"name"`
	// Models are the GPU model names (GPUModel.Name) that share it.
	Models        []string `json:"models"`
	ComputeSlices int      `json:"compute_slices"`
	MemorySlices  int      `json:"memory_slices"`
	// SMsPerComputeSlice is how many SMs one compute slice has, where a
	// source gives it; 0 when unknown.
	SMsPerComputeSlice int          `json:"sms_per_compute_slice,omitempty"`
	Profiles           []MIGProfile `json:"profiles"`
	Source             string       `json:"source"`
}

// MIGProfile is one GPU-instance profile ("1g.10gb").
type MIGProfile struct {
	Name          string `json:"name"`
	ComputeSlices int    `json:"compute_slices"`
	MemorySlices  int    `json:"memory_slices"`
	// MaxCount is how many instances of this profile one GPU can hold.
	MaxCount int `json:"max_count"`
	// Placements are the legal start indices, counted in memory slices; an
	// instance occupies [start, start+MemorySlices).
	Placements []int `json:"placements"`
	// MediaExtensions marks the "+me" variants that own the media engines.
	MediaExtensions bool `json:"media_extensions,omitempty"`
}

// MIGInstance is one GPU instance found on a GPU. Give the profile name when
// the source prints it; otherwise the SM count and memory size, from which
// the profile is worked out.
type MIGInstance struct {
	Profile   string  `json:"profile,omitempty"`
	SMs       int     `json:"sms,omitempty"`
	MemoryMiB float64 `json:"memory_mib,omitempty"`
}

// MIGUsage says how a GPU's MIG slices are used by its instances.
type MIGUsage struct {
	ComputeSlicesTotal int `json:"compute_slices_total"`
	MemorySlicesTotal  int `json:"memory_slices_total"`
	ComputeSlicesUsed  int `json:"compute_slices_used"`
	MemorySlicesUsed   int `json:"memory_slices_used"`
	// ComputeSlicesStranded are free compute slices that no further
	// instance can use, because the memory slices an instance would need
	// are taken (or sit where no profile may start).
	ComputeSlicesStranded int `json:"compute_slices_stranded"`
	// Profiles are the instances' profiles, in the order given.
	Profiles []string `json:"profiles"`
	// Placeable is false when the instances cannot all be laid out on the
	// GPU under the placement rules (the input is then inconsistent); the
	// stranded count falls back to "all free compute if no memory is free".
	Placeable bool `json:"placeable"`
}

// MIGProfiles returns the MIG geometry of a GPU model. model may be a kiln
// model name ("A100-SXM4-80GB") or a name a tool prints ("NVIDIA
// A100-SXM4-80GB"); ok is false for a model without MIG data.
func (k *KB) MIGProfiles(model string) (MIGModel, bool) {
	find := func(name string) (MIGModel, bool) {
		for _, m := range k.MIG {
			if strings.EqualFold(m.Name, name) {
				return m, true
			}
			for _, n := range m.Models {
				if strings.EqualFold(n, name) {
					return m, true
				}
			}
		}
		return MIGModel{}, false
	}
	if m, ok := find(strings.TrimSpace(model)); ok {
		return m, true
	}
	if g, ok := k.GPUByName(model); ok {
		return find(g.Name)
	}
	return MIGModel{}, false
}

// Profile returns the profile of that name ("1g.10gb"), case-insensitively.
func (m MIGModel) Profile(name string) (MIGProfile, bool) {
	name = strings.TrimSpace(name)
	for _, p := range m.Profiles {
		if strings.EqualFold(p.Name, name) {
			return p, true
		}
	}
	return MIGProfile{}, false
}

// memorySliceGiB is the size of one memory slice as the profile names count
// it: the full-GPU profile's memory divided by the memory slices.
func (m MIGModel) memorySliceGiB() float64 {
	for _, p := range m.Profiles {
		if p.MemorySlices == m.MemorySlices && p.MemorySlices > 0 {
			if gb := profileMemoryGB(p.Name); gb > 0 {
				return gb / float64(p.MemorySlices)
			}
		}
	}
	return 0
}

// profileMemoryGB reads the memory of a profile name ("3g.40gb" -> 40).
func profileMemoryGB(name string) float64 {
	_, after, ok := strings.Cut(strings.ToLower(name), ".")
	if !ok {
		return 0
	}
	after, _, _ = strings.Cut(after, "+")
	after = strings.TrimSuffix(after, "gb")
	var gb float64
	if _, err := fmt.Sscanf(after, "%g", &gb); err != nil || gb <= 0 || math.IsInf(gb, 0) || math.IsNaN(gb) {
		return 0
	}
	return gb
}

// Resolve finds the profile of one instance: by name when given, otherwise
// from its memory size (which fixes the memory slices) and, where two
// profiles share those memory slices, its SM count.
func (m MIGModel) Resolve(in MIGInstance) (MIGProfile, error) {
	if in.Profile != "" {
		if p, ok := m.Profile(in.Profile); ok {
			return p, nil
		}
		return MIGProfile{}, fmt.Errorf("MIG profile %q is not one of the %s profiles", in.Profile, m.Name)
	}
	slice := m.memorySliceGiB()
	if in.MemoryMiB <= 0 || slice <= 0 || math.IsNaN(in.MemoryMiB) || math.IsInf(in.MemoryMiB, 0) {
		return MIGProfile{}, fmt.Errorf("MIG instance on %s: no profile name and no usable memory size", m.Name)
	}
	memSlices := int(math.Round(in.MemoryMiB / 1024 / slice))
	var cands []MIGProfile
	for _, p := range m.Profiles {
		if p.MemorySlices == memSlices && !p.MediaExtensions {
			cands = append(cands, p)
		}
	}
	switch {
	case len(cands) == 0:
		return MIGProfile{}, fmt.Errorf("MIG instance on %s: %.0f MiB matches no profile (%d memory slices)", m.Name, in.MemoryMiB, memSlices)
	case len(cands) == 1:
		return cands[0], nil
	}
	if m.SMsPerComputeSlice <= 0 || in.SMs <= 0 {
		return MIGProfile{}, fmt.Errorf("MIG instance on %s: %.0f MiB fits %d profiles and the SMs per slice are unknown", m.Name, in.MemoryMiB, len(cands))
	}
	compute := int(math.Round(float64(in.SMs) / float64(m.SMsPerComputeSlice)))
	for _, p := range cands {
		if p.ComputeSlices == compute {
			return p, nil
		}
	}
	return MIGProfile{}, fmt.Errorf("MIG instance on %s: %d SMs and %.0f MiB match no profile", m.Name, in.SMs, in.MemoryMiB)
}

// Usage works out which slices the instances on one GPU use and how many
// free compute slices are stranded. It fails only when an instance's
// profile cannot be worked out.
func (m MIGModel) Usage(instances []MIGInstance) (MIGUsage, error) {
	u := MIGUsage{ComputeSlicesTotal: m.ComputeSlices, MemorySlicesTotal: m.MemorySlices}
	profs := make([]MIGProfile, 0, len(instances))
	var errs []error
	for i, in := range instances {
		p, err := m.Resolve(in)
		if err != nil {
			errs = append(errs, fmt.Errorf("instance %d: %w", i, err))
			continue
		}
		profs = append(profs, p)
		u.Profiles = append(u.Profiles, p.Name)
		u.ComputeSlicesUsed += p.ComputeSlices
		u.MemorySlicesUsed += p.MemorySlices
	}
	if len(errs) > 0 {
		return u, errors.Join(errs...)
	}
	freeCompute := m.ComputeSlices - u.ComputeSlicesUsed
	if freeCompute < 0 {
		freeCompute = 0
	}
	masks := m.layouts(profs)
	u.Placeable = len(masks) > 0
	if !u.Placeable || m.MemorySlices > 30 {
		if u.MemorySlicesUsed >= m.MemorySlices {
			u.ComputeSlicesStranded = freeCompute
		}
		return u, nil
	}
	best := 0
	for mask := range masks {
		if e := m.maxExtraCompute(mask, freeCompute); e > best {
			best = e
		}
	}
	u.ComputeSlicesStranded = freeCompute - best
	return u, nil
}

// span is the bit mask of memory slices [start, start+n).
func span(start, n int) uint32 {
	return ((uint32(1) << n) - 1) << start
}

// layouts returns every memory-slice occupancy the profiles can have when
// placed at legal, non-overlapping starts; none when they do not fit.
func (m MIGModel) layouts(profs []MIGProfile) map[uint32]bool {
	out := map[uint32]bool{}
	if m.MemorySlices <= 0 || m.MemorySlices > 30 || len(profs) > m.MemorySlices {
		return out
	}
	sorted := append([]MIGProfile(nil), profs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].MemorySlices > sorted[j].MemorySlices })
	seen := map[[2]uint32]bool{}
	var place func(i int, mask uint32)
	place = func(i int, mask uint32) {
		if i == len(sorted) {
			out[mask] = true
			return
		}
		key := [2]uint32{uint32(i), mask}
		if seen[key] {
			return
		}
		seen[key] = true
		p := sorted[i]
		for _, s := range p.Placements {
			if s < 0 || p.MemorySlices <= 0 || s+p.MemorySlices > m.MemorySlices {
				continue
			}
			b := span(s, p.MemorySlices)
			if mask&b == 0 {
				place(i+1, mask|b)
			}
		}
	}
	place(0, 0)
	return out
}

// maxExtraCompute is the most compute slices further instances could use on
// a GPU whose memory slices in mask are taken, within budget compute slices.
// Max counts are not checked here: on the 7-slot geometries every profile's
// max count equals its number of non-overlapping placements, so the overlap
// rule already enforces them.
func (m MIGModel) maxExtraCompute(mask uint32, budget int) int {
	memo := map[[2]uint32]int{}
	var best func(mask uint32, budget int) int
	best = func(mask uint32, budget int) int {
		key := [2]uint32{mask, uint32(budget)}
		if v, ok := memo[key]; ok {
			return v
		}
		top := 0
		for _, p := range m.Profiles {
			if p.MediaExtensions || p.ComputeSlices <= 0 || p.ComputeSlices > budget {
				continue
			}
			for _, s := range p.Placements {
				if s < 0 || p.MemorySlices <= 0 || s+p.MemorySlices > m.MemorySlices {
					continue
				}
				b := span(s, p.MemorySlices)
				if mask&b != 0 {
					continue
				}
				if v := p.ComputeSlices + best(mask|b, budget-p.ComputeSlices); v > top {
					top = v
				}
			}
		}
		memo[key] = top
		return top
	}
	return best(mask, budget)
}

// validateMIG checks the MIG table: names, sources, slices and placements
// inside the GPU, models that exist in the GPU table.
func (k *KB) validateMIG() error {
	var errs []error
	for i, m := range k.MIG {
		if m.Name == "" || m.Source == "" || len(m.Models) == 0 {
			errs = append(errs, fmt.Errorf("kb: mig row %d (%q): name, models and source are required", i, m.Name))
		}
		if m.ComputeSlices <= 0 || m.MemorySlices <= 0 || m.MemorySlices > 30 {
			errs = append(errs, fmt.Errorf("kb: mig row %d (%q): slice counts out of range", i, m.Name))
		}
		for _, n := range m.Models {
			found := false
			for _, g := range k.GPUs {
				if g.Name == n {
					found = true
					break
				}
			}
			if !found {
				errs = append(errs, fmt.Errorf("kb: mig row %q: model %q is not in gpus.yaml", m.Name, n))
			}
		}
		for _, p := range m.Profiles {
			if p.Name == "" || p.ComputeSlices <= 0 || p.ComputeSlices > m.ComputeSlices ||
				p.MemorySlices <= 0 || p.MemorySlices > m.MemorySlices || p.MaxCount <= 0 || len(p.Placements) == 0 {
				errs = append(errs, fmt.Errorf("kb: mig row %q profile %q: bad slices, count or placements", m.Name, p.Name))
			}
			for _, s := range p.Placements {
				if s < 0 || s+p.MemorySlices > m.MemorySlices {
					errs = append(errs, fmt.Errorf("kb: mig row %q profile %q: placement %d runs past memory slice %d", m.Name, p.Name, s, m.MemorySlices))
				}
			}
		}
	}
	return errors.Join(errs...)
}
