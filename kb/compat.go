package kb

import (
	"errors"
	"fmt"
	"strings"

	"kiln.dev/kiln/version"
)

// CUDAArch is one NVIDIA compute capability and the CUDA toolkits that can
// compile for it.
type CUDAArch struct {
	CC           string `json:"cc"`
	Architecture string `json:"architecture"`
	// FirstCUDA is the first toolkit release that can target it; empty when
	// no source gives it.
	FirstCUDA string `json:"first_cuda,omitempty"`
	// LastCUDAMajor is the last toolkit major that can target it; 0 while
	// current toolkits still do.
	LastCUDAMajor int    `json:"last_cuda_major,omitempty"`
	Source        string `json:"source"`
}

// ForwardCompatRule says whether GPUs of a class may use CUDA forward
// compatibility (the cuda-compat package) and which NVML product brands the
// class reports.
type ForwardCompatRule struct {
	Class         string   `json:"class"`
	ForwardCompat bool     `json:"forward_compat"`
	Brands        []string `json:"brands"`
	Note          string   `json:"note,omitempty"`
	Source        string   `json:"source"`
}

// FrameworkBuild is one build of a framework release: the toolkit it uses
// and, where a source lists them, the GPU architectures compiled in.
type FrameworkBuild struct {
	Framework string   `json:"framework"` // pytorch, tensorflow, jax
	Version   string   `json:"version"`   // "2.8" matches 2.8.x
	CUDA      string   `json:"cuda,omitempty"`
	CuDNN     string   `json:"cudnn,omitempty"`
	ROCm      string   `json:"rocm,omitempty"`
	Status    string   `json:"status,omitempty"` // stable, experimental
	Archs     []string `json:"archs,omitempty"`  // compute capabilities with SASS
	PTX       string   `json:"ptx,omitempty"`    // the architecture whose PTX ships
	MinCC     string   `json:"min_cc,omitempty"`
	Source    string   `json:"source"`
}

// ROCmRelease is one ROCm release line and the gfx targets it supports.
type ROCmRelease struct {
	Version string   `json:"version"`
	GFX     []string `json:"gfx"`
	Source  string   `json:"source"`
}

// ROCmKMD is either a kernel driver release line with the user-space
// releases AMD supports on it (KMD + Userspace), or an amdgpu module version
// with the release line it belongs to (Module + KMD).
type ROCmKMD struct {
	KMD       string   `json:"kmd"`
	Userspace []string `json:"userspace,omitempty"`
	Module    string   `json:"module,omitempty"`
	Source    string   `json:"source"`
}

func (k *KB) validateCompat() error {
	var errs []error
	for i, a := range k.CUDAArchs {
		if a.CC == "" || a.Source == "" {
			errs = append(errs, fmt.Errorf("kb: cuda-arch row %d: cc and source are required", i))
		}
	}
	for i, r := range k.ForwardCompat {
		if r.Class == "" || len(r.Brands) == 0 || r.Source == "" {
			errs = append(errs, fmt.Errorf("kb: cuda-forward-compat row %d: class, brands and source are required", i))
		}
	}
	for i, f := range k.Frameworks {
		if f.Framework == "" || f.Version == "" || f.Source == "" {
			errs = append(errs, fmt.Errorf("kb: frameworks row %d: framework, version and source are required", i))
		}
	}
	for i, r := range k.ROCm {
		if r.Version == "" || len(r.GFX) == 0 || r.Source == "" {
			errs = append(errs, fmt.Errorf("kb: rocm row %d: version, gfx and source are required", i))
		}
	}
	for i, r := range k.ROCmKMD {
		if r.KMD == "" || r.Source == "" || (r.Module == "") == (len(r.Userspace) == 0) {
			errs = append(errs, fmt.Errorf("kb: rocm-kmd row %d: kmd, source and exactly one of module or userspace are required", i))
		}
	}
	return errors.Join(errs...)
}

// CUDAArchInfo returns the row of a compute capability ("9.0").
func (k *KB) CUDAArchInfo(cc string) (CUDAArch, bool) {
	k.compat()
	for _, a := range k.CUDAArchs {
		if CompareDriver(a.CC, cc) == 0 {
			return a, true
		}
	}
	return CUDAArch{}, false
}

