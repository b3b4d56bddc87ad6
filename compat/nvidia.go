package compat

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/compat/require"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

func checkNVIDIA(req *Requirements, s *snapshot.Snapshot, c gpuCtx, cc string, k *kb.KB, r *GPUReport) {
	if !req.HasCUDA() {
		if req.HasROCm() {
			r.fail(fmt.Sprintf("the image is built for ROCm %s (AMD GPUs) and has no CUDA stack: it cannot use this NVIDIA %s", req.ROCm, c.name),
				"use a CUDA build of the image (for PyTorch, a cu12x/cu13x wheel), or run this image on an AMD node")
		}
		return
	}
	jitDriver := checkDriver(req, s, c, k, r)
	if cc == "" {
		what := fmt.Sprintf("kiln does not know the compute capability of %s", firstNonEmpty(c.g.Model, "this NVIDIA GPU (no model name in the node's data)"))
		if c.g.DeviceID != "" {
			what += " (PCI device " + c.g.Vendor + ":" + c.g.DeviceID + ")"
		}
		r.unknown(what+": whether the image's GPU code runs on it was not checked",
			"give the node's data with the compute capability (nvidia-smi --query-gpu=name,compute_cap --format=csv, or kiln inventory on the node), or add the model to kiln's GPU catalogue (kb/data/gpus.yaml, with its source)")
		return
	}
	checkArch(req, c, cc, jitDriver, k, r)
}

// runtimeNeed is the newest CUDA the image's user space needs: the declared
// version, or a framework built against a newer CUDA (a cu128 wheel on a
// CUDA 12.1 base image needs 12.8).
//
// The binaries count too: PTX of ISA 9.1 was written by CUDA 13.1, and a
// library built with that toolkit needs its runtime, whatever the image
// declares.
func runtimeNeed(req *Requirements, k *kb.KB) (string, string) {
	need, from := req.CUDA, req.CUDAFrom
	if c, f := builtWith(req, k); c != "" && (need == "" || kb.CompareDriver(c, need) > 0) {
		need, from = c, f
	}
	for _, fw := range req.Frameworks {
		if fw.CUDA == "" {
			continue
		}
		if v := majorMinor(fw.CUDA); need == "" || kb.CompareDriver(v, need) > 0 {
			need, from = v, fw.Name+" "+fw.Version+" (built with CUDA "+fw.CUDA+")"
		}
	}
	return need, from
}

