package admission

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"kiln.dev/kiln/kb"
)

// Selector is the CEL expression that keeps a claim on the devices that
// run every image of its Pod, and the devices it lets through.
type Selector struct {
	CEL     string
	Devices []string // node/device, sorted
}

// ErrNoDevice is returned when no device runs every image: the Pod is
// refused, so there is no claim to keep.
var ErrNoDevice = errors.New("no device of the cluster runs every image of the pod")

// Selectors builds the selector a claim needs: on NVIDIA devices the
// least cudaDriverVersion that runs the images and the compute
// capabilities they have code for, on AMD the gfx targets. It is checked
// against the devices: it lets through exactly those that run every
// image, or it is not made (an error says which device the attributes
// cannot tell apart).
func Selectors(images []Image, devs []Device, k *kb.KB) (*Selector, error) {
	ok := map[string]bool{}
	for _, d := range devs {
		ok[d.ID()] = true
	}
	for _, im := range images {
		if im.Err != nil || im.Requirements == nil {
			continue
		}
		for _, j := range Judge(im.Requirements, devs, k) {
			if !j.Report.Verdict.Runs() {
				ok[j.Device.ID()] = false
			}
		}
	}
	var nvCC, amdGFX []string
	minCUDA := ""
	for _, d := range devs {
		if !ok[d.ID()] {
			continue
		}
		switch {
		case d.Vendor == "nvidia" && d.ComputeCapability != "" && d.CUDADriver != "":
			nvCC = append(nvCC, d.ComputeCapability)
			if minCUDA == "" || kb.CompareDriver(d.CUDADriver, minCUDA) < 0 {
				minCUDA = d.CUDADriver
			}
		case d.Vendor == "amd" && d.GFXTarget != "":
			amdGFX = append(amdGFX, d.GFXTarget)
		default:
			// Runs, but without the attributes a selector could name.
			ok[d.ID()] = false
		}
	}
	nvCC, amdGFX = sortedUnique(nvCC), sortedUnique(amdGFX)
	if len(nvCC) == 0 && len(amdGFX) == 0 {
		return nil, ErrNoDevice
	}
	sel := &Selector{}
	const attr = "device.attributes['gpu.kiln.dev']"
	var alts []string
	if len(nvCC) > 0 {
		var ccs []string
		for _, cc := range nvCC {
			ccs = append(ccs, fmt.Sprintf("%s.cudaComputeCapability.compareTo(semver('%s')) == 0", attr, semverOf(cc)))
		}
		alts = append(alts, fmt.Sprintf("(%s.vendor == 'nvidia' && has(%s.cudaDriverVersion) && has(%s.cudaComputeCapability) && %s.cudaDriverVersion.compareTo(semver('%s')) >= 0 && (%s))",
			attr, attr, attr, attr, semverOf(minCUDA), strings.Join(ccs, " || ")))
	}
	if len(amdGFX) > 0 {
		alts = append(alts, fmt.Sprintf("(%s.vendor == 'amd' && has(%s.gfxTarget) && %s.gfxTarget in ['%s'])", attr, attr, attr, strings.Join(amdGFX, "', '")))
	}
	sel.CEL = strings.Join(alts, " || ")
	// The same test in Go, over the cluster's devices: the selector must
	// let through the devices that run the images, and no other.
	for _, d := range devs {
		pass := false
		switch d.Vendor {
		case "nvidia":
			pass = d.CUDADriver != "" && slices.Contains(nvCC, d.ComputeCapability) && kb.CompareDriver(d.CUDADriver, minCUDA) >= 0
		case "amd":
			pass = slices.Contains(amdGFX, d.GFXTarget)
		}
		if pass && !ok[d.ID()] {
			return nil, fmt.Errorf("device %s has the attributes of devices that run the images but does not run them itself; kiln cannot keep claims off it by attributes", d.ID())
		}
		if pass {
			sel.Devices = append(sel.Devices, d.ID())
		}
	}
	slices.Sort(sel.Devices)
	return sel, nil
}

// semverOf writes "12.4" as the semantic version "12.4.0".
func semverOf(v string) string {
	parts := strings.Split(v, ".")
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	return strings.Join(parts[:3], ".")
}
