package placement

import (
	"fmt"
	"sort"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/version"
)

// Devices turns a node's Snapshot into its allocatable units: one per
// GPU, and one per MIG instance of a GPU in MIG mode (the GPU itself is
// then leased only through its instances).
func Devices(s *snapshot.Snapshot, k *kb.KB) []api.Device {
	if s == nil {
		return nil
	}
	islands := islandsOf(s)
	gpus := append([]snapshot.GPU(nil), s.GPUs...)
	sort.SliceStable(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	var out []api.Device
	for _, g := range gpus {
		d := api.Device{
			ID:                fmt.Sprintf("gpu%d", g.Index),
			Vendor:            g.Vendor,
			Index:             g.Index,
			Model:             g.Model,
			Architecture:      g.Architecture,
			ComputeCapability: g.ComputeCapability,
			PCIAddress:        g.PCIAddress,
			UUID:              g.UUID,
			MemoryBytes:       g.MemoryTotalBytes,
			NUMANode:          g.NUMANode,
			Island:            islands[g.PCIAddress],
			Isolation:         fractionIsolation(g),
		}
		if d.MemoryBytes == 0 && k != nil && g.Model != "" {
			if m, ok := k.GPUByName(g.Model); ok && m.MemoryGB > 0 {
				d.MemoryBytes = uint64(m.MemoryGB * (1 << 30))
			}
		}
		if g.MIG != nil && g.MIG.Enabled {
			d.MIGMode = true
			d.Isolation = api.IsolationMIG
			out = append(out, d)
			for _, in := range g.MIG.Instances {
				m := d // the instance shares its GPU's identity
				m.ID = fmt.Sprintf("%s/mig%d.%d", d.ID, in.GPUInstance, in.ComputeInstance)
				m.UUID, m.MemoryBytes, m.MIGProfile, m.Parent = migUUID(g.UUID, in), in.MemoryBytes, in.Profile, d.ID
				m.MIGMode, m.Isolation = false, api.IsolationMIG
				out = append(out, m)
			}
			continue
		}
		out = append(out, d)
	}
	return out
}

// migUUID names a MIG device for CUDA_VISIBLE_DEVICES: its own MIG UUID,
// else (nvidia-smi -q and its XML name none) the form CUDA also
// accepts, MIG-<GPU UUID>/<GPU instance>/<compute instance>. A job given
// the GPU's index instead would see the wrong device. Empty when neither
// UUID is known.
func migUUID(gpuUUID string, in snapshot.MIGInstance) string {
	if in.UUID != "" || gpuUUID == "" {
		return in.UUID
	}
	return fmt.Sprintf("MIG-%s/%d/%d", gpuUUID, in.GPUInstance, in.ComputeInstance)
}

// fractionIsolation is the strongest sharing a GPU supports without MIG:
// MPS on NVIDIA GPUs from Volta (compute capability 7.0) on, which enforces
// a thread percentage and a pinned memory limit; time-slicing elsewhere.
func fractionIsolation(g snapshot.GPU) string {
	if g.Vendor == snapshot.VendorNVIDIA {
		if ok, _ := version.AtLeast(g.ComputeCapability, "7.0"); ok {
			return api.IsolationMPS
		}
	}
	return api.IsolationTimeSlicing
}

// islandsOf names the NVLink or xGMI island of each GPU (by PCI address):
// GPUs joined by a device-to-device link, or meeting in an NVSwitch fabric,
// share an island.
func islandsOf(s *snapshot.Snapshot) map[string]string {
	parent := map[string]string{}
	var find func(string) string
	find = func(a string) string {
		p, ok := parent[a]
		if !ok || p == a {
			parent[a] = a
			return a
		}
		r := find(p)
		parent[a] = r
		return r
	}
	union := func(a, b string) {
		ra, rb := find(a), find(b)
		if ra != rb {
			if ra < rb {
				parent[rb] = ra
			} else {
				parent[ra] = rb
			}
		}
	}
	isGPU := map[string]bool{}
	for _, g := range s.GPUs {
		if g.PCIAddress != "" {
			isGPU[g.PCIAddress] = true
		}
	}
	linked := map[string]bool{}
	for _, l := range s.Links {
		if l.Kind != snapshot.LinkNVLink && l.Kind != snapshot.LinkXGMI {
			continue
		}
		if isGPU[l.A] && isGPU[l.B] {
			union(l.A, l.B)
			linked[l.A], linked[l.B] = true, true
		}
	}
	const fabric = "nvswitch-fabric"
	for _, g := range s.GPUs {
		for _, nl := range g.NVLinks {
			if nl.State != "active" || g.PCIAddress == "" {
				continue
			}
			switch nl.RemoteKind {
			case "nvswitch":
				union(g.PCIAddress, fabric)
				linked[g.PCIAddress] = true
			case "gpu":
				if isGPU[nl.RemotePCI] {
					union(g.PCIAddress, nl.RemotePCI)
					linked[g.PCIAddress], linked[nl.RemotePCI] = true, true
				}
			}
		}
	}
	out := map[string]string{}
	for a := range isGPU {
		if !linked[a] {
			continue
		}
		root := find(a)
		kind := "nvlink"
		for _, g := range s.GPUs {
			if g.PCIAddress == a && g.Vendor == snapshot.VendorAMD {
				kind = "xgmi"
			}
		}
		out[a] = kind + ":" + root
	}
	return out
}
