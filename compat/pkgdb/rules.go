package pkgdb

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// A candidate version from one package; lower rank is more authoritative.
type cand struct {
	rank int
	v    Version
}

// Ranks, best first.
const (
	rankRelease   = iota // rocm-core; cuda-toolkit-X-Y, cuda-X-Y, nvidia-cuda-toolkit
	rankRuntime          // HIP runtime; CUDA meta-packages (cuda-libraries-X-Y, ...)
	rankCore             // ROCr / rocm-* meta-packages; cuda-cudart-X-Y
	rankComponent        // libraries and tools of the stack
)

// FromPackages derives CUDA and ROCm versions from a package list. Each
// list is ordered best source first and holds each release once: a
// less precise version that a listed one extends ("12.4" beside
// "12.4.1") is dropped. More than one entry means the image holds more
// than one release (Debian 12's HIP 5.2 with its rocSPARSE 5.3).
//
// The rules, with where the package names and version strings come from,
// are at cudaFromPackage and rocmFromPackage.
func FromPackages(pk []Package) (cuda, rocm []Version) {
	var cc, rc []cand
	for _, p := range pk {
		if c, ok := cudaFromPackage(p); ok {
			cc = append(cc, c)
		}
		if c, ok := rocmFromPackage(p); ok {
			rc = append(rc, c)
		}
	}
	return collapse(cc), collapse(rc)
}

func collapse(cs []cand) []Version {
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].rank < cs[j].rank })
	var out []Version
next:
	for _, c := range cs {
		for i, o := range out {
			if o.Version == c.v.Version || strings.HasPrefix(o.Version, c.v.Version+".") {
				continue next
			}
			if strings.HasPrefix(c.v.Version, o.Version+".") {
				out[i] = c.v // a later source says the same release more precisely
				continue next
			}
		}
		out = append(out, c.v)
	}
	return out
}

// from names a package the way Version.From does: "dpkg: NAME VERSION",
// with a note in parentheses.
func from(p Package, note string) string {
	src := p.Source
	if src == "" {
		src = "package"
	}
	s := src + ": " + p.Name + " " + p.Version
	if note != "" {
		s += " (" + note + ")"
	}
	return s
}

func isDistro(p Package, want string) bool { return p.Source == want || p.Source == "" }

// --- CUDA ---

