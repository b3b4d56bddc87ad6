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
	"sort"
	"strings"

	"kiln.dev/kiln/compat/fatbin"
	"kiln.dev/kiln/compat/image"
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

	// ROCm is the ROCm version the image is built for, ROCmFrom where it was read.
	ROCm     string `json:"rocm,omitempty"`
	ROCmFrom string `json:"rocm_from,omitempty"`

	Libraries  []Library   `json:"libraries,omitempty"`
	Frameworks []Framework `json:"frameworks,omitempty"`
	// Binaries are the files with CUDA GPU code, with what each holds.
	Binaries []Binary `json:"binaries,omitempty"`
	// SASS and PTX are the union over Binaries ("sm_80", "compute_86").
	SASS []string `json:"sass,omitempty"`
	PTX  []string `json:"ptx,omitempty"`
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

// Binary is one file with CUDA fat binaries.
type Binary struct {
	Path string   `json:"path"`
	SASS []string `json:"sass,omitempty"`
	PTX  []string `json:"ptx,omitempty"`
	code *fatbin.Result
}

// GPUCode is what a binary holds, as architecture numbers (80 = sm_80).
func (b Binary) GPUCode() *fatbin.Result { return b.code }

// HasCUDA reports whether the image carries a CUDA stack.
func (r *Requirements) HasCUDA() bool {
	if r.CUDA != "" || len(r.Binaries) > 0 {
		return true
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
	if r.CUDA == "" {
		if v := majorMinor(env["CUDA_VERSION"]); v != "" {
			r.CUDA, r.CUDAFrom = v, "CUDA_VERSION"
		}
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

	// Files.
	var code fatbin.Result
	libVersion := map[string]string{}
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
			if r.ROCm == "" || r.ROCmFrom != "" && !strings.HasPrefix(r.ROCmFrom, "/") {
				r.ROCm, r.ROCmFrom = strings.SplitN(f.Version, "-", 2)[0], "/"+f.Path
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
		case image.KindGPUCode:
			if f.Code == nil {
				continue
			}
			b := Binary{Path: f.Path, code: f.Code}
			for _, a := range f.Code.SASS {
				b.SASS = append(b.SASS, fatbin.ArchName(a, false))
			}
			for _, a := range f.Code.PTX {
				b.PTX = append(b.PTX, fatbin.ArchName(a, true))
			}
			r.Binaries = append(r.Binaries, b)
			code.Merge(f.Code)
		}
	}
	mergeFrameworks(r)
	for _, a := range code.SASS {
		r.SASS = append(r.SASS, fatbin.ArchName(a, false))
	}
	for _, a := range code.PTX {
		r.PTX = append(r.PTX, fatbin.ArchName(a, true))
	}
	if r.CUDA == "" && libVersion["cudart"] != "" {
		r.CUDA, r.CUDAFrom = majorMinor(libVersion["cudart"]), "libcudart.so."+libVersion["cudart"]
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
	if r.ROCm == "" && libVersion["amdhip64"] != "" {
		r.ROCm, r.ROCmFrom = libVersion["amdhip64"], "libamdhip64.so."+libVersion["amdhip64"]
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