// ToolkitTargets says whether a CUDA toolkit ("13.0", "12.4.1") can compile
// code for a compute capability. known is false when the table has no row
// for the capability or the row does not say.
func (k *KB) ToolkitTargets(cuda, cc string) (ok, known bool) {
	a, found := k.CUDAArchInfo(cc)
	if !found {
		return false, false
	}
	major := int(firstField(cuda))
	if a.LastCUDAMajor > 0 && major > a.LastCUDAMajor {
		return false, true
	}
	if a.FirstCUDA != "" {
		return CompareDriver(majorMinor(cuda), a.FirstCUDA) >= 0, true
	}
	if a.LastCUDAMajor > 0 {
		return true, true
	}
	return false, false
}

// ForwardCompatFor returns the forward-compatibility rule of a GPU class
// (GPUModel.Class).
func (k *KB) ForwardCompatFor(class string) (ForwardCompatRule, bool) {
	k.compat()
	for _, r := range k.ForwardCompat {
		if r.Class == class {
			return r, true
		}
	}
	return ForwardCompatRule{}, false
}

// FrameworkBuildFor finds the build of a framework release: version "2.8.1"
// matches the "2.8" rows; cuda ("12.8") or rocm ("6.4") picks the build.
// Give neither to get the release's first row.
func (k *KB) FrameworkBuildFor(framework, version, cuda, rocm string) (FrameworkBuild, bool) {
	k.compat()
	for _, f := range k.Frameworks {
		if f.Framework != framework || !versionHasPrefix(version, f.Version) {
			continue
		}
		if cuda != "" && (f.CUDA == "" || CompareDriver(majorMinor(f.CUDA), majorMinor(cuda)) != 0) {
			continue
		}
		if rocm != "" && (f.ROCm == "" || !versionHasPrefix(rocm, f.ROCm) && !versionHasPrefix(f.ROCm, majorMinor(rocm))) {
			continue
		}
		return f, true
	}
	return FrameworkBuild{}, false
}

// ROCmFor returns the release line of a ROCm version ("6.2.4" -> the "6.2" row).
func (k *KB) ROCmFor(version string) (ROCmRelease, bool) {
	k.compat()
	for _, r := range k.ROCm {
		if versionHasPrefix(version, r.Version) {
			return r, true
		}
	}
	return ROCmRelease{}, false
}

// KMDRelease maps an amdgpu module version (rocm-smi's driver version,
// "6.3.6") to the ROCm release line of the kernel driver ("6.0"). A version
// written in the driver's own numbering from 30.10 on ("30.10.1") is its
// own line. It returns "" when no source pairs them.
func (k *KB) KMDRelease(module string) string {
	k.compat()
	module = strings.TrimSpace(module)
	if module == "" {
		return ""
	}
	for _, r := range k.ROCmKMD {
		if r.Module != "" && versionHasPrefix(module, r.Module) {
			return r.KMD
		}
	}
	for _, r := range k.ROCmKMD {
		if r.Module == "" && firstField(r.KMD) >= 30 && versionHasPrefix(module, r.KMD) {
			return r.KMD
		}
	}
	return ""
}

// KMDUserspace returns the ROCm user-space release lines AMD supports on a
// kernel driver release line, and whether the table has that line.
func (k *KB) KMDUserspace(kmd string) ([]string, bool) {
	k.compat()
	for _, r := range k.ROCmKMD {
		if r.Module == "" && r.KMD == kmd {
			return r.Userspace, true
		}
	}
	return nil, false
}

// versionHasPrefix reports whether v equals prefix or continues it with a
// dot ("2.8.1" has prefix "2.8", "2.80" does not); extra text after the
// numbers ("2.1.0+cu118") is ignored.
func versionHasPrefix(v, prefix string) bool {
	v, prefix = strings.TrimSpace(v), strings.TrimSpace(prefix)
	if prefix == "" {
		return false
	}
	if i := strings.IndexAny(v, "+-~ "); i >= 0 {
		v = v[:i]
	}
	return v == prefix || strings.HasPrefix(v, prefix+".")
}

// firstField is the first numeric field of a version ("12.4" -> 12), 0
// when it does not parse.
func firstField(v string) uint64 {
	p, err := version.Parse(v)
	if err != nil {
		return 0
	}
	return p.Field(0)
}
