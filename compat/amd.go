package compat

import (
	"fmt"
	"slices"
	"strings"

	"kiln.dev/kiln/compat/offload"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

func checkAMD(req *Requirements, s *snapshot.Snapshot, c gpuCtx, gfx string, k *kb.KB, r *GPUReport) {
	if !req.HasROCm() {
		if req.HasCUDA() {
			need, _ := runtimeNeed(req, k)
			r.fail(fmt.Sprintf("the image is built for CUDA %s (NVIDIA GPUs) and has no ROCm stack: this AMD %s runs ROCm/HIP code only", firstNonEmpty(need, "(version unknown)"), c.name),
				"use a ROCm build of the image (for PyTorch, a rocm6.x/rocm7.x wheel or a rocm/pytorch image), or run this image on an NVIDIA node")
		}
		return
	}
	if gfx == "" {
		what := fmt.Sprintf("kiln does not know the gfx target of %s", firstNonEmpty(c.g.Model, "this AMD GPU (no model name in the node's data)"))
		if c.g.DeviceID != "" {
			what += " (PCI device " + c.g.Vendor + ":" + c.g.DeviceID + ")"
		}
		r.unknown(what+": whether the image's GPU code runs on it was not checked",
			"give the node's data with the target (rocminfo, amd-smi static, a copy of /sys/class/kfd/kfd/topology, or kiln inventory on the node), or add the model to kiln's GPU catalogue (kb/data/gpus.yaml, with its source)")
		return
	}
	hasCode := checkAMDBinaries(req, c, gfx, r)

	rocm := req.ROCm
	line := majorMinor(rocm)
	if rocm == "" || rocm == "unknown" {
		if hasCode {
			r.note("the image's ROCm version is unknown: the driver window was not checked; its GPU code was")
			return
		}
		r.unknown("the image's ROCm version is unknown and kiln found no AMD code objects in it: GPU support and the driver window were not checked",
			"set the ROCm version in the image (ROCm's /opt/rocm/.info/version, or a rocm-core package) or check the image's libraries")
		return
	}

	// GPU support of the ROCm release: a second opinion when the image's
	// own code objects were read, the only one for libraries that load
	// their kernels at run time when none were.
	if rel, ok := k.ROCmFor(rocm); ok {
		switch {
		case !slices.Contains(rel.GFX, gfx) && hasCode:
			r.note(fmt.Sprintf("AMD's support table for ROCm %s does not list %s (%s); kiln went by the code objects the image holds", rocm, gfx, c.name))
		case !slices.Contains(rel.GFX, gfx):
			r.fail(fmt.Sprintf("ROCm %s does not support %s (%s): its libraries ship code for %s only", rocm, gfx, c.name, strings.Join(rel.GFX, ", ")),
				fmt.Sprintf("run the image on a GPU ROCm %s supports, or use a ROCm release that lists %s", line, gfx))
		default:
			r.note(fmt.Sprintf("ROCm %s supports %s (%s)", rocm, gfx, c.name))
		}
	} else if !hasCode {
		r.unknown(fmt.Sprintf("kiln has no GPU support table for ROCm %s and found no AMD code objects in the image: %s support was not checked", rocm, gfx),
			"add the release to kiln's ROCm table (kb/data/rocm.yaml, with its source)")
	}

	// The kernel driver's support window.
	drv := s.Drivers.AMDGPU
	if drv == "" {
		r.unknown("the amdgpu driver version is unknown: the driver/user-space window was not checked",
			"give the node's data with the driver version (cat /sys/module/amdgpu/version, amd-smi version, or kiln inventory on the node)")
		return
	}
	kmd := k.KMDRelease(drv)
	if kmd == "" {
		r.unknown(fmt.Sprintf("kiln cannot tell which ROCm release amdgpu driver %s belongs to: the driver/user-space window was not checked", drv),
			"add the driver to kiln's ROCm driver table (kb/data/rocm-kmd.yaml, with its source)")
		return
	}
	users, ok := k.KMDUserspace(kmd)
	if !ok {
		r.unknown(fmt.Sprintf("amdgpu driver %s belongs to ROCm %s, for which AMD's support matrix has no row in kiln: the window was not checked", drv, kmd),
			"add the row to kiln's ROCm driver table (kb/data/rocm-kmd.yaml, with its source)")
		return
	}
	if slices.Contains(users, line) {
		r.note(fmt.Sprintf("amdgpu driver %s (ROCm %s) supports ROCm %s user space", drv, kmd, line))
		return
	}
	// Which driver lines support the image's ROCm?
	var good []string
	for _, row := range k.ROCmKMD {
		if row.Module == "" && slices.Contains(row.Userspace, line) {
			good = append(good, row.KMD)
		}
	}
	good = uniqSorted(good)
	fix := fmt.Sprintf("use an image with ROCm %s", strings.Join(users, ", "))
	if len(good) > 0 {
		fix = fmt.Sprintf("upgrade the amdgpu driver to that of ROCm %s, or %s", strings.Join(good, ", "), fix)
	}
	r.fail(fmt.Sprintf("amdgpu driver %s belongs to ROCm %s, which AMD supports with ROCm user space %s only; the image has ROCm %s (AMD's rule: kernel driver and user space within 2 releases up to 6.3, within a year from 6.4)",
		drv, kmd, strings.Join(users, ", "), rocm), fix)
}

// checkAMDBinaries judges the AMD code objects of the image on a GPU of
// target gfx, by the HIP loader's rules (offload.Matches: the processor, or
// a generic target's member; a feature left unset matches either setting).
// It reports whether the image holds any AMD code.
func checkAMDBinaries(req *Requirements, c gpuCtx, gfx string, r *GPUReport) bool {
	// A node that reports its target without features runs with XNACK
	// off, the default: the ROCm runtime turns it on only for processes
	// started with HSA_XNACK=1 on a kernel with page retry enabled (ROCm
	// documentation, "GPU memory: XNACK"). SRAM ECC is left unknown.
	assumed := ""
	if !strings.Contains(gfx, ":") {
		if ok, known := offload.SupportsFeature(gfx, "xnack"); ok && known {
			switch req.HSAXNACK {
			case "1":
				gfx += ":xnack+"
				assumed = " (XNACK on: the image sets HSA_XNACK=1)"
			case "", "0":
				gfx += ":xnack-"
				assumed = " (XNACK taken as off, ROCm's default unless HSA_XNACK=1)"
			}
			// Any other value: the setting stays unknown.
		}
	}
	var fails, unsure []Binary
	var reasons []string
	n := 0
	for _, b := range req.Binaries {
		if b.amd.Empty() {
			continue
		}
		n++
		v, uses, why := judgeAMD(b.amd.Targets, gfx)
		r.Binaries = append(r.Binaries, BinaryVerdict{Path: b.Path, Verdict: v, Uses: uses, Reason: why})
		switch v {
		case Fails:
			fails = append(fails, b)
			reasons = append(reasons, why)
		case Unknown:
			unsure = append(unsure, b)
			if len(fails) == 0 {
				reasons = append(reasons, why)
			}
		}
	}
	paths := func(bs []Binary) []string {
		var out []string
		for _, b := range bs {
			out = append(out, b.Path)
		}
		return out
	}
	switch {
	case n == 0:
		return false
	case len(fails) > 0:
		b := fails[0]
		r.fail(fmt.Sprintf("%s has code for %s only: no code object for %s%s (%s), so its kernels fail with hipErrorNoBinaryForGpu (\"no kernel image is available\")%s",
			b.Path, strings.Join(b.GFX, " "), gfx, assumed, c.name, more(paths(fails))),
			fmt.Sprintf("use a build of the image whose libraries include %s (for ROCm libraries, a release that supports it), or run it on a GPU it has code for", gfx))
	case len(unsure) > 0:
		b := unsure[0]
		r.unknown(fmt.Sprintf("%s on %s: %s%s", b.Path, c.name, reasons[0], more(paths(unsure))),
			"give the node's data with its target features (rocminfo prints e.g. gfx90a:sramecc+:xnack-)")
	default:
		r.note(fmt.Sprintf("every binary with AMD GPU code (%d) has code for %s%s (%s)", n, gfx, assumed, c.name))
	}
	return true
}

// judgeAMD says whether one binary's code objects run on target gfx.
func judgeAMD(ts []offload.Target, gfx string) (Verdict, string, string) {
	var maybe []offload.Target
	for _, t := range ts {
		ok, certain := offload.Matches(t, gfx)
		if ok && certain {
			return Runs, t.Name(), ""
		}
		if ok {
			maybe = append(maybe, t)
		}
	}
	if len(maybe) > 0 {
		// Code for both settings of each feature covers the GPU whatever
		// its setting.
		if coversBothSettings(maybe) {
			return Runs, maybe[0].Name() + " (or its other feature setting)", ""
		}
		var names []string
		for _, t := range maybe {
			names = append(names, t.Name())
		}
		return Unknown, "", fmt.Sprintf("its code (%s) needs a feature setting kiln does not know for this GPU (%s)", strings.Join(names, " "), gfx)
	}
	var names []string
	for _, t := range ts {
		names = append(names, t.Name())
	}
	return Fails, "", "no code object for " + gfx + " (it has " + strings.Join(names, " ") + ")"
}

// coversBothSettings reports whether targets of one processor cover both
// settings of every feature they set (gfx90a:xnack+ and gfx90a:xnack-).
func coversBothSettings(ts []offload.Target) bool {
	seen := map[string]bool{}
	for _, t := range ts {
		seen[t.Features] = true
	}
	for _, t := range ts {
		for _, f := range strings.Split(t.Features, ":") {
			if f == "" {
				continue
			}
			other := f[:len(f)-1] + "+"
			if strings.HasSuffix(f, "+") {
				other = f[:len(f)-1] + "-"
			}
			found := false
			for feat := range seen {
				for _, g := range strings.Split(feat, ":") {
					if g == other {
						found = true
					}
				}
			}
			if !found {
				return false
			}
		}
	}
	return true
}
