package kb

import (
	"errors"
	"fmt"
	"strings"
	"sync"
)

func (k *KB) validate() error {
	var errs []error
	for i, g := range k.GPUs {
		if g.Name == "" || g.Vendor == "" || g.Source == "" || g.Class == "" {
			errs = append(errs, fmt.Errorf("kb: gpus row %d (%q): name, vendor, class and source are required", i, g.Name))
		}
	}
	for i, p := range k.PCIe {
		if p.Gen <= 0 || p.GBpsPerLaneUni <= 0 || p.Source == "" {
			errs = append(errs, fmt.Errorf("kb: pcie row %d: gen, rate and source are required", i))
		}
	}
	for i, l := range k.Interconnects {
		if l.Kind == "" || l.GBpsPerLinkUni <= 0 || l.Source == "" {
			errs = append(errs, fmt.Errorf("kb: interconnects row %d: kind, rate and source are required", i))
		}
	}
	for i, c := range k.CUDA {
		if c.Version == "" || c.MinDriverLinux == "" || c.Source == "" {
			errs = append(errs, fmt.Errorf("kb: cuda row %d: version, min_driver_linux and source are required", i))
		}
	}
	if err := k.validateMIG(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// PCIeGBpsUni is the usable bandwidth of a PCIe link of the given generation
// and width, per direction, in GB/s. It returns 0 for an unknown generation.
func (k *KB) PCIeGBpsUni(gen, width int) float64 {
	for _, p := range k.PCIe {
		if p.Gen == gen {
			return p.GBpsPerLaneUni * float64(width)
		}
	}
	return 0
}

// PCIeGenForGTps maps a transfer rate (8.0, "16GT/s") to its generation, 0 if unknown.
func (k *KB) PCIeGenForGTps(gtps float64) int {
	for _, p := range k.PCIe {
		if p.GTps == gtps {
			return p.Gen
		}
	}
	return 0
}

// PCIeGen returns the row of a generation.
func (k *KB) PCIeGen(gen int) (PCIeGen, bool) {
	for _, p := range k.PCIe {
		if p.Gen == gen {
			return p, true
		}
	}
	return PCIeGen{}, false
}

// LinkGBpsUni is the per-direction bandwidth of one link of an interconnect
// generation ("nvlink", 4), 0 if unknown.
func (k *KB) LinkGBpsUni(kind string, gen int) float64 {
	for _, l := range k.Interconnects {
		if l.Kind == kind && l.Gen == gen {
			return l.GBpsPerLinkUni
		}
	}
	return 0
}

// GPUByDeviceID finds a model by vendor and PCI device id ("10de", "2330").
func (k *KB) GPUByDeviceID(vendor, deviceID string) (GPUModel, bool) {
	deviceID = strings.ToLower(strings.TrimPrefix(strings.ToLower(deviceID), "0x"))
	for _, g := range k.GPUs {
		if g.Vendor != vendor {
			continue
		}
		for _, id := range g.DeviceIDs {
			if id == deviceID {
				return g, true
			}
		}
	}
	return GPUModel{}, false
}

// GPUByName finds a model by the name a tool prints ("NVIDIA H100 80GB
// HBM3"). A pattern matches only as whole words, so "A10" is not found in
// "A100-SXM4-40GB" nor "L4" in "L40S"; the longest matching pattern wins, so
// "A100-SXM4-80GB" is not taken for "A100-SXM4-40GB".
func (k *KB) GPUByName(name string) (GPUModel, bool) {
	n := strings.ToLower(name)
	best, bestLen := -1, 0
	for _, p := range k.namePatterns() {
		if len(p.pat) > bestLen && containsWord(n, p.pat) {
			best, bestLen = p.gpu, len(p.pat)
		}
	}
	if best < 0 {
		return GPUModel{}, false
	}
	return k.GPUs[best], true
}

// namePattern is a name or match pattern of the catalog, lowercased, and
// its row.
type namePattern struct {
	pat string
	gpu int
}

// patterns holds each catalog's name patterns, made once per catalog
// (kiln reads the names of every GPU of every node it sees). A catalog is
// known by its GPU table, which nothing changes once loaded; the key keeps
// the table alive, so an address is never reused for another.
var patterns sync.Map // patternKey -> []namePattern

type patternKey struct {
	first *GPUModel
	n     int
}

func (k *KB) namePatterns() []namePattern {
	if len(k.GPUs) == 0 {
		return nil
	}
	key := patternKey{&k.GPUs[0], len(k.GPUs)}
	if v, ok := patterns.Load(key); ok {
		return v.([]namePattern)
	}
	var ps []namePattern
	for i, g := range k.GPUs {
		for _, m := range append([]string{g.Name}, g.Match...) {
			ps = append(ps, namePattern{strings.ToLower(m), i})
		}
	}
	patterns.Store(key, ps)
	return ps
}

// containsWord reports whether pat occurs in s with no letter or digit
// directly before or after it.
func containsWord(s, pat string) bool {
	if pat == "" {
		return false
	}
	for off := 0; off+len(pat) <= len(s); {
		i := strings.Index(s[off:], pat)
		if i < 0 {
			return false
		}
		start, end := off+i, off+i+len(pat)
		if !isAlnum(s, start-1) && !isAlnum(s, end) {
			return true
		}
		off = start + 1
	}
	return false
}

// isAlnum reports whether s[i] is an ASCII letter or digit; out of range is false.
func isAlnum(s string, i int) bool {
	if i < 0 || i >= len(s) {
		return false
	}
	c := s[i]
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// XIDInfo returns the catalog row of an Xid code.
func (k *KB) XIDInfo(code int) (XID, bool) {
	rows, _ := k.XIDTable()
	for _, x := range rows {
		if x.Code == code {
			return x, true
		}
	}
	return XID{}, false
}
