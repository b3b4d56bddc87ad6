// Package compat decides, before anything starts, whether a container image
// will run on a node's GPUs: it reads what the image needs (CUDA or ROCm
// version, libraries, framework builds, the GPU architectures compiled into
// its binaries) and compares it with the node's driver and GPUs, using the
// knowledge base's CUDA, forward-compatibility, architecture and ROCm tables.
//
// Reading the image is package compat/image's job; this package is a pure
// function of what was read, the node's Snapshot and the knowledge base.
package compat

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/compat/fatbin"
	"kiln.dev/kiln/compat/image"
	"kiln.dev/kiln/compat/offload"
	"kiln.dev/kiln/compat/pkgdb"
	"kiln.dev/kiln/compat/require"
)

// Requirements are what an image needs, as kiln read it.
type Requirements struct {
	Image    string `json:"image"`
	Digest   string `json:"digest,omitempty"`
	Platform string `json:"platform,omitempty"`

	// CUDA is the CUDA version the image needs of the driver ("12.4"),
	// and CUDAFrom where kiln read it.
	CUDA     string `json:"cuda,omitempty"`
	CUDAFrom string `json:"cuda_from,omitempty"`
	// EnvCUDA is CUDA_VERSION's major.minor: without NVIDIA_REQUIRE_CUDA
	// the container runtime checks cuda>=EnvCUDA at start.
	EnvCUDA string `json:"cuda_version_env,omitempty"`
	// Require is NVIDIA_REQUIRE_CUDA as set in the image (what the
	// container runtime checks at start); RequireExpr is its parsed form.
	Require      string        `json:"nvidia_require_cuda,omitempty"`
	RequireExpr  *require.Expr `json:"-"`
	RequireError string        `json:"nvidia_require_cuda_error,omitempty"`
	// RequireDisabled is true when NVIDIA_DISABLE_REQUIRE is set.
	RequireDisabled bool `json:"nvidia_disable_require,omitempty"`
	// CompatDriver is the driver version of the CUDA forward-compatibility
	// package in the image (compat/libcuda.so.VERSION), or the package
	// named by NV_CUDA_COMPAT_PACKAGE.
	CompatDriver  string `json:"cuda_compat_driver,omitempty"`
	CompatPackage string `json:"cuda_compat_package,omitempty"`
	CuDNN         string `json:"cudnn,omitempty"`
	NCCL          string `json:"nccl,omitempty"`

	// HSAXNACK is HSA_XNACK as the image sets it: "1" turns XNACK on for
	// its processes where the kernel allows.
	HSAXNACK string `json:"hsa_xnack,omitempty"`
	// ROCm is the ROCm version the image is built for, ROCmFrom where it was read.
	ROCm     string `json:"rocm,omitempty"`
	ROCmFrom string `json:"rocm_from,omitempty"`

	Libraries  []Library   `json:"libraries,omitempty"`
	Frameworks []Framework `json:"frameworks,omitempty"`
	// Binaries are the files with CUDA GPU code, with what each holds.
	Binaries []Binary `json:"binaries,omitempty"`
	// SASS, PTX and GFX are the union over Binaries ("sm_80",
	// "compute_86 (PTX ISA 7.8)", "gfx90a:xnack-").
	SASS []string `json:"sass,omitempty"`
	PTX  []string `json:"ptx,omitempty"`
	GFX  []string `json:"gfx,omitempty"`
	// Packages are the GPU-stack packages of the image's package databases.
	Packages []pkgdb.Package `json:"packages,omitempty"`
	// Conflicts are disagreements between what the image declares (labels,
	// environment) and what its files hold; the files decide.
	Conflicts []string `json:"conflicts,omitempty"`

	resolved bool
}

// Library is a versioned GPU-stack library found in the image.
type Library struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Path    string `json:"path"`
}

// Framework is a machine-learning framework found in the image.
type Framework struct {
	Name    string `json:"name"` // torch, tensorflow, jax, jaxlib, jax_cuda12_plugin
	Version string `json:"version,omitempty"`
	// CUDA and HIP are the toolkit versions the build says it uses.
	CUDA  string `json:"cuda,omitempty"`
	HIP   string `json:"hip,omitempty"`
	CuDNN string `json:"cudnn,omitempty"`
	Path  string `json:"path"`
}

