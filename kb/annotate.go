package kb

import "kiln.dev/kiln/snapshot"

// Annotate fills what the catalog knows about each GPU and the source did
// not say: the model name, architecture, compute capability or gfx target,
// looked up by PCI device id (or by the printed name). Values a source read
// are never replaced. It returns how many GPUs it completed.
func (k *KB) Annotate(s *snapshot.Snapshot) int {
	n := 0
	for i := range s.GPUs {
		g := &s.GPUs[i]
		m, ok := k.GPUByDeviceID(g.Vendor, g.DeviceID)
		if !ok && g.Model != "" {
			m, ok = k.GPUByName(g.Model)
		}
		if !ok {
			continue
		}
		changed := false
		set := func(dst *string, v string) {
			if *dst == "" && v != "" {
				*dst, changed = v, true
			}
		}
		set(&g.Model, m.Name)
		set(&g.Architecture, m.Architecture)
		if g.Vendor == snapshot.VendorNVIDIA {
			set(&g.ComputeCapability, m.ComputeCapability)
		}
		if g.Vendor == snapshot.VendorAMD {
			set(&g.GFXTarget, m.GFXTarget)
		}
		if changed {
			n++
		}
	}
	return n
}