var (
	// NVIDIA's CUDA repositories (developer.download.nvidia.com/compute/
	// cuda/repos/{ubuntu2204,rhel9,...}) name every package of toolkit
	// X.Y with an "-X-Y" suffix, the same on deb and rpm: cuda-cudart-12-4,
	// cuda-nvrtc-11-8, cuda-libraries-12-4, cuda-toolkit-12-4, cuda-12-4,
	// cuda-compat-12-4, libcublas-12-4. The nvidia/cuda Dockerfiles
	// (gitlab.com/nvidia/container-images/cuda, dist/12.4.1/ubuntu2204/
	// {base,runtime}) install "cuda-cudart-12-4=${NV_CUDA_CUDART_VERSION}"
	// with NV_CUDA_CUDART_VERSION 12.4.127-1, ${NV_CUDA_COMPAT_PACKAGE}
	// cuda-compat-12-4, and "cuda-libraries-12-4=${NV_CUDA_LIB_VERSION}"
	// with 12.4.1-1; the ubi/rockylinux ones the same names as
	// "cuda-cudart-12-4-${NV_CUDA_CUDART_VERSION}".
	nvCUDARe = regexp.MustCompile(`^cuda-(?:([a-z][a-z0-9-]*?)-)?(\d+)-(\d+)$`)
	nvLibRe  = regexp.MustCompile(`^lib(cublas|cufft|curand|cusolver|cusparse|npp|nvjpeg|nvjitlink|cufile|nvfatbin)-(\d+)-(\d+)$`)

	// Debian and Ubuntu package the toolkit themselves (source
	// nvidia-cuda-toolkit, contrib/non-free): binary names carry the
	// library soname, not the toolkit (bookworm's libcudart11.0 is CUDA
	// 11.8), and versions are "COMPONENT~TOOLKIT-REVISION": libcudart11.0
	// 11.8.89~11.8.0-5~deb12u1, nvidia-cuda-toolkit 11.8.89~11.8.0-5~deb12u1,
	// libcublas11 11.11.3.6~11.8.0-5~deb12u1 (Debian 12 archive). The part
	// after "~" is the toolkit release.
	debCUDARe    = regexp.MustCompile(`^(nvidia-cuda-toolkit|nvidia-cuda-dev|libcudart\d+(?:\.\d+)*|libnvrtc\d+(?:\.\d+)*|libcublas\d+|libcublaslt\d+|libcufft\d+|libcurand\d+|libcusolver\d+|libcusparse\d+)$`)
	debCUDAVerRe = regexp.MustCompile(`^\d+(?:\.\d+)*~(\d+\.\d+\.\d+)-`)

	// NVIDIA's meta-packages, whose version is the toolkit release
	// (cuda-toolkit-11-6 11.6.1-1, cuda-libraries-11-6 11.6.1-1,
	// cuda-runtime-11-6 11.6.1-1, cuda-tools-11-6 11.6.1-1, while
	// cuda-nvcc-11-6 is 11.6.112-1: "apt list" of an 11.6.1 install).
	nvMeta = map[string]int{
		"": rankRelease, "toolkit": rankRelease,
		"runtime": rankRuntime, "libraries": rankRuntime, "libraries-dev": rankRuntime,
		"tools": rankRuntime, "command-line-tools": rankRuntime, "visual-tools": rankRuntime,
		"compiler": rankRuntime, "minimal-build": rankRuntime,
	}
)

// cudaFromPackage applies the CUDA rules to one package:
//
//   - NVIDIA repository packages NAME-X-Y (nvCUDARe): CUDA X.Y from the
//     name. A meta-package's version is the toolkit release
//     (cuda-toolkit-12-4 12.4.1-1 -> 12.4.1); cuda-cudart-12-4 12.4.127-1
//     -> 12.4 (12.4.127 is the runtime's own version: a build, not an
//     update release); every other component -> X.Y. cuda-compat-X-Y is
//     not a toolkit: see CompatDrivers.
//   - Debian/Ubuntu's own packages (debCUDARe): the toolkit after "~".
func cudaFromPackage(p Package) (cand, bool) {
	if p.Source == SourceApk {
		return cand{}, false
	}
	if m := nvCUDARe.FindStringSubmatch(p.Name); m != nil {
		comp := m[1]
		if comp == "compat" {
			return cand{}, false
		}
		return nvCUDA(p, comp, m[2], m[3])
	}
	if m := nvLibRe.FindStringSubmatch(p.Name); m != nil {
		return nvCUDA(p, "lib"+m[1], m[2], m[3])
	}
	if isDistro(p, SourceDpkg) && debCUDARe.MatchString(p.Name) {
		m := debCUDAVerRe.FindStringSubmatch(stripEpoch(p.Version))
		if m == nil {
			return cand{}, false
		}
		rel, note, ok := cudaRelease(m[1])
		if !ok {
			return cand{}, false
		}
		rank := rankComponent
		switch {
		case p.Name == "nvidia-cuda-toolkit" || p.Name == "nvidia-cuda-dev":
			rank = rankRelease
		case strings.HasPrefix(p.Name, "libcudart"):
			rank = rankCore
		}
		if note == "" {
			note = "distribution build of CUDA " + m[1] + ", the part after \"~\""
		}
		return cand{rank, Version{Version: rel, From: from(p, note)}}, true
	}
	return cand{}, false
}

