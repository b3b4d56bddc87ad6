// Package admission decides what kiln's admission webhook answers: whether
// a Pod's images can run on any GPU the cluster publishes, and which CEL
// selectors keep a ResourceClaim on the GPUs that run them. It is a pure
// function of the cluster's ResourceSlices and the images' requirements
// (kiln compat); reading images and serving HTTP are done elsewhere.
package admission

import (
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/snapshot"
)

// Device is one of kiln's devices as its ResourceSlice describes it.
type Device struct {
	Node, Name string
	Type       string // gpu, mig, partition, fraction
	Vendor     string
	Model      string
	// ComputeCapability ("9.0") or GFXTarget ("gfx942").
	ComputeCapability, GFXTarget string
	// Driver is the NVIDIA driver or amdgpu version; CUDADriver the newest
	// CUDA the NVIDIA driver runs ("12.4"); ROCm the ROCm release.
	Driver, CUDADriver, ROCm string
}

// Devices reads kiln's devices (driver gpu.kiln.dev) from the slices;
// other drivers' devices are not kiln's to judge.
func Devices(slices []resourceapi.ResourceSlice) []Device {
	var out []Device
	for _, s := range slices {
		if s.Spec.Driver != dra.DriverName {
			continue
		}
		node := s.Spec.Pool.Name
		if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
			node = *s.Spec.NodeName
		}
		for _, d := range s.Spec.Devices {
			a := d.Attributes
			out = append(out, Device{
				Node: node, Name: d.Name,
				Type:              str(a, dra.AttrType),
				Vendor:            str(a, dra.AttrVendor),
				Model:             str(a, dra.AttrProductName),
				ComputeCapability: majorMinor(version(a, dra.AttrCUDAComputeCapability)),
				GFXTarget:         str(a, dra.AttrGFXTarget),
				Driver:            version(a, dra.AttrDriverVersion),
				CUDADriver:        majorMinor(version(a, dra.AttrCUDADriverVersion)),
				ROCm:              version(a, dra.AttrROCmVersion),
			})
		}
	}
	return out
}

// ID names the device for people: node/device.
func (d Device) ID() string { return d.Node + "/" + d.Name }

// snapshot is the device as a one-GPU node, for kiln compat.
func (d Device) snapshot() *snapshot.Snapshot {
	s := &snapshot.Snapshot{Host: snapshot.Host{Hostname: d.Node}}
	g := snapshot.GPU{Index: 0, Vendor: d.Vendor, Model: d.Model, ComputeCapability: d.ComputeCapability, GFXTarget: d.GFXTarget}
	switch d.Vendor {
	case "nvidia":
		s.Drivers.NVIDIAUser, s.Drivers.CUDADriver = d.Driver, d.CUDADriver
	case "amd":
		s.Drivers.AMDGPU, s.Drivers.ROCm = d.Driver, d.ROCm
	}
	s.GPUs = []snapshot.GPU{g}
	return s
}

func str(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string) string {
	if v, ok := a[resourceapi.QualifiedName(name)]; ok && v.StringValue != nil {
		return *v.StringValue
	}
	return ""
}

func version(a map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name string) string {
	if v, ok := a[resourceapi.QualifiedName(name)]; ok && v.VersionValue != nil {
		return *v.VersionValue
	}
	return ""
}

// majorMinor cuts a semantic version to major.minor ("12.4.0" -> "12.4"),
// the form kiln's tables use for CUDA and compute capabilities.
func majorMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

// sortedUnique sorts and removes repeats.
func sortedUnique(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}
