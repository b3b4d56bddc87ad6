package dra

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"kiln.dev/kiln/snapshot"
)

// NodeSnapshot reads back, from the ResourceSlices kiln published for
// node, the node as a Snapshot of its whole GPUs: index, UUID, vendor,
// model, PCI address, memory, compute capability or gfx target, and the
// driver. It is what a kiln server learns of a Kubernetes node it places
// leases on: enough to choose devices and pin a claim to them by UUID,
// not the links between them (the slices carry islands, not the matrix).
// GPUs published as MIG devices, partitions or fractions are left out.
func NodeSnapshot(slices []resourceapi.ResourceSlice, node string) *snapshot.Snapshot {
	s := &snapshot.Snapshot{Host: snapshot.Host{Hostname: node}}
	for _, sl := range slices {
		if sl.Spec.Driver != DriverName || sl.Spec.NodeName == nil || *sl.Spec.NodeName != node {
			continue
		}
		for _, d := range sl.Spec.Devices {
			a := d.Attributes
			if attrString(a, AttrType) != TypeGPU {
				continue
			}
			idx := attrInt(a, AttrIndex)
			if idx < 0 {
				continue
			}
			g := snapshot.GPU{Index: idx, Vendor: attrString(a, AttrVendor), Model: attrString(a, AttrProductName),
				UUID: attrString(a, AttrUUID), PCIAddress: attrString(a, AttrPCIBusID),
				ComputeCapability: cutPatch(attrVersion(a, AttrCUDAComputeCapability)), GFXTarget: attrString(a, AttrGFXTarget)}
			if c, ok := d.Capacity[CapMemory]; ok && c.Value.Sign() > 0 {
				g.MemoryTotalBytes = uint64(c.Value.Value())
			}
			switch g.Vendor {
			case "nvidia":
				s.Drivers.NVIDIAUser = attrVersion(a, AttrDriverVersion)
				s.Drivers.CUDADriver = cutPatch(attrVersion(a, AttrCUDADriverVersion))
			case "amd":
				s.Drivers.AMDGPU = attrVersion(a, AttrDriverVersion)
				s.Drivers.ROCm = attrVersion(a, AttrROCmVersion)
			}
			s.GPUs = append(s.GPUs, g)
		}
	}
	return s
}

func attrString(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string) string {
	if v, ok := a[resourceapi.QualifiedName(name)]; ok && v.StringValue != nil {
		return *v.StringValue
	}
	return ""
}

func attrVersion(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string) string {
	if v, ok := a[resourceapi.QualifiedName(name)]; ok && v.VersionValue != nil {
		return *v.VersionValue
	}
	return ""
}

func attrInt(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string) int {
	if v, ok := a[resourceapi.QualifiedName(name)]; ok && v.IntValue != nil {
		return int(*v.IntValue)
	}
	return -1
}

// cutPatch writes "12.4.0" as "12.4".
func cutPatch(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}