// checkDriver checks the driver against the CUDA the image needs. It
// returns the driver whose PTX JIT compiler the image's kernels would meet:
// the node's, or the forward-compatibility package's when the image runs
// through it.
func checkDriver(req *Requirements, s *snapshot.Snapshot, c gpuCtx, k *kb.KB, r *GPUReport) (jitDriver string) {
	drv := firstNonEmpty(s.Drivers.NVIDIAUser, s.Drivers.NVIDIAKernel)
	need, from := runtimeNeed(req, k)
	if drv == "" {
		r.unknown("the NVIDIA driver version is unknown: the CUDA requirement and PTX compilation were not checked",
			"give the node's data with the driver version (nvidia-smi -q, or kiln inventory on the node)")
		return ""
	}
	jitDriver = drv
	defer func() {
		if r.Verdict == RunsForwardCompat && req.CompatDriver != "" {
			jitDriver = req.CompatDriver
		}
	}()
	if need == "" {
		return
	}
	maxCUDA := firstNonEmpty(k.MaxCUDAForDriver(drv), s.Drivers.CUDADriver)
	rel, relKnown := k.MinDriverForCUDA(need)
	driverMeets := false
	if relKnown {
		driverMeets = kb.CompareDriver(drv, rel.MinDriverLinux) >= 0
	} else if maxCUDA != "" {
		driverMeets = kb.CompareDriver(maxCUDA, need) >= 0
	}
	upgrade := func() string {
		older := "an older CUDA build"
		if maxCUDA != "" {
			older = "a CUDA " + maxCUDA + " build"
		}
		if relKnown {
			return fmt.Sprintf("upgrade the driver to >= %s or use %s of the image", rel.MinDriverLinux, older)
		}
		return fmt.Sprintf("upgrade the driver to one that supports CUDA %s or use %s of the image", need, older)
	}
	supports := fmt.Sprintf("driver %s supports CUDA up to %s", drv, firstNonEmpty(maxCUDA, "an unknown version"))
	fcRule, _ := k.ForwardCompatFor(c.class())
	fcOK := fcRule.ForwardCompat
	classWords := firstNonEmpty(c.class(), "unknown-class")

	// 1. The container runtime's check at start (NVIDIA_REQUIRE_CUDA, or
	// cuda>=CUDA_VERSION for images that set only CUDA_VERSION).
	startedViaBrand := ""
	if !req.RequireDisabled {
		expr := req.RequireExpr
		startNeed, startFrom := "", "NVIDIA_REQUIRE_CUDA"
		if expr != nil {
			startNeed = expr.MinCUDA()
		}
		if expr == nil && req.RequireError == "" && req.Require == "" && req.EnvCUDA != "" {
			e, err := require.Parse("cuda>=" + req.EnvCUDA)
			if err == nil {
				expr = &e
				startNeed, startFrom = req.EnvCUDA, "CUDA_VERSION"
			}
		}
		if req.RequireError != "" {
			r.note("NVIDIA_REQUIRE_CUDA could not be read (" + req.RequireError + "); the container runtime will refuse it too")
		}
		if expr != nil && len(expr.Clauses) > 0 {
			facts := require.Facts{CUDA: maxCUDA, Driver: drv, Arch: c.g.ComputeCapability, Brands: fcRule.Brands}
			ok, idx := expr.Eval(facts)
			if !ok {
				reason := fmt.Sprintf("%s; the image needs %s (%s): the container runtime refuses to start it (\"unsatisfied condition: cuda>=%s\")",
					supports, startNeed, startFrom, startNeed)
				r.fail(reason, upgrade())
				explainBrands(expr, drv, c, fcRule, r)
				return
			}
			if idx >= 0 && len(expr.Clauses[idx].Brands()) > 0 {
				startedViaBrand = expr.Clauses[idx].String()
			}
		}
	}

	// 2. What the CUDA user space needs once started.
	if driverMeets {
		r.note(fmt.Sprintf("driver %s supports CUDA %s; the image needs %s (%s)", drv, firstNonEmpty(maxCUDA, need), need, from))
		return
	}
	hasCompat := req.CompatDriver != "" || req.CompatPackage != ""
	compatWhat := "its CUDA forward-compatibility package"
	if req.CompatDriver != "" {
		compatWhat = "its CUDA forward-compatibility package (compat/libcuda.so." + req.CompatDriver + ")"
	}
	sameFamily := relKnown && rel.MinorCompatDriver != "" && strings.SplitN(drv, ".", 2)[0] != "" &&
		kb.CompareDriver(drv, rel.LowestDriver()) >= 0 && familyOf(k, drv) == familyOf(k, need)
	if startedViaBrand != "" {
		if fcOK {
			msg := fmt.Sprintf("%s; the image needs %s and starts through %s, admitted by NVIDIA_REQUIRE_CUDA clause %q; %s GPUs such as %s may use forward compatibility",
				supports, need, compatWhat, startedViaBrand, classWords, c.name)
			if !hasCompat {
				msg += " (kiln found no compat/libcuda.so in the image: check that the package is installed)"
			}
			r.set(RunsForwardCompat, msg, "to run without the compatibility package: "+upgrade())
			return
		}
		if sameFamily {
			r.note(fmt.Sprintf("%s; the image needs %s and starts through NVIDIA_REQUIRE_CUDA clause %q; it runs under CUDA minor-version compatibility (driver >= %s), where features that need a newer driver are unavailable",
				supports, need, startedViaBrand, rel.LowestDriver()))
			return
		}
		r.fail(fmt.Sprintf("%s; the image needs %s: NVIDIA_REQUIRE_CUDA clause %q lets it start, but CUDA forward compatibility works only on datacenter GPUs and %s is a %s GPU", supports, need, startedViaBrand, c.name, classWords), upgrade())
		return
	}
	if sameFamily {
		r.note(fmt.Sprintf("%s; the image needs %s (%s): it runs under CUDA minor-version compatibility (driver >= %s), where features that need a newer driver are unavailable",
			supports, need, from, rel.LowestDriver()))
		return
	}
	if hasCompat {
		if fcOK {
			r.set(RunsForwardCompat, fmt.Sprintf("%s; the image needs %s (%s) and runs through %s, which %s GPUs such as %s may use",
				supports, need, from, compatWhat, classWords, c.name), "to run without the compatibility package: "+upgrade())
			return
		}
		r.fail(fmt.Sprintf("%s; the image needs %s (%s): it carries %s, but forward compatibility works only on datacenter GPUs and %s is a %s GPU",
			supports, need, from, compatWhat, c.name, classWords), upgrade())
		return
	}
	reason := fmt.Sprintf("%s; the image needs %s (%s)", supports, need, from)
	if fcOK {
		reason += "; this datacenter GPU could run it with the CUDA forward-compatibility package, which the image does not carry"
	}
	r.fail(reason, upgrade())
	return
}

