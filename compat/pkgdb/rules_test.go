package pkgdb

import (
	"testing"
)

// Each case is one installed package and what kiln must read from it.
// The comment names where the name and version string come from.
var packageCases = []struct {
	pk         Package
	cuda, rocm string // "" = no fact
	from       string // expected From of the fact, when checked
}{
	// --- NVIDIA CUDA repository (Ubuntu and RHEL) ---

	// nvidia/cuda dist/12.4.1/ubuntu2204/base: cuda-cudart-12-4=${NV_CUDA_CUDART_VERSION}, 12.4.127-1.
	{Package{"cuda-cudart-12-4", "12.4.127-1", "dpkg"}, "12.4", "", "dpkg: cuda-cudart-12-4 12.4.127-1 (CUDA 12.4 from the name; runtime 12.4.127)"},
	// ...ubi9/base: cuda-cudart-12-4-${NV_CUDA_CUDART_VERSION}; rpm VERSION 12.4.127, RELEASE 1.
	{Package{"cuda-cudart-12-4", "12.4.127-1", "rpm"}, "12.4", "", "rpm: cuda-cudart-12-4 12.4.127-1 (CUDA 12.4 from the name; runtime 12.4.127)"},
	// ...runtime: cuda-libraries-12-4=${NV_CUDA_LIB_VERSION}, 12.4.1-1 (a meta-package: the release).
	{Package{"cuda-libraries-12-4", "12.4.1-1", "dpkg"}, "12.4.1", "", "dpkg: cuda-libraries-12-4 12.4.1-1"},
	// cuda-toolkit-12-4 is the toolkit meta-package, 12.4.1-1 on the repository.
	{Package{"cuda-toolkit-12-4", "12.4.1-1", "dpkg"}, "12.4.1", "", "dpkg: cuda-toolkit-12-4 12.4.1-1"},
	// "apt list" of an 11.6.1 install: cuda-toolkit-11-6/now 11.6.1-1, cuda-nvcc-11-6/now 11.6.112-1.
	{Package{"cuda-toolkit-11-6", "11.6.1-1", "dpkg"}, "11.6.1", "", ""},
	{Package{"cuda-nvcc-11-6", "11.6.112-1", "dpkg"}, "11.6", "", "dpkg: cuda-nvcc-11-6 11.6.112-1 (CUDA 11.6 from the name)"},
	// Were a meta-package versioned like a component, the build is dropped.
	{Package{"cuda-compiler-12-4", "12.4.131-1", "dpkg"}, "12.4", "", "dpkg: cuda-compiler-12-4 12.4.131-1 (12.4.131: 131 is a build number, not an update release)"},
	// cuda-12-4 (the whole toolkit and driver) is a meta-package too.
	{Package{"cuda-12-4", "12.4.1-1", "dpkg"}, "12.4.1", "", ""},
	// nvidia/cuda 11.8 images: cuda-nvrtc-11-8 11.8.89-1.
	{Package{"cuda-nvrtc-11-8", "11.8.89-1", "dpkg"}, "11.8", "", ""},
	// NV_NVTX_VERSION 12.4.127-1; libcublas-12-4 NV_LIBCUBLAS_VERSION 12.4.5.8-1 (library's own number).
	{Package{"cuda-nvtx-12-4", "12.4.127-1", "dpkg"}, "12.4", "", ""},
	{Package{"libcublas-12-4", "12.4.5.8-1", "dpkg"}, "12.4", "", "dpkg: libcublas-12-4 12.4.5.8-1 (CUDA 12.4 from the name)"},
	// A meta-package whose version disagrees with its name: the name wins.
	{Package{"cuda-runtime-12-4", "12.5.0-1", "dpkg"}, "12.4", "", "dpkg: cuda-runtime-12-4 12.5.0-1 (CUDA 12.4 from the name)"},
	// cuda-compat-12-4 550.54.15-1 is the forward-compatibility driver, not a toolkit.
	{Package{"cuda-compat-12-4", "550.54.15-1", "dpkg"}, "", "", ""},
	// Not toolkit packages: the repository's keyring, drivers, config, cuDNN and NCCL builds.
	{Package{"cuda-keyring", "1.1-1", "dpkg"}, "", "", ""},
	{Package{"cuda-drivers-550", "550.54.15-1", "dpkg"}, "", "", ""},
	{Package{"cuda-toolkit-12-4-config-common", "12.4.127-1", "dpkg"}, "", "", ""},
	{Package{"cuda-toolkit-config-common", "12.4.127-1", "dpkg"}, "", "", ""},
	{Package{"libcudnn9-cuda-12", "9.1.0.70-1", "dpkg"}, "", "", ""},
	{Package{"libnccl2", "2.21.5-1+cuda12.4", "dpkg"}, "", "", ""},
	// Bad numbers in the name.
	{Package{"cuda-cudart-123-4", "1-1", "dpkg"}, "", "", ""},
	{Package{"cuda-cudart-0-4", "1-1", "dpkg"}, "", "", ""},
	// Alpine has no CUDA packages; an apk of that name is not NVIDIA's.
	{Package{"cuda-cudart-12-4", "12.4.127-r0", "apk"}, "", "", ""},

	// --- Debian / Ubuntu CUDA (source nvidia-cuda-toolkit) ---

	// Debian 12: libcudart11.0 11.8.89~11.8.0-5~deb12u1 -> toolkit 11.8.0.
	{Package{"libcudart11.0", "11.8.89~11.8.0-5~deb12u1", "dpkg"}, "11.8.0", "", "dpkg: libcudart11.0 11.8.89~11.8.0-5~deb12u1 (distribution build of CUDA 11.8.0, the part after \"~\")"},
	// Debian 12: nvidia-cuda-toolkit 11.8.89~11.8.0-5~deb12u1.
	{Package{"nvidia-cuda-toolkit", "11.8.89~11.8.0-5~deb12u1", "dpkg"}, "11.8.0", "", ""},
	// Debian 12: libcublas11 11.11.3.6~11.8.0-5~deb12u1.
	{Package{"libcublas11", "11.11.3.6~11.8.0-5~deb12u1", "dpkg"}, "11.8.0", "", ""},
	// Without the "~TOOLKIT" part (an old or foreign package): no fact.
	{Package{"libcudart11.0", "11.8.89-1", "dpkg"}, "", "", ""},

	// --- AMD's ROCm repository ---

	// rocm-core of the repo.radeon.com 6.2 pool, whose packages are all
	// OWN.60200-66~22.04 (comgr 2.8.0.60200-66~22.04, ...).
	{Package{"rocm-core", "6.2.0.60200-66~22.04", "dpkg"}, "", "6.2.0", "dpkg: rocm-core 6.2.0.60200-66~22.04"},
	// Multi-version install: rocm-core6.2.0.
	{Package{"rocm-core6.2.0", "6.2.0.60200-66~22.04", "dpkg"}, "", "6.2.0", ""},
	// ROCm 6.0.2 and 6.4.2 apt logs: rocm-core_6.0.2.60002-115~22.04, rocm-core (6.4.2.60402-120~24.04).
	{Package{"rocm-core", "6.0.2.60002-115~22.04", "dpkg"}, "", "6.0.2", ""},
	{Package{"rocm-core", "6.4.2.60402-120~24.04", "dpkg"}, "", "6.4.2", ""},
	// A rocm-core whose fields disagree with the code: the first three win.
	{Package{"rocm-core", "6.0.0.60003-1~24.04", "dpkg"}, "", "6.0.0", "dpkg: rocm-core 6.0.0.60003-1~24.04 (release code 60003 says 6.0.3; the first three fields are taken)"},
	// RHEL 9 repository: rocm-core-6.2.0.60200-66.el9.
	{Package{"rocm-core", "6.2.0.60200-66.el9", "rpm"}, "", "6.2.0", "rpm: rocm-core 6.2.0.60200-66.el9"},
	// repo.radeon.com 6.2: hip-runtime-amd6.2.0_6.2.41133.60200-66~22.04: HIP 6.2, 41133 a build.
	{Package{"hip-runtime-amd", "6.2.41133.60200-66~22.04", "dpkg"}, "", "6.2.0", "dpkg: hip-runtime-amd 6.2.41133.60200-66~22.04 (HIP 6.2, 41133 is a build id; 60200 = ROCm 6.2.0)"},
	{Package{"hip-runtime-amd6.2.0", "6.2.41133.60200-66~20.04", "dpkg"}, "", "6.2.0", ""},
	// repo.radeon.com 5.7.1 / 5.2 / 5.4.1 / 6.4.1.
	{Package{"hip-runtime-amd", "5.7.31921.50701-98~20.04", "dpkg"}, "", "5.7.1", ""},
	{Package{"hip-runtime-amd", "5.2.21151.50200-65", "dpkg"}, "", "5.2.0", ""},
	{Package{"hip-runtime-amd", "5.4.22802.50401-84~22.04", "dpkg"}, "", "5.4.1", ""},
	{Package{"hip-runtime-amd", "6.4.43483.60401-83~24.04", "dpkg"}, "", "6.4.1", ""},
	// A HIP version whose code disagrees: HIP's major.minor, never the build.
	{Package{"hip-runtime-amd", "6.2.41133.60100-1", "dpkg"}, "", "6.2", "dpkg: hip-runtime-amd 6.2.41133.60100-1 (HIP 6.2; release code 60100 (6.1.0) disagrees, HIP's is taken)"},
	// repo.radeon.com 6.2: rocblas_4.2.0.60200-66~24.04: rocBLAS 4.2.0 is ROCm 6.2.0.
	{Package{"rocblas", "4.2.0.60200-66~24.04", "dpkg"}, "", "6.2.0", "dpkg: rocblas 4.2.0.60200-66~24.04 (60200 = ROCm 6.2.0; 4.2.0 is the package's own version)"},
	// comgr_2.8.0.60200-66~22.04, rocm-llvm_18.0.0.24292.60200-66~24.04.
	{Package{"comgr", "2.8.0.60200-66~22.04", "dpkg"}, "", "6.2.0", ""},
	{Package{"rocm-llvm", "18.0.0.24292.60200-66~24.04", "dpkg"}, "", "6.2.0", ""},
	// ROCm 6.2 on RHEL 9.4 ("yum list installed"): amd-smi-lib 24.6.2.60200-66.el9.
	{Package{"amd-smi-lib", "24.6.2.60200-66.el9", "rpm"}, "", "6.2.0", ""},
	// ...and amdgpu-core 1:6.2.60200-2009582.el9: the kernel driver's packages are not ROCm user space.
	{Package{"amdgpu-core", "1:6.2.60200-2009582.el9", "rpm"}, "", "", ""},
	{Package{"amdgpu-dkms", "1:6.8.5.60200-2009582.el9", "rpm"}, "", "", ""},
	// libdrm-amdgpu-amdgpu1_2.4.116.60000-1697589.22.04: the amdgpu repository, not ROCm.
	{Package{"libdrm-amdgpu-amdgpu1", "1:2.4.116.60000-1697589.22.04", "dpkg"}, "", "", ""},
	// HIP for NVIDIA GPUs.
	{Package{"hip-runtime-nvidia", "6.2.41133.60200-66~22.04", "dpkg"}, "", "", ""},
	// An AMD library without the release code: its own number is not a ROCm release.
	{Package{"rocblas", "4.2.0-1", "dpkg"}, "", "", ""},
	// HIP-like numbers without a release code after them: no fact.
	{Package{"rocblas", "6.2.41133-1", "dpkg"}, "", "", ""},
	{Package{"hip-runtime-amd", "6.2.41133-1", "dpkg"}, "", "", ""},

	// --- Debian / Ubuntu ROCm (versioned by the upstream rocm-X.Y.Z tag) ---

	// Debian 12: libamdhip64-5 5.2.3-8 (source rocm-hipamd).
	{Package{"libamdhip64-5", "5.2.3-8", "dpkg"}, "", "5.2", "dpkg: libamdhip64-5 5.2.3-8 (distribution build of HIP 5.2 = ROCm 5.2)"},
	// An earlier unstable upload (its changelog.Debian lists rocm-hipamd 5.2.3-3).
	{Package{"libamdhip64-5", "5.2.3-3", "dpkg"}, "", "5.2", ""},
	// Debian 12: hipcc 5.2.3-8 (same source); AMD's hipcc has its own 1.x version.
	{Package{"hipcc", "5.2.3-8", "dpkg"}, "", "5.2", ""},
	{Package{"hipcc", "1.1.1.60200-66~22.04", "dpkg"}, "", "6.2.0", ""},
	// Debian 12: libhsa-runtime64-1 5.2.3-3 (rocr-runtime).
	{Package{"libhsa-runtime64-1", "5.2.3-3", "dpkg"}, "", "5.2", "dpkg: libhsa-runtime64-1 5.2.3-3 (distribution build of ROCr 5.2.3 = ROCm 5.2)"},
	// Debian 12: librocsparse0 5.3.0+dfsg-2 is rocSPARSE 2.3.2 of ROCm 5.3.0.
	{Package{"librocsparse0", "5.3.0+dfsg-2", "dpkg"}, "", "5.3", "dpkg: librocsparse0 5.3.0+dfsg-2 (distribution build tagged rocm-5.3.0 = ROCm 5.3, not the library's own version)"},
	// A Debian upload outside Debian 12 (string not checked against the
	// archive here): librocblas0 5.3.3+dfsg-2, the rocm-5.3.3 tag; rocBLAS's
	// own number there is 2.45 ("rocBLAS 2.45.0 in ROCm 5.3.0").
	{Package{"librocblas0", "5.3.3+dfsg-2", "dpkg"}, "", "5.3", ""},
	// Debian 12: libhipsparse0 5.3.3+dfsg-2~deb12u1, librocrand1 5.3.3-4, rocminfo 5.2.3-2.
	{Package{"libhipsparse0", "5.3.3+dfsg-2~deb12u1", "dpkg"}, "", "5.3", ""},
	{Package{"librocrand1", "5.3.3-4", "dpkg"}, "", "5.3", ""},
	{Package{"rocminfo", "5.2.3-2", "dpkg"}, "", "5.2", ""},
	// Debian experimental: rocprim 6.0.2-1~exp1 (rocPRIM 3.x): ROCm 6.0.
	{Package{"librocprim-dev", "6.0.2-1~exp1", "dpkg"}, "", "6.0", ""},
	// Debian 12: rocm-cmake 5.4.0-1, a build tool next to HIP 5.2: not counted.
	{Package{"rocm-cmake", "5.4.0-1", "dpkg"}, "", "", ""},
	// Not ROCm at all, though named lib...
	{Package{"libamdhip64-5", "junk", "dpkg"}, "", "", ""},
	{Package{"libamdhip64-5", "5.2.21153-1", "dpkg"}, "", "", ""},

	// --- Fedora / openSUSE (Version: %{rocm_version}) ---

	// Fedora's rocclr.spec (binary rocm-hip): changelog "7.2.2-3" (Fedora 45
	// mass rebuild) and "6.4.2-2" (Fedora 43 mass rebuild).
	{Package{"rocm-hip", "7.2.2-3.fc45", "rpm"}, "", "7.2", "rpm: rocm-hip 7.2.2-3.fc45 (distribution build versioned by ROCm release 7.2.2)"},
	{Package{"rocm-hip-devel", "6.4.2-2.fc43", "rpm"}, "", "6.4", ""},
	// rocblas.spec has "Version: %{rocm_version}" too (release illustrative).
	{Package{"rocblas", "6.4.2-1.fc43", "rpm"}, "", "6.4", ""},
	// --with compat builds add %{rocm_release} to the name.
	{Package{"rocm-hip6.4", "6.4.2-2.fc45", "rpm"}, "", "6.4", ""},
	{Package{"rocm-hip6.4", "7.2.2-3.fc45", "rpm"}, "", "", ""},
	// Fedora's rocm-core carries the release as is.
	{Package{"rocm-core", "7.2.2-1.fc45", "rpm"}, "", "7.2.2", "rpm: rocm-core 7.2.2-1.fc45"},
	// A Fedora name in a dpkg database is not Fedora's.
	{Package{"rocblas", "6.2.0-1", "dpkg"}, "", "", ""},
	// Alpine.
	{Package{"rocm-core", "6.2.0-r0", "apk"}, "", "", ""},
}

