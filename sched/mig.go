package sched

import (
	"fmt"
	"strings"
	"sync"

	"kiln.dev/kiln/kb"
)

// migView is the MIG occupancy of one device: the instances that exist
// and the slots allocations hold.
type migView struct {
	mask    uint32 // memory slices taken by existing instances and new slots
	compute int    // compute slices taken
	media   int    // +me instances
	claimed map[int]bool
}

func viewMIG(d *Device, slots []Slot) migView {
	v := migView{}
	for _, in := range d.MIGInstances {
		v.mask |= span(in.Start, in.Size)
		v.compute += in.Compute
		if p, ok := d.MIG.Profile(in.Profile); ok && p.MediaExtensions {
			v.media++
		}
	}
	for _, s := range slots {
		if s.Existing >= 0 {
			if v.claimed == nil {
				v.claimed = map[int]bool{}
			}
			v.claimed[s.Existing] = true
			continue
		}
		v.mask |= span(s.Start, s.Size)
		v.compute += s.Compute
		if p, ok := d.MIG.Profile(s.Profile); ok && p.MediaExtensions {
			v.media++
		}
	}
	return v
}

// countProfile counts the instances of a profile, existing and new.
func countProfile(d *Device, slots []Slot, name string) int {
	n := 0
	for _, in := range d.MIGInstances {
		if strings.EqualFold(in.Profile, name) {
			n++
		}
	}
	for _, s := range slots {
		if s.Existing < 0 && strings.EqualFold(s.Profile, name) {
			n++
		}
	}
	return n
}

// migOption is one way to serve a MIG request on a device.
type migOption struct {
	slot Slot
	// stranded compute slices after the placement, and free compute left.
	stranded, freeAfter int
}

func (a migOption) better(b migOption) bool {
	claimA, claimB := a.slot.Existing >= 0, b.slot.Existing >= 0
	switch {
	case claimA != claimB:
		return claimA
	case a.stranded != b.stranded:
		return a.stranded < b.stranded
	case a.freeAfter != b.freeAfter:
		return a.freeAfter < b.freeAfter
	}
	return a.slot.Start < b.slot.Start
}

// bestMIG finds the best way to serve profile on one MIG-enabled device:
// claim an unused existing instance of that profile, else create one at
// the legal start that strands the fewest compute slices.
func bestMIG(d *Device, slots []Slot, profile string) (migOption, error) {
	geo := d.MIG
	if geo == nil || !d.MIGEnabled {
		return migOption{}, errNoMIG
	}
	p, ok := geo.Profile(profile)
	if !ok {
		return migOption{}, fmt.Errorf("profile %s is not one of the %s profiles", profile, geo.Name)
	}
	v := viewMIG(d, slots)
	for _, in := range d.MIGInstances {
		if strings.EqualFold(in.Profile, p.Name) && !v.claimed[in.GI] {
			return migOption{slot: Slot{Profile: p.Name, Start: in.Start, Size: in.Size, Compute: in.Compute, Existing: in.GI}}, nil
		}
	}
	if v.compute+p.ComputeSlices > geo.ComputeSlices {
		return migOption{}, errMIGFull
	}
	if p.MediaExtensions && v.media > 0 {
		return migOption{}, errMIGFull
	}
	if countProfile(d, slots, p.Name) >= p.MaxCount {
		return migOption{}, errMIGFull
	}
	var best migOption
	found := false
	budget := geo.ComputeSlices - v.compute - p.ComputeSlices
	for _, st := range p.Placements {
		s := span(st, p.MemorySlices)
		if s == 0 || st+p.MemorySlices > geo.MemorySlices || v.mask&s != 0 {
			continue
		}
		o := migOption{slot: Slot{Profile: p.Name, Start: st, Size: p.MemorySlices, Compute: p.ComputeSlices, Existing: -1}, freeAfter: budget}
		o.stranded = budget - maxExtra(geo, v.mask|s, budget)
		if !found || o.better(best) {
			best, found = o, true
		}
	}
	if !found {
		return migOption{}, errMIGFull
	}
	return best, nil
}

