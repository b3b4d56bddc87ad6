package compat

import (
	"fmt"
	"slices"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

func checkAMD(req *Requirements, s *snapshot.Snapshot, c gpuCtx, gfx string, k *kb.KB, r *GPUReport) {
	if !req.HasROCm() {
		if req.HasCUDA() {
			need, _ := runtimeNeed(req)
			r.fail(fmt.Sprintf("the image is built for CUDA %s (NVIDIA GPUs) and has no ROCm stack: this AMD %s runs ROCm/HIP code only", firstNonEmpty(need, "(version unknown)"), c.name),
				"use a ROCm build of the image (for PyTorch, a rocm6.x/rocm7.x wheel or a rocm/pytorch image), or run this image on an NVIDIA node")
		}
		return
	}
	rocm := req.ROCm
	line := majorMinor(rocm)
	if rocm == "" || rocm == "unknown" {
		r.note("the image's ROCm version is unknown: GPU support and the driver window were not checked")
		return
	}

	// GPU support of the ROCm release.
	if rel, ok := k.ROCmFor(rocm); ok {
		if gfx == "" {
			r.note(fmt.Sprintf("the gfx target of %s is unknown: ROCm %s support was not checked", c.name, rocm))
		} else if !slices.Contains(rel.GFX, gfx) {
			r.fail(fmt.Sprintf("ROCm %s does not support %s (%s): its libraries ship code for %s only", rocm, gfx, c.name, strings.Join(rel.GFX, ", ")),
				fmt.Sprintf("run the image on a GPU ROCm %s supports, or use a ROCm release that lists %s", line, gfx))
		} else {
			r.note(fmt.Sprintf("ROCm %s supports %s (%s)", rocm, gfx, c.name))
		}
	} else {
		r.note(fmt.Sprintf("kiln has no GPU support table for ROCm %s: %s support was not checked", rocm, firstNonEmpty(gfx, c.name)))
	}

	// The kernel driver's support window.
	drv := s.Drivers.AMDGPU
	if drv == "" {
		r.note("the amdgpu driver version is unknown: the driver/user-space window was not checked")
		return
	}
	kmd := k.KMDRelease(drv)
	if kmd == "" {
		r.note(fmt.Sprintf("kiln cannot tell which ROCm release amdgpu driver %s belongs to: the driver/user-space window was not checked", drv))
		return
	}
	users, ok := k.KMDUserspace(kmd)
	if !ok {
		r.note(fmt.Sprintf("amdgpu driver %s belongs to ROCm %s, for which AMD's support matrix has no row in kiln: the window was not checked", drv, kmd))
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