func TestFromPackagesEach(t *testing.T) {
	for _, c := range packageCases {
		cuda, rocm := FromPackages([]Package{c.pk})
		check := func(kind string, got []Version, want string) {
			t.Helper()
			if want == "" {
				if len(got) != 0 {
					t.Errorf("%+v: %s %+v, want none", c.pk, kind, got)
				}
				return
			}
			if len(got) != 1 || got[0].Version != want {
				t.Errorf("%+v: %s %+v, want %s", c.pk, kind, got, want)
				return
			}
			if c.from != "" && got[0].From != c.from {
				t.Errorf("%+v: %s From\n got  %q\n want %q", c.pk, kind, got[0].From, c.from)
			}
		}
		check("cuda", cuda, c.cuda)
		check("rocm", rocm, c.rocm)
	}
}

func TestFromPackagesImages(t *testing.T) {
	for _, c := range []struct {
		name       string
		pk         []Package
		cuda, rocm []Version
	}{{
		// rocm/dev-ubuntu-22.04:6.2 style: all from one release; one fact.
		name: "amd 6.2",
		pk: []Package{
			{"comgr", "2.8.0.60200-66~22.04", "dpkg"},
			{"hip-runtime-amd", "6.2.41133.60200-66~22.04", "dpkg"},
			{"rocblas", "4.2.0.60200-66~22.04", "dpkg"},
			{"rocm-core", "6.2.0.60200-66~22.04", "dpkg"},
		},
		rocm: []Version{{"6.2.0", "dpkg: rocm-core 6.2.0.60200-66~22.04"}},
	}, {
		// Without rocm-core, HIP leads.
		name: "amd no core",
		pk: []Package{
			{"rocblas", "4.2.0.60200-66~22.04", "dpkg"},
			{"hip-runtime-amd", "6.2.41133.60200-66~22.04", "dpkg"},
		},
		rocm: []Version{{"6.2.0", "dpkg: hip-runtime-amd 6.2.41133.60200-66~22.04 (HIP 6.2, 41133 is a build id; 60200 = ROCm 6.2.0)"}},
	}, {
		// A HIP X.Y fact is extended by a later, more precise one of the same line.
		name: "refine",
		pk: []Package{
			{"hip-runtime-amd", "6.2.41133.60100-1", "dpkg"},
			{"rocm-libs", "6.2.0.60200-66~22.04", "dpkg"},
		},
		rocm: []Version{{"6.2.0", "dpkg: rocm-libs 6.2.0.60200-66~22.04 (60200 = ROCm 6.2.0)"}},
	}, {
		// Two ROCm releases side by side stay two facts.
		name: "two rocm",
		pk: []Package{
			{"rocm-core", "6.2.0.60200-66~22.04", "dpkg"},
			{"rocblas", "4.0.0.60000-91~22.04", "dpkg"},
		},
		rocm: []Version{
			{"6.2.0", "dpkg: rocm-core 6.2.0.60200-66~22.04"},
			{"6.0.0", "dpkg: rocblas 4.0.0.60000-91~22.04 (60000 = ROCm 6.0.0; 4.0.0 is the package's own version)"},
		},
	}, {
		// nvidia/cuda:12.4.1-devel: the toolkit meta-package leads.
		name: "cuda devel",
		pk: []Package{
			{"cuda-cudart-12-4", "12.4.127-1", "dpkg"},
			{"cuda-nvcc-12-4", "12.4.131-1", "dpkg"},
			{"cuda-toolkit-12-4", "12.4.1-1", "dpkg"},
			{"cuda-libraries-12-4", "12.4.1-1", "dpkg"},
		},
		cuda: []Version{{"12.4.1", "dpkg: cuda-toolkit-12-4 12.4.1-1"}},
	}, {
		// Two toolkits installed.
		name: "two cuda",
		pk: []Package{
			{"cuda-cudart-11-8", "11.8.89-1", "dpkg"},
			{"cuda-cudart-12-4", "12.4.127-1", "dpkg"},
		},
		cuda: []Version{
			{"11.8", "dpkg: cuda-cudart-11-8 11.8.89-1 (CUDA 11.8 from the name; runtime 11.8.89)"},
			{"12.4", "dpkg: cuda-cudart-12-4 12.4.127-1 (CUDA 12.4 from the name; runtime 12.4.127)"},
		},
	}, {
		name: "none",
		pk:   []Package{{"libc6", "2.36-9+deb12u14", "dpkg"}, {"musl", "1.2.2-r7", "apk"}},
	}} {
		cuda, rocm := FromPackages(c.pk)
		eq(t, c.name+" cuda", cuda, c.cuda)
		eq(t, c.name+" rocm", rocm, c.rocm)
	}
}

