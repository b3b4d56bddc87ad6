package dra

import (
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// Label prefixes: kiln's own, and those of NVIDIA's GPU Feature Discovery
// and AMD's node labeller, which kiln writes only where those tools do not.
const (
	LabelPrefix       = "kiln.dev/"
	nvidiaLabelPrefix = "nvidia.com/"
	amdLabelPrefix    = "amd.com/"
	// VendorLabelsAnnotation lists the vendor label prefixes kiln wrote on
	// a node, so that kiln updates its own and leaves another tool's alone.
	VendorLabelsAnnotation = "kiln.dev/vendor-labels"
)

// NodeLabels are the labels of a node for clusters without DRA, from what
// Build made of it: kiln's own (kiln.dev/...) always, and NVIDIA GPU Feature
// Discovery's or AMD node labeller's keys for the vendors present. existing
// are the node's labels now and owned the vendor prefixes kiln wrote before
// (the annotation VendorLabelsAnnotation): a vendor prefix another tool
// already uses is left to it. It returns the labels and the prefixes kiln
// owns now.
func NodeLabels(r *Result, existing map[string]string, owned []string) (map[string]string, []string) {
	out := map[string]string{}
	gpus := wholeGPUs(r)
	set := func(k, v string) {
		if v = labelValue(v); v != "" {
			out[k] = v
		}
	}
	set(LabelPrefix+"gpu", strconv.FormatBool(len(gpus) > 0))
	set(LabelPrefix+"gpu.count", strconv.Itoa(len(gpus)))
	island, health := 0, HealthHealthy
	var vendors []string
	for _, d := range r.Devices() {
		if v := intAttr(d, AttrNVLinkIslandSize); int(v) > island {
			island = int(v)
		}
		switch strAttr(d, AttrHealth) {
		case HealthCritical:
			health = HealthCritical
		case HealthWarning:
			if health == HealthHealthy {
				health = HealthWarning
			}
		}
		if v := strAttr(d, AttrVendor); v != "" && !slices.Contains(vendors, v) {
			vendors = append(vendors, v)
		}
	}
	set(LabelPrefix+"nvlink-island.max", strconv.Itoa(island))
	set(LabelPrefix+"doctor", health)
	set(LabelPrefix+"gfx-target", common(gpus, AttrGFXTarget))
	set(LabelPrefix+"rocm-version", common(gpus, AttrROCmVersion))
	set(LabelPrefix+"cuda-driver-version", common(gpus, AttrCUDADriverVersion))
	set(LabelPrefix+"product", common(gpus, AttrProductName))

	var own []string
	mayUse := func(prefix string) bool {
		if slices.Contains(owned, prefix) {
			return true
		}
		for k := range existing {
			if strings.HasPrefix(k, prefix) {
				return false // another tool labels this vendor
			}
		}
		return true
	}
	if slices.Contains(vendors, "nvidia") && mayUse(nvidiaLabelPrefix) {
		own = append(own, nvidiaLabelPrefix)
		nv := filterVendor(gpus, "nvidia")
		set(nvidiaLabelPrefix+"gpu.present", "true")
		set(nvidiaLabelPrefix+"gpu.count", strconv.Itoa(len(nv)))
		set(nvidiaLabelPrefix+"gpu.product", common(nv, AttrProductName))
		set(nvidiaLabelPrefix+"gpu.family", common(nv, AttrArchitecture))
		if m := minMemoryMiB(nv); m > 0 {
			set(nvidiaLabelPrefix+"gpu.memory", strconv.FormatInt(m, 10))
		}
		if cc := common(nv, AttrCUDAComputeCapability); cc != "" {
			p := strings.Split(cc, ".")
			set(nvidiaLabelPrefix+"gpu.compute.major", p[0])
			set(nvidiaLabelPrefix+"gpu.compute.minor", p[1])
		}
		if v := common(nv, AttrCUDADriverVersion); v != "" {
			p := strings.Split(v, ".")
			set(nvidiaLabelPrefix+"cuda.driver-version.major", p[0])
			set(nvidiaLabelPrefix+"cuda.driver-version.minor", p[1])
			set(nvidiaLabelPrefix+"cuda.driver-version.full", p[0]+"."+p[1])
		}
		if v := common(nv, AttrDriverVersion); v != "" {
			p := strings.Split(v, ".")
			set(nvidiaLabelPrefix+"gpu.driver.major", p[0])
			set(nvidiaLabelPrefix+"gpu.driver.minor", p[1])
			set(nvidiaLabelPrefix+"gpu.driver.rev", p[2])
		}
		mig := false
		for _, d := range r.Devices() {
			mig = mig || strAttr(d, AttrType) == TypeMIG
		}
		set(nvidiaLabelPrefix+"mig.capable", strconv.FormatBool(mig))
	}
	if slices.Contains(vendors, "amd") && mayUse(amdLabelPrefix) {
		own = append(own, amdLabelPrefix)
		amd := filterVendor(gpus, "amd")
		set(amdLabelPrefix+"gpu.count", strconv.Itoa(len(amd)))
		set(amdLabelPrefix+"gpu.family", strings.ToUpper(common(amd, AttrArchitecture)))
		set(amdLabelPrefix+"gpu.product-name", common(amd, AttrProductName))
		set(amdLabelPrefix+"gpu.driver-version", common(amd, AttrDriverVersion))
		if m := minMemoryMiB(amd); m > 0 {
			set(amdLabelPrefix+"gpu.vram", strconv.FormatInt(m/1024, 10)+"G")
		}
		if p := common(r.Devices(), AttrComputePartition); p != "" {
			set(amdLabelPrefix+"compute-partitioning-mode", strings.ToLower(p))
		}
		if p := common(r.Devices(), AttrMemoryPartition); p != "" {
			set(amdLabelPrefix+"memory-partitioning-mode", strings.ToLower(p))
		}
	}
	return out, own
}

// wholeGPUs returns one device per physical GPU: the GPU itself, or its
// first partition when the GPU is published as partitions.
func wholeGPUs(r *Result) []resourceapi.Device {
	var out []resourceapi.Device
	seen := map[int64]bool{}
	for _, d := range r.Devices() {
		t := strAttr(d, AttrType)
		if t != TypeGPU && t != TypePartition {
			continue
		}
		i := intAttr(d, AttrIndex)
		if seen[i] {
			continue
		}
		seen[i] = true
		out = append(out, d)
	}
	return out
}

func filterVendor(ds []resourceapi.Device, vendor string) []resourceapi.Device {
	var out []resourceapi.Device
	for _, d := range ds {
		if strAttr(d, AttrVendor) == vendor {
			out = append(out, d)
		}
	}
	return out
}

// common is the value of an attribute when every device that has it has
// the same one; "" when none has it or they differ.
func common(ds []resourceapi.Device, name string) string {
	v := ""
	for _, d := range ds {
		x := strAttr(d, name)
		if x == "" {
			continue
		}
		if v != "" && x != v {
			return ""
		}
		v = x
	}
	return v
}

func minMemoryMiB(ds []resourceapi.Device) int64 {
	var m int64
	for _, d := range ds {
		c, ok := d.Capacity[CapMemory]
		if !ok {
			continue
		}
		mib := c.Value.Value() >> 20
		if m == 0 || mib < m {
			m = mib
		}
	}
	return m
}

func strAttr(d resourceapi.Device, name string) string {
	a := d.Attributes[resourceapi.QualifiedName(name)]
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return ""
}

func intAttr(d resourceapi.Device, name string) int64 {
	if a := d.Attributes[resourceapi.QualifiedName(name)]; a.IntValue != nil {
		return *a.IntValue
	}
	return 0
}