// Binary is one file with GPU code: CUDA fat binaries, AMD code objects,
// or both.
type Binary struct {
	Path string `json:"path"`
	// SASS are the CUDA machine-code targets ("sm_80", "sm_90a").
	SASS []string `json:"sass,omitempty"`
	// PTX are the PTX targets with the PTX ISA version of each.
	PTX []PTXCode `json:"ptx,omitempty"`
	// GFX are the AMD targets ("gfx90a:xnack-", "gfx11-generic").
	GFX []string `json:"gfx,omitempty"`
	// Runtime is true for kernel files a ROCm library loads at run time,
	// known by their names (Tensile, MIOpen), not read as code objects.
	Runtime bool `json:"runtime,omitempty"`
	code    *fatbin.Result
	amd     *offload.Result
}

// PTXCode is one PTX target of a binary.
type PTXCode struct {
	Target string `json:"target"`
	ISA    string `json:"isa,omitempty"`
	// CUDA is the toolkit that introduced the ISA (the least that emits it).
	CUDA string `json:"cuda,omitempty"`
}

// GPUCode is what a binary holds for NVIDIA GPUs.
func (b Binary) GPUCode() *fatbin.Result { return b.code }

// AMDCode is what a binary holds for AMD GPUs.
func (b Binary) AMDCode() *offload.Result { return b.amd }

// HasCUDA reports whether the image carries a CUDA stack.
func (r *Requirements) HasCUDA() bool {
	if r.CUDA != "" {
		return true
	}
	for _, b := range r.Binaries {
		if !b.code.Empty() {
			return true
		}
	}
	for _, f := range r.Frameworks {
		if f.CUDA != "" {
			return true
		}
	}
	return false
}

// HasROCm reports whether the image carries a ROCm stack.
func (r *Requirements) HasROCm() bool {
	if r.ROCm != "" {
		return true
	}
	for _, b := range r.Binaries {
		if !b.amd.Empty() {
			return true
		}
	}
	for _, f := range r.Frameworks {
		if f.HIP != "" {
			return true
		}
	}
	return false
}