func nvCUDA(p Package, comp, xs, ys string) (cand, bool) {
	x, _ := strconv.Atoi(xs)
	y, _ := strconv.Atoi(ys)
	if len(xs) > 2 || len(ys) > 2 || !releaseOK([]int{x, y}) {
		return cand{}, false
	}
	name := join([]int{x, y})
	up := upstream(p.Version)
	ns, numeric := numFields(up)
	sameLine := numeric && len(ns) >= 2 && ns[0] == x && ns[1] == y
	if rank, meta := nvMeta[comp]; meta {
		if sameLine {
			if rel, note, ok := cudaRelease(up); ok {
				return cand{rank, Version{Version: rel, From: from(p, note)}}, true
			}
		}
		return cand{rank, Version{Version: name, From: from(p, "CUDA "+name+" from the name")}}, true
	}
	note := "CUDA " + name + " from the name"
	rank := rankComponent
	if comp == "cudart" {
		rank = rankCore
		if sameLine {
			note = "CUDA " + name + " from the name; runtime " + up
		}
	}
	return cand{rank, Version{Version: name, From: from(p, note)}}, true
}

// nvDriverRe is an NVIDIA driver version: 550.54.15, 535.104.05, 470.57.02.
var nvDriverRe = regexp.MustCompile(`^\d{3,4}\.\d{1,3}(?:\.\d{1,3})?$`)

// CompatDrivers returns the driver versions of the CUDA
// forward-compatibility packages in pk: NVIDIA's cuda-compat-X-Y, whose
// version is the driver it carries (cuda-compat-12-4 550.54.15-1: the
// ubuntu2204 driver repository of 550.54.15 ships
// cuda-compat-12-4_550.54.15-1_amd64.deb). It puts a newer libcuda in
// /usr/local/cuda-X.Y/compat; it is not a toolkit, and the node's kernel
// driver must still be one the compat package supports.
func CompatDrivers(pk []Package) []Version {
	var out []Version
	for _, p := range pk {
		if p.Source == SourceApk {
			continue
		}
		m := nvCUDARe.FindStringSubmatch(p.Name)
		if m == nil || m[1] != "compat" {
			continue
		}
		drv := upstream(p.Version)
		if !nvDriverRe.MatchString(drv) {
			continue
		}
		v := Version{Version: drv, From: from(p, "CUDA "+m[2]+"."+m[3]+" forward-compatibility driver "+drv)}
		out = appendNew(out, []Version{v})
	}
	return out
}

// --- ROCm ---

