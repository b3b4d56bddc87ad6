package snapshot

// GPUByPCI returns the snapshot's GPU at a PCI address, given in any form
// CanonicalPCI reads ("0000:3B:00.0", "3b:00.0"), or nil when the address
// is not one or no GPU has it.
func (s *Snapshot) GPUByPCI(addr string) *GPU {
	if s == nil {
		return nil
	}
	return atPCI(s.GPUs, addr, func(g *GPU) string { return g.PCIAddress })
}

// DeviceByPCI returns the snapshot's PCI device (a GPU's function, a NIC,
// a switch port, ...) at a PCI address, read as GPUByPCI reads it, or nil.
func (s *Snapshot) DeviceByPCI(addr string) *PCIDevice {
	if s == nil {
		return nil
	}
	return atPCI(s.PCI, addr, func(d *PCIDevice) string { return d.Address })
}

// atPCI is the first of items whose address is addr, both read as
// CanonicalPCI reads them (the snapshot's own addresses are canonical, as
// the schema says; one that is not is read again).
func atPCI[T any](items []T, addr string, address func(*T) string) *T {
	if addr == "" {
		return nil
	}
	a, err := CanonicalPCI(addr)
	if err != nil {
		return nil
	}
	for i := range items {
		stored := address(&items[i])
		if stored == a {
			return &items[i]
		}
		if stored == "" || isCanonical(stored) {
			continue
		}
		if c, err := CanonicalPCI(stored); err == nil && c == a {
			return &items[i]
		}
	}
	return nil
}
