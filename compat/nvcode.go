package compat

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/compat/fatbin"
	"kiln.dev/kiln/kb"
)

func hasNVIDIACode(req *Requirements) bool {
	for _, b := range req.Binaries {
		if !b.code.Empty() {
			return true
		}
	}
	return false
}

// codeJudgement is what one binary's CUDA code does on one GPU.
type codeJudgement struct {
	verdict Verdict
	uses    string // the code that runs
	reason  string // why it fails or why kiln cannot tell
	fix     string
}

// judgeNVIDIA applies NVIDIA's rules to one binary's code on a GPU of
// compute capability cc whose driver (the JIT compiler) is drv:
//   - SASS sm_XY runs on X.Z for Z >= Y; sm_XYa on X.Y only; sm_XYf on the
//     members of its family (kb.SASSRunsOn, with its source);
//   - PTX compute_XY is compiled by the driver for capability >= X.Y
//     (arch-specific PTX for X.Y only), and only when the driver knows the
//     PTX ISA version: a driver older than the toolkit that wrote the PTX
//     refuses it (CUDA_ERROR_UNSUPPORTED_PTX_VERSION); CUDA minor-version
//     compatibility does not cover PTX (kb/data/ptx.yaml, with sources).
//
// Native code is preferred, as the CUDA runtime prefers it.
func judgeNVIDIA(code *fatbin.Result, cc, drv string, k *kb.KB) codeJudgement {
	var unsure []string
	for _, c := range code.SASS() {
		if c.Variant == fatbin.VariantUnknown {
			if fatbin.CC(c.Arch) == cc {
				return codeJudgement{verdict: Runs, uses: c.Name()}
			}
			if ok, _, _ := kb.SASSRunsOn(c.Name(), cc); ok {
				unsure = append(unsure, c.Name()+" of a variant kiln could not read (a plain "+c.Name()+" runs on "+cc+", an "+c.Name()+"a does not)")
			}
			continue
		}
		ok, _, known := kb.SASSRunsOn(c.Name(), cc)
		if ok {
			return codeJudgement{verdict: Runs, uses: c.Name()}
		}
		if !known {
			unsure = append(unsure, c.Name()+" (a target kiln's rules do not cover)")
		}
	}
	maxISA, maxKnown := "", false
	if drv != "" {
		maxISA, maxKnown = k.MaxPTXForDriver(drv)
	}
	var tooNew []fatbin.Code
	var best *fatbin.Code
	for _, c := range code.PTX() {
		c := c
		name := c.Name()
		if c.Variant == fatbin.VariantUnknown {
			if fatbin.CC(c.Arch) != cc {
				if ok, _, _ := kb.PTXRunsOn(name, cc); ok {
					unsure = append(unsure, name+" of a variant kiln could not read")
				}
				continue
			}
		} else if ok, _, known := kb.PTXRunsOn(name, cc); !ok {
			if !known {
				unsure = append(unsure, name+" (a target kiln's rules do not cover)")
			}
			continue
		}
		// The PTX could be compiled for this GPU: does the driver read its ISA?
		switch {
		case drv == "":
			unsure = append(unsure, c.String()+" (the driver version is unknown)")
			continue
		case c.ISA == "":
			unsure = append(unsure, name+" (its PTX ISA version is unknown)")
			continue
		}
		if _, _, known := k.MinDriverForPTX(c.ISA); !known {
			if !maxKnown || fatbin.CompareISA(c.ISA, maxISA) > 0 {
				unsure = append(unsure, c.String()+", newer than kiln's PTX table (kb/data/ptx.yaml)")
				continue
			}
		}
		if !maxKnown || fatbin.CompareISA(c.ISA, maxISA) > 0 {
			tooNew = append(tooNew, c)
			continue
		}
		if best == nil || c.Arch > best.Arch {
			best = &c
		}
	}
	if best != nil {
		return codeJudgement{verdict: RunsViaJIT, uses: best.String() + " by JIT"}
	}
	if len(unsure) > 0 {
		return codeJudgement{verdict: Unknown, reason: "kiln cannot tell whether it runs: " + strings.Join(unsure, "; "),
			fix: "give kiln the missing fact (see the reason), or check by running the image's kernels once on this GPU"}
	}
	sm := "sm_" + strings.ReplaceAll(cc, ".", "")
	if len(tooNew) > 0 {
		c := tooNew[len(tooNew)-1]
		for _, t := range tooNew {
			if fatbin.CompareISA(t.ISA, c.ISA) < 0 {
				c = t // the oldest ISA asks least of the driver
			}
		}
		minDrv, cuda, _ := k.MinDriverForPTX(c.ISA)
		supports := "no PTX ISA kiln knows"
		if maxKnown {
			supports = "PTX ISA up to " + maxISA
		}
		reason := fmt.Sprintf("no %s code, and its PTX %s was written by CUDA %s: driver %s compiles %s, so the driver refuses it (CUDA_ERROR_UNSUPPORTED_PTX_VERSION, \"the provided PTX was compiled with an unsupported toolchain\"); CUDA minor-version compatibility does not cover PTX",
			sm, c.String(), firstNonEmpty(cuda, "a newer toolkit"), drv, supports)
		fix := fmt.Sprintf("upgrade the driver to >= %s, or use a build of the image with %s code", firstNonEmpty(minDrv, "one that supports CUDA "+cuda), sm)
		return codeJudgement{verdict: Fails, reason: reason, fix: fix}
	}
	return codeJudgement{verdict: Fails,
		reason: fmt.Sprintf("no %s code and no PTX the driver can compile for compute capability %s: its kernels fail with \"no kernel image is available for execution on the device\"", sm, cc),
		fix:    fmt.Sprintf("use a build that includes %s (or PTX for an architecture <= %s)", sm, cc)}
}