// FromScan reads the requirements out of what compat/image found: the
// config's environment and labels first (what the image's author
// declared), then the files.
func FromScan(s *image.Result) *Requirements {
	r := &Requirements{Image: s.Ref, Digest: s.Digest, Platform: s.Platform}
	env := s.Env

	// Declared CUDA requirement.
	if v := strings.TrimSpace(env["NVIDIA_REQUIRE_CUDA"]); v != "" {
		r.Require = v
		e, err := require.Parse(v)
		if err != nil {
			r.RequireError = err.Error()
		} else {
			r.RequireExpr = &e
			if c := e.MinCUDA(); c != "" {
				r.CUDA, r.CUDAFrom = c, "NVIDIA_REQUIRE_CUDA"
			}
		}
	}
	if v := strings.ToLower(strings.TrimSpace(env["NVIDIA_DISABLE_REQUIRE"])); v == "1" || v == "true" || v == "yes" {
		r.RequireDisabled = true
	}
	r.EnvCUDA = majorMinor(env["CUDA_VERSION"])
	r.HSAXNACK = strings.TrimSpace(env["HSA_XNACK"])
	if r.CUDA == "" && r.EnvCUDA != "" {
		r.CUDA, r.CUDAFrom = r.EnvCUDA, "CUDA_VERSION"
	}
	r.CompatPackage = env["NV_CUDA_COMPAT_PACKAGE"]
	r.CuDNN = firstNonEmpty(env["CUDNN_VERSION"], env["NV_CUDNN_VERSION"])
	r.NCCL = firstNonEmpty(env["NCCL_VERSION"], env["NV_LIBNCCL_PACKAGE_VERSION"])
	for _, kv := range []map[string]string{env, s.Labels} {
		keys := make([]string, 0, len(kv))
		for k := range kv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			lk := strings.ToLower(k)
			if r.ROCm == "" && strings.Contains(lk, "rocm") && strings.Contains(lk, "version") && looksLikeVersion(kv[k]) {
				r.ROCm, r.ROCmFrom = kv[k], k
			}
		}
	}

	// What the labels declare is set aside: the files decide.
	declared, declaredFrom := r.ROCm, r.ROCmFrom
	r.ROCm, r.ROCmFrom = "", ""

	// Files.
	var code fatbin.Result
	gfx := map[string]bool{}
	libVersion := map[string]string{}
	var pkgs []pkgdb.Package
	var fileCUDA, fileROCm []pkgdb.Version
	for _, f := range s.Facts {
		switch f.Kind {
		case image.KindLibrary:
			r.Libraries = append(r.Libraries, Library{Name: f.Name, Version: f.Version, Path: f.Path})
			if longerVersion(f.Version, libVersion[f.Name]) {
				libVersion[f.Name] = f.Version
			}
		case image.KindCUDACompat:
			if longerVersion(f.Version, r.CompatDriver) {
				r.CompatDriver = f.Version
			}
		case image.KindROCm:
			if r.ROCm == "" {
				r.ROCm, r.ROCmFrom = f.Version, "/"+f.Path
			}
		case image.KindPackages:
			if f.Packages != nil {
				pkgs = append(pkgs, f.Packages.Packages...)
				fileCUDA = append(fileCUDA, f.Packages.CUDA...)
				fileROCm = append(fileROCm, f.Packages.ROCm...)
			}
		case image.KindPython:
			fw := Framework{Name: f.Name, Version: f.Version, Path: f.Path}
			switch f.Name {
			case "torch":
				fw.CUDA, fw.HIP = f.Fields["cuda"], f.Fields["hip"]
			case "tensorflow":
				fw.Version = ""
				if f.Fields["is_cuda_build"] == "true" || f.Fields["cuda_version"] != "" {
					fw.CUDA = f.Fields["cuda_version"]
				}
				if f.Fields["is_rocm_build"] == "true" {
					fw.HIP = firstNonEmpty(f.Fields["rocm_version"], "unknown")
				}
				fw.CuDNN = f.Fields["cudnn_version"]
			}
			r.Frameworks = append(r.Frameworks, fw)
		case image.KindDist:
			if isFrameworkDist(f.Name) {
				r.Frameworks = append(r.Frameworks, Framework{Name: f.Name, Version: f.Version, Path: f.Path})
			}
		case image.KindGPUCode, image.KindAMDKernels:
			if f.Code.Empty() && f.AMD.Empty() {
				continue
			}
			b := Binary{Path: f.Path, code: f.Code, amd: f.AMD, Runtime: f.Kind == image.KindAMDKernels}
			if f.Code != nil {
				for _, c := range f.Code.SASS() {
					b.SASS = append(b.SASS, c.String())
				}
				for _, c := range f.Code.PTX() {
					b.PTX = append(b.PTX, PTXCode{Target: c.Name(), ISA: c.ISA})
				}
				code.Merge(f.Code)
			}
			if f.AMD != nil {
				for _, t := range f.AMD.Targets {
					b.GFX = append(b.GFX, t.Name())
					gfx[t.Name()] = true
				}
			}
			r.Binaries = append(r.Binaries, b)
		}
	}
	mergeFrameworks(r)
	for _, c := range code.SASS() {
		r.SASS = append(r.SASS, c.String())
	}
	for _, c := range code.PTX() {
		r.PTX = append(r.PTX, c.String())
	}
	for t := range gfx {
		r.GFX = append(r.GFX, t)
	}
	sort.Strings(r.GFX)
	r.Packages = pkgs
	pkCUDA, pkROCm := pkgdb.FromPackages(pkgs)
	fileCUDA = append(fileCUDA, pkCUDA...)
	fileROCm = append(fileROCm, pkROCm...)

	// CUDA: the runtime the image's files hold decides over what the
	// image declares; a disagreement is reported.
	fileVer, fileFrom := "", ""
	if v := libVersion["cudart"]; v != "" {
		fileVer, fileFrom = majorMinor(v), "libcudart.so."+v
		if !strings.Contains(v, ".") {
			// libcudart.so.12 says the major only; a package or
			// version.json says more.
			fileVer = ""
			for _, fv := range fileCUDA {
				if strings.SplitN(fv.Version, ".", 2)[0] == v {
					fileVer, fileFrom = majorMinor(fv.Version), fv.From
					break
				}
			}
			if fileVer == "" {
				fileVer, fileFrom = v, "libcudart.so."+v
			}
		}
	} else if len(fileCUDA) > 0 {
		fileVer, fileFrom = majorMinor(fileCUDA[0].Version), fileCUDA[0].From
	}
	switch {
	case fileVer == "":
	case r.CUDA == "":
		r.CUDA, r.CUDAFrom = fileVer, fileFrom
	case !sameRelease(r.CUDA, fileVer):
		r.Conflicts = append(r.Conflicts, fmt.Sprintf("the image declares CUDA %s (%s) but holds the CUDA %s runtime (%s): kiln goes by the runtime", r.CUDA, r.CUDAFrom, fileVer, fileFrom))
		r.CUDA, r.CUDAFrom = fileVer, fileFrom
	}
	if r.CUDA == "" {
		for _, fw := range r.Frameworks {
			if fw.CUDA != "" {
				r.CUDA, r.CUDAFrom = majorMinor(fw.CUDA), fw.Name+" "+fw.Version+" (built with CUDA "+fw.CUDA+")"
				break
			}
		}
	}
	if r.CuDNN == "" {
		r.CuDNN = libVersion["cudnn"]
	}
	if r.NCCL == "" {
		r.NCCL = libVersion["nccl"]
	}

	// ROCm: the release, never a build id. libamdhip64.so.5.2.21153 is HIP
	// 5.2 (build 21153), part of ROCm 5.2.
	if r.ROCm == "" && len(fileROCm) > 0 {
		r.ROCm, r.ROCmFrom = fileROCm[0].Version, fileROCm[0].From
	}
	if r.ROCm == "" && libVersion["amdhip64"] != "" {
		if v, ok := pkgdb.HIPSoname(libVersion["amdhip64"]); ok {
			r.ROCm, r.ROCmFrom = v, "libamdhip64.so."+libVersion["amdhip64"]+" (HIP "+v+")"
		}
	}
	switch {
	case declared == "":
	case r.ROCm == "":
		r.ROCm, r.ROCmFrom = declared, declaredFrom
	case !sameRelease(declared, r.ROCm):
		r.Conflicts = append(r.Conflicts, fmt.Sprintf("the image declares ROCm %s (%s) but holds ROCm %s (%s): kiln goes by the files", declared, declaredFrom, r.ROCm, r.ROCmFrom))
	}
	if r.ROCm == "" {
		for _, fw := range r.Frameworks {
			if fw.HIP != "" && fw.HIP != "unknown" {
				r.ROCm, r.ROCmFrom = majorMinor(fw.HIP), fw.Name+" "+fw.Version+" (built with HIP "+fw.HIP+")"
				break
			}
		}
	}
	return r
}