var (
	// rocm-core carries the release itself (it writes /opt/rocm/.info/
	// version); AMD's multi-version install names it rocm-core6.2.0.
	rocmCoreRe = regexp.MustCompile(`^rocm-core(\d+\.\d+\.\d+)?$`)

	// AMD's repository (repo.radeon.com/rocm/apt/X.Y, .../rocm/rhel9/X.Y)
	// versions every package "OWN.NNNNN-BUILD": the package's own version,
	// then the release code (see rocmCode), then AMD's build and the
	// distribution. Seen in repo.radeon.com URLs and apt logs:
	// rocm-core_6.0.0.60000-91~22.04, rocm-core_6.1.0.60100-82~22.04,
	// rocm-core (6.4.2.60402-120~24.04),
	// hip-runtime-amd6.2.0_6.2.41133.60200-66~22.04 (a bazel
	// rocm_redist_ubuntu_22_04 list of the 6.2 pool),
	// rocblas_4.2.0.60200-66~24.04, comgr_2.8.0.60200-66~22.04,
	// rocm-llvm_18.0.0.24292.60200-66~24.04; hip-runtime-amd_5.7.31921.50701-98~20.04,
	// hip-runtime-amd_5.2.21151.50200-65 (5.2 had no "~distro").
	// Only the code is the ROCm release: rocBLAS 4.2.0 is the library's
	// own number (its CHANGELOG: "rocBLAS 4.2.0 for ROCm 6.2.0", "rocBLAS
	// 3.1.0 for ROCm 5.7.0", "rocBLAS 2.38.0 for ROCm 4.2.0": the libraries
	// never followed the ROCm numbers in AMD's packages). Names with
	// "nvidia" (hip-runtime-nvidia) are HIP for NVIDIA GPUs.
	amdNameRe = regexp.MustCompile(`^(roc|hip|hsa|miopen|rccl|comgr|migraphx|amd-smi|amdsmi|openmp-extras|mivisionx|rpp|half|composablekernel|aqlprofile|omniperf|omnitrace)`)
	// HIP packages' own version is HIP's: X.Y is the ROCm release, the
	// third field a build id (6.2.41133, 5.7.31921).
	amdHIPRe = regexp.MustCompile(`^hip-(runtime-amd|dev|base|doc|samples)(\d+\.\d+\.\d+)?$`)

	// Debian's ROCm team packages each component from the upstream tag
	// rocm-X.Y.Z and versions it X.Y.Z: the ROCm release, not the
	// library's own number. Debian 12 has libamdhip64-5 5.2.3-8 (source
	// rocm-hipamd; its libamdhip64.so.5.2.21153), libhsa-runtime64-1
	// 5.2.3-3, libamd-comgr2 5.2.3-2, rocminfo 5.2.3-2, librocm-smi64-1
	// 5.2.3-2, librocrand1 5.3.3-4, librocprim-dev 5.3.3-4, libhipsparse0
	// 5.3.3+dfsg-2~deb12u1, and librocsparse0 5.3.0+dfsg-2, whose own
	// changelog.gz starts "rocSPARSE 2.3.2": Debian's 5.3.0 is the rocm-5.3.0
	// tag of rocSPARSE 2.3.2. Its experimental uploads of 6.x keep this
	// (rocprim 6.0.2-1~exp1 while rocPRIM's own version is 3.x). So a
	// distribution build X.Y.Z belongs to ROCm X.Y; only major.minor is
	// kept because one Debian release mixes patch levels (and, in 12,
	// HIP 5.2 with libraries of 5.3). rocm-cmake (5.4.0 in Debian 12) is a
	// build tool and not counted.
	debROCmRe = regexp.MustCompile(`^(libamdhip64-\d+|libamdhip64-dev|hipcc|libhsa-runtime64-\d+|libhsa-runtime-dev|libhsakmt\d+|libhsakmt-dev|libamd-comgr\d+|libamd-comgr-dev|lib(?:roc|hip)(?:blas|sparse|fft|rand|solver)(?:\d+|-dev)|librccl\d+|librccl-dev|librocm-smi64-\d+|librocm-smi-dev|rocm-smi|rocminfo|librocprim-dev|librocthrust-dev|libhipcub-dev|rocm-device-libs)$`)

	// Fedora (and openSUSE, from the same specs) versions ROCm packages
	// with the release too: "Version: %{rocm_version}" in rocclr.spec
	// (binary rocm-hip, rocm-opencl), rocblas.spec, rocm.spec; compat
	// builds add the release to the name (rocm-hip6.4, pkg_suffix in
	// rocclr.spec). Sources: Fedora's specs as mirrored in
	// major/fedora-rpm-specs.
	fedROCmRe = regexp.MustCompile(`^(rocm-hip|rocm-runtime|rocm-comgr|rocm-opencl|rocm-clinfo|rocm-smi|rocminfo|rocblas|hipblas|rocsparse|hipsparse|rocfft|hipfft|rocrand|hiprand|rocsolver|hipsolver|rccl|miopen|rocalution|rocprim|rocthrust|hipcub)(\d+\.\d+)?(-devel)?$`)
)