// familyOf is the CUDA major family of a version, or of the newest CUDA a
// driver supports.
func familyOf(k *kb.KB, v string) string {
	if strings.Count(v, ".") >= 2 || len(strings.SplitN(v, ".", 2)[0]) >= 3 {
		v = k.MaxCUDAForDriver(v)
	}
	return strings.SplitN(v, ".", 2)[0]
}

// explainBrands adds, to a start refusal, what the image's brand clauses
// would have allowed.
func explainBrands(expr *require.Expr, drv string, c gpuCtx, rule kb.ForwardCompatRule, r *GPUReport) {
	br := expr.ForwardCompatBranches()
	if len(br) == 0 {
		return
	}
	branch := strings.SplitN(drv, ".", 2)[0]
	var admitting []string
	for brand, branches := range br {
		for _, b := range branches {
			if b == branch {
				admitting = append(admitting, brand)
			}
		}
	}
	sort.Strings(admitting)
	if len(admitting) > 0 {
		r.Reasons = append(r.Reasons, fmt.Sprintf("the image admits driver branch %s through CUDA forward compatibility only for brand %s; forward compatibility works only on datacenter GPUs and %s is a %s GPU",
			branch, strings.Join(admitting, ", "), c.name, firstNonEmpty(c.class(), "unknown-class")))
		return
	}
	if rule.ForwardCompat {
		var list []string
		for _, b := range rule.Brands {
			list = append(list, br[b]...)
		}
		list = uniqSorted(list)
		if len(list) > 0 {
			r.Fix = append(r.Fix, fmt.Sprintf("or move to a driver branch the image's forward-compatibility clauses admit for this GPU (%s)", strings.Join(list, ", ")))
		}
	}
}