// checkBinaries judges every binary with CUDA code and sums them up: the
// image runs only when every one of them runs.
func checkBinaries(req *Requirements, c gpuCtx, cc, drv string, k *kb.KB, r *GPUReport) {
	var fails, unknowns, jits []int
	var judged []codeJudgement
	var bins []Binary // bins[i] is the binary judged[i] judges
	for _, b := range req.Binaries {
		if b.code.Empty() {
			continue
		}
		j := judgeNVIDIA(b.code, cc, drv, k)
		judged, bins = append(judged, j), append(bins, b)
		i := len(judged) - 1
		r.Binaries = append(r.Binaries, BinaryVerdict{Path: b.Path, Verdict: j.verdict, Uses: j.uses, Reason: j.reason})
		switch j.verdict {
		case Fails:
			fails = append(fails, i)
		case Unknown:
			unknowns = append(unknowns, i)
		case RunsViaJIT:
			jits = append(jits, i)
		}
	}
	bin := func(i int) Binary { return bins[i] }
	paths := func(is []int) []string {
		var out []string
		for _, i := range is {
			out = append(out, bin(i).Path)
		}
		return out
	}
	if len(fails) > 0 {
		j := judged[fails[0]]
		r.fail(fmt.Sprintf("%s: %s on %s%s", describeBinary(req, bin(fails[0])), j.reason, c.name, more(paths(fails))), j.fix)
		return
	}
	if len(unknowns) > 0 {
		j := judged[unknowns[0]]
		r.unknown(fmt.Sprintf("%s on %s: %s%s", describeBinary(req, bin(unknowns[0])), c.name, j.reason, more(paths(unknowns))), j.fix)
		return
	}
	if len(jits) > 0 {
		names := paths(jits)
		sm := "sm_" + strings.ReplaceAll(cc, ".", "")
		others := ""
		if len(names) > 1 {
			list := strings.Join(names[1:min(4, len(names))], ", ")
			if len(names) > 4 {
				list += fmt.Sprintf(" and %d more", len(names)-4)
			}
			others = " The same holds for " + list + "."
		}
		r.set(RunsViaJIT, fmt.Sprintf("%s: with no %s code for %s (%s) it runs only through JIT compilation of PTX (%s) when it first loads, a start-up delay of seconds to minutes that comes back whenever the JIT cache (~/.nv/ComputeCache; CUDA_CACHE_PATH, CUDA_CACHE_MAXSIZE) is empty or too small, and kernels that may run slower than native code.%s",
			describeBinary(req, bin(jits[0])), sm, c.name, cc, strings.TrimSuffix(judged[jits[0]].uses, " by JIT"), others),
			fmt.Sprintf("use a build that includes %s to avoid the JIT, or keep a persistent JIT cache of sufficient size", sm))
		return
	}
	sm := "sm_" + strings.ReplaceAll(cc, ".", "")
	r.note(fmt.Sprintf("every binary with GPU code (%d) has code for %s (%s)", len(judged), c.name, sm))
}