// rocmFromPackage applies the ROCm rules to one package:
//
//   - rocm-core X.Y.Z.NNNNN: ROCm X.Y.Z, cross-checked with the code; on a
//     disagreement the first three fields win. Fedora's rocm-core X.Y.Z:
//     X.Y.Z.
//   - AMD's HIP packages X.Y.BUILD.NNNNN: ROCm from the code when it
//     agrees with HIP's X.Y, else X.Y.
//   - Every other AMD package OWN.NNNNN: ROCm from the code.
//   - Debian/Ubuntu and Fedora builds of ROCm components, X.Y.Z: ROCm X.Y.
func rocmFromPackage(p Package) (cand, bool) {
	if p.Source == SourceApk {
		return cand{}, false
	}
	up := upstream(p.Version)
	lead, code, amd := amdVersion(up)
	if rocmCoreRe.MatchString(p.Name) {
		if amd {
			first := lead[:3]
			switch {
			case releaseOK(first) && join(first) == join(code):
				return cand{rankRelease, Version{Version: join(first), From: from(p, "")}}, true
			case releaseOK(first):
				return cand{rankRelease, Version{Version: join(first), From: from(p, fmt.Sprintf("release code %s says %s; the first three fields are taken", up[strings.LastIndexByte(up, '.')+1:], join(code)))}}, true
			default:
				return cand{rankRelease, Version{Version: join(code), From: from(p, "from the release code")}}, true
			}
		}
		if ns, ok := distRelease(up); ok && len(ns) == 3 {
			return cand{rankRelease, Version{Version: join(ns), From: from(p, "")}}, true
		}
		return cand{}, false
	}
	if amd && amdNameRe.MatchString(p.Name) && !strings.Contains(p.Name, "nvidia") {
		codeStr := up[strings.LastIndexByte(up, '.')+1:]
		if amdHIPRe.MatchString(p.Name) {
			hip := lead[:2]
			if !releaseOK(hip) {
				return cand{}, false
			}
			if hip[0] == code[0] && hip[1] == code[1] {
				return cand{rankRuntime, Version{Version: join(code), From: from(p, fmt.Sprintf("HIP %s, %d is a build id; %s = ROCm %s", join(hip), lead[2], codeStr, join(code)))}}, true
			}
			return cand{rankRuntime, Version{Version: join(hip), From: from(p, fmt.Sprintf("HIP %s; release code %s (%s) disagrees, HIP's is taken", join(hip), codeStr, join(code)))}}, true
		}
		rank := rankComponent
		if strings.HasPrefix(p.Name, "rocm-") || strings.HasPrefix(p.Name, "hsa-rocr") {
			rank = rankCore
		}
		note := codeStr + " = ROCm " + join(code)
		if join(lead) != join(code) {
			note += "; " + join(lead) + " is the package's own version"
		}
		return cand{rank, Version{Version: join(code), From: from(p, note)}}, true
	}
	if amd {
		return cand{}, false
	}
	if isDistro(p, SourceDpkg) && debROCmRe.MatchString(p.Name) {
		ns, ok := distRelease(up)
		if !ok {
			return cand{}, false
		}
		rel := join(ns[:2])
		switch {
		case strings.HasPrefix(p.Name, "libamdhip64") || p.Name == "hipcc":
			return cand{rankRuntime, Version{Version: rel, From: from(p, "distribution build of HIP "+rel+" = ROCm "+rel)}}, true
		case strings.HasPrefix(p.Name, "libhsa-runtime"):
			return cand{rankCore, Version{Version: rel, From: from(p, "distribution build of ROCr "+join(ns)+" = ROCm "+rel)}}, true
		}
		return cand{rankComponent, Version{Version: rel, From: from(p, "distribution build tagged rocm-"+join(ns)+" = ROCm "+rel+", not the library's own version")}}, true
	}
	if isDistro(p, SourceRPM) {
		m := fedROCmRe.FindStringSubmatch(p.Name)
		if m == nil {
			return cand{}, false
		}
		ns, ok := distRelease(up)
		if !ok {
			return cand{}, false
		}
		rel := join(ns[:2])
		if m[2] != "" && m[2] != rel {
			return cand{}, false // a compat build named for another release
		}
		rank := rankComponent
		switch m[1] {
		case "rocm-hip":
			rank = rankRuntime
		case "rocm-runtime":
			rank = rankCore
		}
		return cand{rank, Version{Version: rel, From: from(p, "distribution build versioned by ROCm release "+join(ns))}}, true
	}
	return cand{}, false
}