func uniqSorted(s []string) []string {
	sort.Slice(s, func(i, j int) bool { return kb.CompareDriver(s[i], s[j]) < 0 })
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// ccNumber turns "8.6" into 86 and "10.0" into 100.
func ccNumber(cc string) int {
	maj, min, ok := strings.Cut(strings.TrimSpace(cc), ".")
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(min)
	if !ok || err1 != nil || err2 != nil || a < 0 || b < 0 || b > 9 {
		return 0
	}
	return a*10 + b
}

// coverage says how code for sass/ptx runs on a GPU of architecture gpu:
// "native" (SASS of the same major, no newer minor), "jit" (PTX of an equal
// or older architecture) or "none".
func coverage(sass, ptx []int, gpu int) string {
	for _, a := range sass {
		if a/10 == gpu/10 && a%10 <= gpu%10 {
			return "native"
		}
	}
	for _, a := range ptx {
		if a <= gpu {
			return "jit"
		}
	}
	return "none"
}

func checkArch(req *Requirements, c gpuCtx, cc, drv string, k *kb.KB, r *GPUReport) {
	gpu := ccNumber(cc)
	need, _ := runtimeNeed(req, k)
	// The toolkit's window: CUDA 13 cannot run on Volta at all.
	if need != "" {
		if ok, known := k.ToolkitTargets(need, cc); known && !ok {
			a, _ := k.CUDAArchInfo(cc)
			if a.LastCUDAMajor > 0 && int(kbMajor(need)) > a.LastCUDAMajor {
				r.fail(fmt.Sprintf("CUDA %d dropped %s (compute capability %s): the image's CUDA %s stack has no code for %s", a.LastCUDAMajor+1, titleCase(a.Architecture), cc, need, c.name),
					fmt.Sprintf("use a CUDA %d.x build of the image for this GPU", a.LastCUDAMajor))
				return
			}
			if !hasNVIDIACode(req) {
				r.set(RunsViaJIT, fmt.Sprintf("CUDA %s cannot compile for compute capability %s (first toolkit: %s): the image runs on %s only if its binaries carry PTX for JIT compilation",
					need, cc, firstNonEmpty(a.FirstCUDA, "unknown"), c.name), fmt.Sprintf("use a build made with CUDA >= %s", firstNonEmpty(a.FirstCUDA, "a newer toolkit")))
			}
		}
	}
	if gpu == 0 {
		return
	}
	if hasNVIDIACode(req) {
		checkBinaries(req, c, cc, drv, k, r)
		return
	}
	// No binaries read: use the framework's published architecture list.
	for _, fw := range req.Frameworks {
		if fw.Name != "torch" || fw.CUDA == "" {
			continue
		}
		b, ok := k.FrameworkBuildFor("pytorch", fw.Version, fw.CUDA, "")
		if !ok || len(b.Archs) == 0 {
			continue
		}
		var sass, ptx []int
		for _, a := range b.Archs {
			sass = append(sass, ccNumber(a))
		}
		if b.PTX != "" {
			ptx = []int{ccNumber(b.PTX)}
		}
		list := strings.Join(b.Archs, ", ")
		if b.PTX != "" {
			list += " and PTX " + b.PTX
		}
		switch coverage(sass, ptx, gpu) {
		case "none":
			r.fail(fmt.Sprintf("torch %s is built for compute capabilities %s (%s): none runs on %s (%s)", fw.Version, list, b.Source, c.name, cc),
				"use a PyTorch build whose architecture list includes "+cc)
		case "jit":
			r.set(RunsViaJIT, fmt.Sprintf("torch %s is built for %s: it runs on %s (%s) only through JIT compilation of PTX, with a start-up delay", fw.Version, list, c.name, cc),
				"use a PyTorch build whose architecture list includes "+cc)
		}
	}
}

// describeBinary names a binary and what it holds: "torch 2.1.0+cu118
// (lib/libtorch_cuda.so) has sm_80 sm_86 and PTX compute_86 (PTX ISA 7.8)".
func describeBinary(req *Requirements, b Binary) string {
	who := b.Path
	for _, fw := range req.Frameworks {
		dir := strings.TrimSuffix(fw.Path, "/version.py")
		if strings.HasSuffix(fw.Path, "/version.py") && strings.HasPrefix(b.Path, dir+"/") {
			who = fmt.Sprintf("%s %s (%s)", fw.Name, fw.Version, b.Path)
		}
	}
	has := "no SASS"
	if len(b.SASS) > 0 {
		has = strings.Join(b.SASS, " ")
	}
	ptx := "no PTX"
	if len(b.PTX) > 0 {
		var ps []string
		for _, p := range b.PTX {
			s := p.Target
			if p.ISA != "" {
				s += " (PTX ISA " + p.ISA + ")"
			}
			ps = append(ps, s)
		}
		ptx = "PTX " + strings.Join(ps, " ")
	}
	return fmt.Sprintf("%s has %s and %s", who, has, ptx)
}

func more(paths []string) string {
	if len(paths) <= 1 {
		return ""
	}
	return fmt.Sprintf(" (and %d more binaries like it)", len(paths)-1)
}

func kbMajor(v string) uint64 {
	n, _ := strconv.ParseUint(strings.SplitN(strings.TrimSpace(v), ".", 2)[0], 10, 64)
	return n
}

func titleCase(s string) string {
	if s == "" {
		return "this architecture"
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// builtWith is the newest toolkit the image's binaries were built with, as
// their PTX ISA versions tell it, and which binary says so.
func builtWith(req *Requirements, k *kb.KB) (string, string) {
	best, from := "", ""
	for _, b := range req.Binaries {
		for _, p := range b.PTX {
			row, ok := k.PTXISA(p.ISA)
			if !ok || row.CUDA == "" {
				continue
			}
			if best == "" || kb.CompareDriver(row.CUDA, best) > 0 {
				best, from = majorMinor(row.CUDA), fmt.Sprintf("%s, built by CUDA %s (its PTX is ISA %s)", b.Path, row.CUDA, p.ISA)
			}
		}
	}
	return best, from
}

// resolve completes what reading the image could not know without the
// knowledge base: the toolkit of each PTX ISA version, and whether the
// binaries contradict the CUDA the image declares. It is idempotent.
func (r *Requirements) resolve(k *kb.KB) {
	if r == nil || r.resolved {
		return
	}
	r.resolved = true
	for i := range r.Binaries {
		for j, p := range r.Binaries[i].PTX {
			if row, ok := k.PTXISA(p.ISA); ok {
				r.Binaries[i].PTX[j].CUDA = row.CUDA
			}
		}
	}
	if c, from := builtWith(r, k); c != "" && (r.CUDA == "" || kb.CompareDriver(c, r.CUDA) > 0) {
		if r.CUDA != "" {
			r.Conflicts = append(r.Conflicts, fmt.Sprintf("the image declares CUDA %s (%s) but %s: kiln goes by the binaries", r.CUDA, r.CUDAFrom, from))
		}
		r.CUDA, r.CUDAFrom = c, from
	}
}