// sameRelease reports whether two versions name the same major.minor
// release ("12.4" and "12.4.1"; "6.2" and "6.2.0").
func sameRelease(a, b string) bool { return majorMinor(a) == majorMinor(b) }

// isFrameworkDist picks the Python distributions that matter for GPUs.
func isFrameworkDist(n string) bool {
	for _, p := range []string{"torch", "tensorflow", "tf_nightly", "jax", "jaxlib", "triton", "pytorch_triton", "cupy", "vllm", "onnxruntime_gpu"} {
		if n == p || strings.HasPrefix(n, p+"_") {
			return true
		}
	}
	return false
}

// mergeFrameworks joins a version module with its dist-info (torch's
// version.py and torch-2.1.0.dist-info are one framework) and drops the
// dist-info rows that a module already describes.
func mergeFrameworks(r *Requirements) {
	byName := map[string]int{}
	var out []Framework
	for _, fw := range r.Frameworks {
		if i, ok := byName[fw.Name]; ok {
			o := &out[i]
			if o.Version == "" || strings.HasSuffix(fw.Path, ".py") && fw.Version != "" {
				o.Version = fw.Version
			}
			o.CUDA = firstNonEmpty(o.CUDA, fw.CUDA)
			o.HIP = firstNonEmpty(o.HIP, fw.HIP)
			o.CuDNN = firstNonEmpty(o.CuDNN, fw.CuDNN)
			if strings.HasSuffix(fw.Path, ".py") {
				o.Path = fw.Path
			}
			continue
		}
		byName[fw.Name] = len(out)
		out = append(out, fw)
	}
	r.Frameworks = out
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// majorMinor cuts "12.4.1" to "12.4"; a bare major stays as it is.
func majorMinor(v string) string {
	v = strings.TrimSpace(v)
	if i := strings.IndexAny(v, "+- "); i >= 0 {
		v = v[:i]
	}
	parts := strings.SplitN(v, ".", 3)
	if len(parts) >= 2 {
		return parts[0] + "." + parts[1]
	}
	return v
}

func looksLikeVersion(v string) bool {
	v = strings.TrimSpace(v)
	return v != "" && v[0] >= '0' && v[0] <= '9' && strings.Contains(v, ".")
}

// longerVersion reports whether a has more dotted fields than b (a
// libcudart.so.12.4.127 says more than libcudart.so.12).
func longerVersion(a, b string) bool {
	return strings.Count(a, ".") > strings.Count(b, ".") || b == ""
}
