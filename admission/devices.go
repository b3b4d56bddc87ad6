// Package admission decides what kiln's admission webhook answers: whether
// a Pod's images can run on any GPU the cluster publishes, and which CEL
// selectors keep a ResourceClaim on the GPUs that run them. It is a pure
// function of the cluster's ResourceSlices and the images' requirements
// (kiln compat); reading images and serving HTTP are done elsewhere.
package admission

import (
	"slices"

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
				Type:              dra.StringOf(a, dra.AttrType),
				Vendor:            dra.StringOf(a, dra.AttrVendor),
				Model:             dra.StringOf(a, dra.AttrProductName),
				ComputeCapability: dra.MajorMinor(dra.VersionOf(a, dra.AttrCUDAComputeCapability)),
				GFXTarget:         dra.StringOf(a, dra.AttrGFXTarget),
				Driver:            dra.VersionOf(a, dra.AttrDriverVersion),
				CUDADriver:        dra.MajorMinor(dra.VersionOf(a, dra.AttrCUDADriverVersion)),
				ROCm:              dra.VersionOf(a, dra.AttrROCmVersion),
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

// sortedUnique sorts and removes repeats.
func sortedUnique(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}