// checkSlot verifies that slot may be added to a device holding slots.
func checkSlot(d *Device, slots []Slot, s Slot) error {
	if d.MIG == nil || !d.MIGEnabled {
		return errNoMIG
	}
	v := viewMIG(d, slots)
	if s.Existing >= 0 {
		for _, in := range d.MIGInstances {
			if in.GI == s.Existing {
				if v.claimed[in.GI] {
					return fmt.Errorf("MIG instance %d is already held", in.GI)
				}
				if !strings.EqualFold(in.Profile, s.Profile) || in.Start != s.Start || in.Size != s.Size {
					return fmt.Errorf("MIG instance %d is %s at slice %d, not %s at %d", in.GI, in.Profile, in.Start, s.Profile, s.Start)
				}
				return nil
			}
		}
		return fmt.Errorf("no MIG instance %d on the GPU", s.Existing)
	}
	p, ok := d.MIG.Profile(s.Profile)
	if !ok {
		return fmt.Errorf("profile %s is not one of the %s profiles", s.Profile, d.MIG.Name)
	}
	legal := false
	for _, st := range p.Placements {
		legal = legal || st == s.Start
	}
	if !legal || s.Size != p.MemorySlices || s.Compute != p.ComputeSlices || s.Start+s.Size > d.MIG.MemorySlices {
		return fmt.Errorf("%s may not start at memory slice %d", p.Name, s.Start)
	}
	if v.mask&span(s.Start, s.Size) != 0 {
		return fmt.Errorf("%s at slice %d overlaps another instance", p.Name, s.Start)
	}
	if v.compute+p.ComputeSlices > d.MIG.ComputeSlices {
		return fmt.Errorf("%s needs %d compute slices, %d are free", p.Name, p.ComputeSlices, d.MIG.ComputeSlices-v.compute)
	}
	if p.MediaExtensions && v.media > 0 {
		return fmt.Errorf("only one media-extension instance per GPU")
	}
	if countProfile(d, slots, p.Name) >= p.MaxCount {
		return fmt.Errorf("the GPU already holds %d instances of %s", p.MaxCount, p.Name)
	}
	return nil
}

// maxExtra is the most compute slices further instances could take on a
// GPU whose memory slices in mask are taken, within budget compute slices.
func maxExtra(geo *kb.MIGModel, mask uint32, budget int) int {
	if budget <= 0 {
		return 0
	}
	tab := migTableFor(geo)
	key := uint64(mask)<<8 | uint64(budget)
	tab.mu.RLock()
	v, ok := tab.memo[key]
	tab.mu.RUnlock()
	if ok {
		return v
	}
	top := 0
	for _, p := range geo.Profiles {
		if p.MediaExtensions || p.ComputeSlices <= 0 || p.ComputeSlices > budget {
			continue
		}
		for _, st := range p.Placements {
			s := span(st, p.MemorySlices)
			if s == 0 || st+p.MemorySlices > geo.MemorySlices || mask&s != 0 {
				continue
			}
			top = max(top, p.ComputeSlices+maxExtra(geo, mask|s, budget-p.ComputeSlices))
		}
	}
	tab.mu.Lock()
	tab.memo[key] = top
	tab.mu.Unlock()
	return top
}

type migTable struct {
	mu   sync.RWMutex
	memo map[uint64]int
}

var migTables sync.Map // geometry key -> *migTable

func migTableFor(geo *kb.MIGModel) *migTable {
	key := fmt.Sprintf("%s/%d/%d/%d", geo.Name, geo.ComputeSlices, geo.MemorySlices, len(geo.Profiles))
	if t, ok := migTables.Load(key); ok {
		return t.(*migTable)
	}
	t, _ := migTables.LoadOrStore(key, &migTable{memo: map[uint64]int{}})
	return t.(*migTable)
}