func TestCompatDrivers(t *testing.T) {
	got := CompatDrivers([]Package{
		{"cuda-compat-12-4", "550.54.15-1", "dpkg"}, // nvidia ubuntu2204 driver repo: cuda-compat-12-4_550.54.15-1_amd64.deb
		{"cuda-compat-12-4", "550.54.15-1", "rpm"},
		{"cuda-compat-11-8", "520.61.05-1", "dpkg"}, // the 11.8.0 runfile's driver, 520.61.05
		{"cuda-compat-12-6", "junk-1", "dpkg"},
		{"cuda-cudart-12-4", "12.4.127-1", "dpkg"},
		{"cuda-compat-12-4", "550.54.15-r0", "apk"},
	})
	eq(t, "compat", got, []Version{
		{"550.54.15", "dpkg: cuda-compat-12-4 550.54.15-1 (CUDA 12.4 forward-compatibility driver 550.54.15)"},
		{"550.54.15", "rpm: cuda-compat-12-4 550.54.15-1 (CUDA 12.4 forward-compatibility driver 550.54.15)"},
		{"520.61.05", "dpkg: cuda-compat-11-8 520.61.05-1 (CUDA 11.8 forward-compatibility driver 520.61.05)"},
	})
}

func TestHIPSoname(t *testing.T) {
	for in, want := range map[string]string{
		"5.2.21153":   "5.2", // Debian 12 libamdhip64-5: libamdhip64.so.5.2.21153
		"6.2.41133":   "6.2", // ROCm 6.2's HIP 6.2.41133
		"6.3.60303":   "6.3", // ROCm 6.3.3: libamdhip64.so.6.3.60303
		"6.4.60400":   "6.4", // /opt/rocm-6.4.0/lib/libamdhip64.so.6.4.60400
		"6.3.42131":   "6.3", // torch 2.4.0+rocm6.3 reports HIP 6.3.42131
		"6.2":         "6.2",
		"5":           "",
		"":            "",
		"6.":          "",
		"6.2.x":       "",
		"6.100.1":     "",
		"0.2.1":       "",
		"6.2.1.1":     "",
		"-6.2.1":      "",
		"6.2.41133\n": "",
	} {
		got, ok := HIPSoname(in)
		if got != want || ok != (want != "") {
			t.Errorf("HIPSoname(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestROCmInfoVersion(t *testing.T) {
	for in, want := range map[string]string{
		"6.2.0-66":       "6.2.0", // rocm-core 6.2.0.60200-66 writes this
		"6.2.0-66\n":     "6.2.0",
		"5.7.1":          "5.7.1",
		"5.2.0-65\r\n":   "5.2.0",
		"  6.4.2-120  ":  "6.4.2",
		"6.2":            "6.2",
		"6.2.0.60200-66": "6.2.0",
		"6.2.0-66 junk":  "6.2.0",
		"":               "",
		"junk":           "",
		"6":              "",
		"6.2.41133-66":   "",
		"6.123.0":        "",
		"0.1.0":          "",
		"6.2.0/66":       "",
		"v6.2.0":         "",
	} {
		got, err := ROCmInfoVersion(in)
		if want == "" {
			if err == nil {
				t.Errorf("ROCmInfoVersion(%q) = %q, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("ROCmInfoVersion(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
