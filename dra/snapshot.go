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
			if StringOf(a, AttrType) != TypeGPU {
				continue
			}
			idx := attrInt(a, AttrIndex)
			if idx < 0 {
				continue
			}
			g := snapshot.GPU{Index: idx, Vendor: StringOf(a, AttrVendor), Model: StringOf(a, AttrProductName),
				UUID: StringOf(a, AttrUUID), PCIAddress: StringOf(a, AttrPCIBusID),
				ComputeCapability: MajorMinor(VersionOf(a, AttrCUDAComputeCapability)), GFXTarget: StringOf(a, AttrGFXTarget)}
			if c, ok := d.Capacity[CapMemory]; ok && c.Value.Sign() > 0 {
				g.MemoryTotalBytes = uint64(c.Value.Value())
			}
			switch g.Vendor {
			case "nvidia":
				s.Drivers.NVIDIAUser = VersionOf(a, AttrDriverVersion)
				s.Drivers.CUDADriver = MajorMinor(VersionOf(a, AttrCUDADriverVersion))
			case "amd":
				s.Drivers.AMDGPU = VersionOf(a, AttrDriverVersion)
				s.Drivers.ROCm = VersionOf(a, AttrROCmVersion)
			}
			s.GPUs = append(s.GPUs, g)
		}
	}
	return s
}

// StringOf is a device attribute's string value, "" when it has none.
func StringOf(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string) string {
	if v, ok := a[resourceapi.QualifiedName(name)]; ok && v.StringValue != nil {
		return *v.StringValue
	}
	return ""
}

// VersionOf is a device attribute's version value, "" when it has none.
func VersionOf(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string) string {
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

// MajorMinor writes a semantic version as major.minor ("12.4.0" is
// "12.4"), the form kiln's tables use for CUDA and compute capabilities.
func MajorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}
