package compat_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/fatbin"
	"kiln.dev/kiln/compat/imagetest"
	"kiln.dev/kiln/compat/offload"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// The verdict matrix: images whose GPU code is that of real binaries
// (the code lists below were read off the files named, and the real files
// are checked against cuobjdump and clang-offload-bundler by
// TestRealBinaries), on nodes from Pascal to Blackwell and gfx906 to gfx942
// with drivers from 460 to 590 and amdgpu drivers of ROCm 6.0 to 7.1. Each
// expected verdict cites the rule it follows.
//
// Rules (kb/data/ptx.yaml and kb/data/cuda*.yaml hold their sources):
//
//	SASS   sm_XY runs on compute capability X.Z with Z >= Y; sm_XYa only on
//	       X.Y; sm_XYf on its family (CUDA Programming Guide, binary
//	       compatibility and feature availability).
//	PTX    compute_XY is JIT-compiled for capability >= X.Y, if the driver
//	       supports the PTX ISA version: a driver older than the toolkit that
//	       wrote it refuses it (CUDA_ERROR_UNSUPPORTED_PTX_VERSION); CUDA
//	       minor-version compatibility does not cover PTX (CUDA Compatibility
//	       guide).
//	MINOR  a CUDA 11.x/12.x/13.x runtime runs on any driver of its major
//	       family's floor (minor-version compatibility).
//	DRV    a runtime newer than its family's floor on the node's driver does
//	       not start (CUDA release notes, toolkit driver table).
//	DROP   CUDA 13 dropped Maxwell, Pascal and Volta.
//	HIP    a code object runs on its processor, or on a member of its generic
//	       target; a feature it sets must match the node's (AMDGPUUsage; the
//	       HIP runtime's code object matching).
//	KMD    AMD supports ROCm user space within a window of its kernel driver
//	       (ROCm support matrix).
//	ANY    every file with GPU code must have code for the GPU, or the image
//	       does not run there; an unknown fact gives unknown, never runs.

// codeELF is a shared object whose .nv_fatbin holds the code listed as
// "sm_86 sm_120a compute_90@9.1" (PTX with its ISA version).
func codeELF(t testing.TB, list string) []byte {
	t.Helper()
	var entries []fatbin.Entry
	for _, w := range strings.Fields(list) {
		target, isa, _ := strings.Cut(w, "@")
		c, err := fatbin.ParseTarget(target)
		if err != nil {
			t.Fatal(err)
		}
		e := fatbin.Entry{Kind: fatbin.KindELF, Arch: c.Arch, Variant: c.Variant, Flags: 0x8011}
		if c.Kind == fatbin.PTX {
			e.Kind = fatbin.KindPTX
			fmt.Sscanf(isa, "%d.%d", &e.Major, &e.Minor)
		}
		entries = append(entries, e)
	}
	return fatbin.BuildELF(make([]byte, 2048), fatbin.BuildContainer(entries, 256))
}

// hipELF is a shared object whose .hip_fatbin holds one bundle with code
// objects for the targets listed ("gfx90a:xnack- gfx942").
func hipELF(t testing.TB, list string) []byte {
	t.Helper()
	ents := []offload.BundleEntry{{ID: "host-x86_64-unknown-linux-gnu-"}}
	for _, w := range strings.Fields(list) {
		ents = append(ents, offload.BundleEntry{ID: "hipv4-amdgcn-amd-amdhsa--" + w, Object: []byte("\x7fELF code object for " + w)})
	}
	return offload.BuildELF(make([]byte, 2048), offload.BuildBundle(ents, 64))
}

const (
	// libnvjpeg.so.11.9.0.86 of Debian's libnvjpeg11 (CUDA 11.8).
	nvjpeg118 = "sm_35 sm_37 sm_50 sm_52 sm_60 sm_61 sm_70 sm_75 sm_80 sm_86 sm_89 sm_90 compute_90@7.8"
	// libnppicc.so.11.8.0.86 of Debian's libnppicc11 (CUDA 11.8).
	nppicc118 = "sm_35 sm_50 sm_60 sm_61 sm_70 sm_75 sm_80 sm_86 sm_89 sm_90 compute_90@7.8"
	// libggml-cuda.so of @node-llama-cpp/linux-x64-cuda 3.22.1 (CUDA 13.1).
	ggml131 = "sm_86 sm_89 sm_120a sm_121a compute_75@9.1 compute_80@9.1 compute_90@9.1"
	// libgputomo.cpython-311-x86_64-linux-gnu.so of Debian's
	// python3-pyhst2-cuda 2020c-7: PTX only, ISA 7.7 (CUDA 11.7).
	pyhst2 = "compute_50@7.7 compute_60@7.7 compute_70@7.7 compute_80@7.7"
	// libmagma_sparse.so.2 of Debian's libmagma-sparse2 2.6.2-1 (ISA 7.4).
	magma = "sm_60 sm_70 sm_75 sm_80 compute_80@7.4"
	// librocrand.so.1.1 of Debian's librocrand1 5.3.3 (ROCm 5.x; Debian's
	// librocsparse.so.0.1 has the same targets).
	rocrand53 = "gfx1030 gfx803 gfx900:xnack- gfx906:xnack- gfx908:xnack- gfx90a:xnack+ gfx90a:xnack-"
	// A ROCm 6.2 rocBLAS-shaped library: the targets AMD's 6.2 packages
	// build (ROCm 6.2 release notes, supported GPUs; no gfx906).
	rocblas62 = "gfx908:xnack- gfx90a:xnack+ gfx90a:xnack- gfx942:xnack- gfx942:xnack+ gfx1030 gfx1100 gfx1101"
	// A ROCm 7 build with generic targets (AMDGPUUsage, generic processors).
	generic7 = "gfx9-4-generic:xnack- gfx11-generic gfx10-3-generic"
)

// realFiles are the real files the matrix's code lists were read from,
// under scripts/realbin.sh's cache.
var realFiles = map[string]string{
	nvjpeg118: "root/libnvjpeg11/usr/lib/x86_64-linux-gnu/libnvjpeg.so.11.9.0.86",
	nppicc118: "root/libnppicc11/usr/lib/x86_64-linux-gnu/libnppicc.so.11.8.0.86",
	ggml131:   "npm/node-llama-cpp-linux-x64-cuda-3.22.1/package/bins/linux-x64-cuda/libggml-cuda.so",
	pyhst2:    "root/python3-pyhst2-cuda/usr/lib/python3/dist-packages/PyHST2_2020c/libgputomo.cpython-311-x86_64-linux-gnu.so",
	magma:     "root/libmagma-sparse2/usr/lib/libmagma_sparse.so.2",
	rocrand53: "root/librocrand1/usr/lib/x86_64-linux-gnu/librocrand.so.1.1",
	"cudart":  "root/libcudart11.0/usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89",
	"hip":     "root/libamdhip64-5/usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.21153",
}

// realOr is the body of the real file a code list was read from, when the
// test setup fetched it (KILN_REALBIN), and otherwise an ELF built to hold
// exactly that code (TestMatrixCodeIsReal checks the two agree).
func realOr(t testing.TB, list string, build func(testing.TB, string) []byte) []byte {
	if dir := os.Getenv("KILN_REALBIN"); dir != "" {
		b, err := os.ReadFile(filepath.Join(dir, realFiles[list]))
		if err != nil {
			t.Fatalf("KILN_REALBIN is set but the test setup did not fetch it: %v", err)
		}
		return b
	}
	return build(t, list)
}

func noCode(testing.TB, string) []byte { return fatbin.BuildELF(make([]byte, 4096), nil) }

func matrixImages(t *testing.T) map[string]imagetest.Spec {
	lib := "usr/lib/x86_64-linux-gnu/"
	return map[string]imagetest.Spec{
		// Debian's CUDA 11.8 libraries: libcudart.so.11.8.89 says the runtime.
		"m-debian-cuda118": {Extra: [][]imagetest.File{{
			{Path: lib + "libcudart.so.11.8.89", Body: realOr(t, "cudart", noCode)},
			{Path: lib + "libnvjpeg.so.11.9.0.86", Body: realOr(t, nvjpeg118, codeELF)},
			{Path: lib + "libnppicc.so.11.8.0.86", Body: realOr(t, nppicc118, codeELF)},
		}}},
		// llama.cpp's CUDA 13.1 backend as a Node.js package: no runtime
		// in the image, the PTX ISA says the toolkit; the file's name is
		// not a library name kiln knows and its mode is not executable.
		"m-llama-cuda131": {Extra: [][]imagetest.File{{
			{Path: "app/node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda/libggml-cuda.so", Body: realOr(t, ggml131, codeELF)},
		}}},
		// A Python extension module with PTX only, and CUDA 11.8's runtime.
		"m-pyhst2": {Extra: [][]imagetest.File{{
			{Path: lib + "libcudart.so.11.8.89", Body: realOr(t, "cudart", noCode)},
			{Path: "usr/lib/python3/dist-packages/PyHST2_2020c/libgputomo.cpython-311-x86_64-linux-gnu.so", Body: realOr(t, pyhst2, codeELF)},
		}}},
		// MAGMA with PTX of ISA 7.4, declared CUDA 11.4.
		"m-magma": {Env: map[string]string{"CUDA_VERSION": "11.4.3"}, Extra: [][]imagetest.File{{
			{Path: "usr/lib/libmagma_sparse.so.2", Body: realOr(t, magma, codeELF)},
		}}},
		// Debian's ROCm 5 libraries with HIP 5.2 (libamdhip64.so.5.2.21153:
		// 21153 is a build number, not a patch level).
		"m-debian-rocm5": {Extra: [][]imagetest.File{{
			{Path: lib + "libamdhip64.so.5.2.21153", Body: realOr(t, "hip", noCode)},
			{Path: lib + "librocrand.so.1.1", Body: realOr(t, rocrand53, hipELF)},
		}}},
		// ROCm 6.2 with rocBLAS-shaped code objects.
		"m-rocm62": {ROCm: "6.2.0", Extra: [][]imagetest.File{{
			{Path: "opt/rocm-6.2.0/lib/librocblas.so.4.2", Body: hipELF(t, rocblas62)},
		}}},
		// The same with HSA_XNACK=1 in the image's environment.
		"m-rocm62-xnack": {ROCm: "6.2.0", Env: map[string]string{"HSA_XNACK": "1"}, Extra: [][]imagetest.File{{
			{Path: "opt/rocm-6.2.0/lib/librocblas.so.4.2", Body: hipELF(t, rocblas62)},
		}}},
		// ROCm 7.0 with generic targets only.
		"m-rocm70-generic": {ROCm: "7.0.0", Extra: [][]imagetest.File{{
			{Path: "opt/rocm-7.0.0/lib/libapp.so", Body: hipELF(t, generic7)},
		}}},
	}
}

// mnode is a node of one GPU model (as nvidia-smi or rocm-smi prints it)
// on a driver; the catalogue fills the compute capability or gfx target.
func mnode(vendor, model, driver string) *snapshot.Snapshot {
	s := &snapshot.Snapshot{Host: snapshot.Host{Hostname: model + "-" + driver, Arch: "x86_64"}}
	s.GPUs = []snapshot.GPU{{Index: 0, Vendor: vendor, Model: model}}
	if vendor == snapshot.VendorNVIDIA {
		s.Drivers.NVIDIAUser = driver
	} else {
		s.Drivers.AMDGPU = driver
	}
	kb.Default().Annotate(s)
	return s
}

func TestVerdictMatrix(t *testing.T) {
	specs := matrixImages(t)
	all := pushAndScan(t, specs)
	nv, amd := snapshot.VendorNVIDIA, snapshot.VendorAMD
	for _, tc := range []struct {
		image, vendor, model, driver string
		want                         compat.Verdict
		rule                         string
		// every string must occur in the reasons or the fix.
		reasons []string
	}{
		// Debian's CUDA 11.8 libraries.
		{"m-debian-cuda118", nv, "Tesla P100-PCIE-16GB", "470.82.01", compat.Runs, "MINOR: 11.8 on a 470 driver (>= 450.80.02); SASS sm_60 on 6.0", []string{"minor-version compatibility"}},
		{"m-debian-cuda118", nv, "NVIDIA GeForce GTX 1080", "535.104.05", compat.Runs, "SASS: sm_61 (nvJPEG, NPP)", nil},
		{"m-debian-cuda118", nv, "Tesla V100-SXM2-32GB", "535.104.05", compat.Runs, "SASS: sm_70", nil},
		{"m-debian-cuda118", nv, "Tesla T4", "460.32.03", compat.Runs, "MINOR: 460 >= 450.80.02; SASS: sm_75", []string{"minor-version compatibility"}},
		{"m-debian-cuda118", nv, "Tesla T4", "440.33.01", compat.Fails, "DRV: 11.8 needs >= 450.80.02", []string{"supports CUDA up to 10.2"}},
		{"m-debian-cuda118", nv, "NVIDIA A100-SXM4-80GB", "525.85.12", compat.Runs, "SASS: sm_80", nil},
		{"m-debian-cuda118", nv, "NVIDIA GeForce RTX 3090", "590.44.01", compat.Runs, "SASS: sm_86", nil},
		{"m-debian-cuda118", nv, "NVIDIA L40S", "550.54.15", compat.Runs, "SASS: sm_89", nil},
		{"m-debian-cuda118", nv, "NVIDIA H100 80GB HBM3", "550.54.15", compat.Runs, "SASS: sm_90", nil},
		{"m-debian-cuda118", nv, "NVIDIA B200", "570.124.06", compat.RunsViaJIT, "SASS none for 10.0; PTX compute_90 ISA 7.8 <= 570's", []string{"compute_90 (PTX ISA 7.8)", "JIT cache"}},
		{"m-debian-cuda118", nv, "NVIDIA GeForce RTX 5090", "575.51.03", compat.RunsViaJIT, "PTX compute_90 JIT for 12.0", nil},
		// llama.cpp's CUDA 13.1 backend.
		{"m-llama-cuda131", nv, "NVIDIA GeForce RTX 3090", "590.44.01", compat.Runs, "SASS: sm_86", nil},
		{"m-llama-cuda131", nv, "NVIDIA GeForce RTX 3090", "580.65.06", compat.Runs, "MINOR: 13.1 on 580; SASS sm_86 needs no JIT", []string{"minor-version compatibility"}},
		{"m-llama-cuda131", nv, "NVIDIA GeForce RTX 3090", "550.54.15", compat.Fails, "DRV: a CUDA 13.1 build on a 12.4 driver", []string{"built by CUDA 13.1", "supports CUDA up to 12.4"}},
		{"m-llama-cuda131", nv, "NVIDIA L40S", "580.95.05", compat.Runs, "SASS: sm_89", nil},
		{"m-llama-cuda131", nv, "NVIDIA A100-SXM4-80GB", "590.48.01", compat.RunsViaJIT, "PTX compute_80 ISA 9.1 on a 590 driver", []string{"compute_80 (PTX ISA 9.1)"}},
		{"m-llama-cuda131", nv, "NVIDIA A100-SXM4-80GB", "580.65.06", compat.Fails, "PTX: ISA 9.1 needs the CUDA 13.1 driver (590.44.01); minor-version compatibility does not cover PTX",
			[]string{"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "PTX ISA up to 9.0", ">= 590.44.01"}},
		{"m-llama-cuda131", nv, "NVIDIA H100 80GB HBM3", "580.82.07", compat.Fails, "PTX: compute_90 ISA 9.1 on a 580 driver", []string{"CUDA_ERROR_UNSUPPORTED_PTX_VERSION"}},
		{"m-llama-cuda131", nv, "NVIDIA H100 80GB HBM3", "590.44.01", compat.RunsViaJIT, "PTX compute_90 on 9.0", nil},
		{"m-llama-cuda131", nv, "NVIDIA B200", "590.44.01", compat.RunsViaJIT, "SASS sm_120a is not for 10.0; PTX compute_90 JIT", nil},
		{"m-llama-cuda131", nv, "NVIDIA GeForce RTX 5090", "590.44.01", compat.Runs, "SASS: sm_120a on exactly 12.0", nil},
		{"m-llama-cuda131", nv, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "590.44.01", compat.Runs, "SASS: sm_120a on 12.0", nil},
		{"m-llama-cuda131", nv, "NVIDIA GB10", "590.44.01", compat.Runs, "SASS: sm_121a on exactly 12.1", nil},
		{"m-llama-cuda131", nv, "Tesla T4", "590.44.01", compat.RunsViaJIT, "PTX compute_75 on 7.5", nil},
		{"m-llama-cuda131", nv, "Tesla V100-PCIE-32GB", "590.44.01", compat.Fails, "DROP: CUDA 13 has no Volta", []string{"CUDA 13 dropped Volta"}},
		{"m-llama-cuda131", nv, "Tesla P100-PCIE-16GB", "590.44.01", compat.Fails, "DROP: CUDA 13 has no Pascal", []string{"CUDA 13 dropped Pascal"}},
		{"m-llama-cuda131", nv, "NVIDIA Graphics Device", "590.44.01", compat.Unknown, "ANY: a GPU kiln cannot name has no known capability", []string{"does not know the compute capability", "gpus.yaml"}},
		// PTX only, ISA 7.7 (CUDA 11.7): the driver decides.
		{"m-pyhst2", nv, "NVIDIA A100-SXM4-40GB", "470.82.01", compat.Fails, "PTX: ISA 7.7 needs 515.43.04; 470 compiles up to 7.4", []string{"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", ">= 515.43.04"}},
		{"m-pyhst2", nv, "NVIDIA A100-SXM4-40GB", "525.85.12", compat.RunsViaJIT, "PTX compute_80 ISA 7.7 on 525", nil},
		{"m-pyhst2", nv, "Tesla T4", "460.32.03", compat.Fails, "PTX: ISA 7.7 on a 460 driver", []string{"CUDA_ERROR_UNSUPPORTED_PTX_VERSION"}},
		{"m-pyhst2", nv, "NVIDIA GeForce RTX 3090", "535.104.05", compat.RunsViaJIT, "PTX compute_80 for 8.6", nil},
		{"m-pyhst2", nv, "NVIDIA H100 80GB HBM3", "535.104.05", compat.RunsViaJIT, "PTX compute_80 for 9.0", nil},
		// MAGMA: SASS first, PTX when there is none.
		{"m-magma", nv, "NVIDIA GeForce RTX 3090", "470.82.01", compat.Runs, "SASS sm_80 on 8.6", nil},
		{"m-magma", nv, "NVIDIA GeForce RTX 3090", "460.32.03", compat.Fails, "DRV: CUDA_VERSION 11.4 makes the container runtime check cuda>=11.4; 460 is CUDA 11.2", []string{"unsatisfied condition: cuda>=11.4"}},
		{"m-magma", nv, "NVIDIA H100 80GB HBM3", "550.54.15", compat.RunsViaJIT, "PTX compute_80 ISA 7.4", nil},
		{"m-magma", nv, "Tesla P4", "470.82.01", compat.Runs, "SASS sm_60 on 6.1", nil},
		// Debian's ROCm 5 libraries.
		{"m-debian-rocm5", amd, "AMD Instinct MI50", "", compat.Unknown, "KMD: an unknown amdgpu driver; HIP: gfx906:xnack- with XNACK off (the default) matches", []string{"gfx906:xnack-", "amdgpu driver version is unknown"}},
		{"m-debian-rocm5", amd, "AMD Instinct MI50", "6.3.6", compat.Fails, "KMD: ROCm 6.0's driver supports user space 5.6-6.2, the image is 5.2", []string{"ROCm 5.2"}},
		{"m-debian-rocm5", amd, "AMD Instinct MI210", "6.3.6", compat.Fails, "KMD window, though HIP: gfx90a:xnack- matches", []string{"AMD supports with ROCm user space 5.6, 5.7, 6.0, 6.1, 6.2 only; the image has ROCm 5.2"}},
		{"m-debian-rocm5", amd, "AMD Instinct MI300X", "6.3.6", compat.Fails, "HIP: no gfx942 code object", []string{"no code object for gfx942", "hipErrorNoBinaryForGpu"}},
		// ROCm 6.2.
		{"m-rocm62", amd, "AMD Instinct MI300X", "6.3.6", compat.Runs, "HIP: gfx942:xnack-; KMD 6.0 supports 6.2", nil},
		{"m-rocm62", amd, "AMD Instinct MI210", "30.10.1", compat.Runs, "HIP: gfx90a:xnack-; KMD 30.10 supports 6.2", nil},
		{"m-rocm62", amd, "AMD Instinct MI210", "6.14.14", compat.Unknown, "ANY: amdgpu 6.14.14 is ROCm 7.0's, for which kiln has no support-matrix row", []string{"no row in kiln"}},
		{"m-rocm62", amd, "AMD Instinct MI100", "6.3.6", compat.Runs, "HIP: gfx908:xnack-", nil},
		{"m-rocm62", amd, "AMD Instinct MI50", "6.3.6", compat.Fails, "HIP: no gfx906 code object", []string{"no code object for gfx906"}},
		{"m-rocm62", amd, "AMD Radeon PRO W7900", "6.3.6", compat.Runs, "HIP: gfx1100 (no features)", nil},
		{"m-rocm62", amd, "AMD Radeon RX 6700 XT", "6.3.6", compat.Fails, "HIP: gfx1031 has no code object (gfx1030 is not it)", []string{"no code object for gfx1031"}},
		// HSA_XNACK=1 in the image turns XNACK on: the xnack+ code objects count.
		{"m-rocm62-xnack", amd, "AMD Instinct MI210", "30.10.1", compat.Runs, "HIP: gfx90a:xnack+ with XNACK on", []string{"gfx90a:xnack+", "HSA_XNACK=1"}},
		{"m-rocm62-xnack", amd, "AMD Instinct MI100", "6.3.6", compat.Fails, "HIP: gfx908 has xnack- code only, the image turns XNACK on", []string{"no code object for gfx908:xnack+"}},
		// ROCm 7.0 with generic targets.
		{"m-rocm70-generic", amd, "AMD Instinct MI300X", "30.10.1", compat.Runs, "HIP: gfx9-4-generic covers gfx942", nil},
		{"m-rocm70-generic", amd, "AMD Radeon RX 6700 XT", "30.10.1", compat.Runs, "HIP: gfx10-3-generic covers gfx1031", nil},
		{"m-rocm70-generic", amd, "AMD Instinct MI210", "30.10.1", compat.Fails, "HIP: no generic target covers gfx90a", []string{"no code object for gfx90a"}},
		{"m-rocm70-generic", amd, "AMD Instinct MI300X", "6.3.6", compat.Fails, "KMD: ROCm 6.0's driver does not support 7.0", []string{"ROCm 7.0"}},
		// Images on the other vendor.
		{"m-llama-cuda131", amd, "AMD Instinct MI300X", "30.10.1", compat.Fails, "a CUDA build has no ROCm stack", []string{"no ROCm stack"}},
		{"m-rocm62", nv, "NVIDIA H100 80GB HBM3", "550.54.15", compat.Fails, "a ROCm build has no CUDA stack", []string{"no CUDA stack"}},
	} {
		name := fmt.Sprintf("%s on %s %s", tc.image, tc.model, firstOr(tc.driver, "(driver unknown)"))
		t.Run(name, func(t *testing.T) {
			req := all[tc.image]
			s := mnode(tc.vendor, tc.model, tc.driver)
			nr := compat.Check(req, compat.Node{Name: name, Snapshot: s}, kb.Default())
			if len(nr.GPUs) != 1 {
				t.Fatalf("%d GPU verdicts", len(nr.GPUs))
			}
			g := nr.GPUs[0]
			text := strings.Join(append(append([]string{}, g.Reasons...), g.Fix...), "\n")
			if g.Verdict != tc.want {
				t.Errorf("verdict %s, want %s by rule %s\nreasons:\n%s\nfix:\n%s", g.Verdict, tc.want, tc.rule, text, strings.Join(g.Fix, "\n"))
			}
			for _, w := range tc.reasons {
				if !strings.Contains(text, w) {
					t.Errorf("reasons lack %q (rule %s):\n%s", w, tc.rule, text)
				}
			}
			if (g.Verdict == compat.Fails || g.Verdict == compat.Unknown) && len(g.Fix) == 0 {
				t.Errorf("a %s verdict names no fix: %s", g.Verdict, text)
			}
		})
	}
}

func firstOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestMatrixCodeIsReal checks that the matrix's code lists are those of
// the real files they are named after, read by kiln from the files the
// test setup fetches (scripts/realbin.sh; KILN_REALBIN names its cache).
func TestMatrixCodeIsReal(t *testing.T) {
	dir := os.Getenv("KILN_REALBIN")
	if dir == "" {
		t.Skip("KILN_REALBIN is not set: run scripts/realbin.sh and set KILN_REALBIN to its cache to check the matrix against real files")
	}
	for _, list := range []string{nvjpeg118, nppicc118, ggml131, pyhst2, magma, rocrand53} {
		tc := struct{ file, want string }{realFiles[list], list}
		t.Run(filepath.Base(tc.file), func(t *testing.T) {
			f, err := os.Open(filepath.Join(dir, tc.file))
			if err != nil {
				t.Fatalf("the test setup did not fetch it: %v", err)
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			if strings.HasPrefix(tc.want, "gfx") {
				res, err := new(offload.Scanner).Scan(f, st.Size())
				if err != nil {
					t.Fatal(err)
				}
				got = res.Names()
			} else {
				res, err := new(fatbin.Scanner).Scan(f, st.Size())
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range res.Codes {
					s := c.Name()
					if c.ISA != "" {
						s += "@" + c.ISA
					}
					got = append(got, s)
				}
			}
			want := strings.Fields(tc.want)
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("kiln reads %v, the matrix says %v", got, want)
			}
		})
	}
}

// TestVersionsFromFiles: versions come from the files, never from a build
// number; when the image's labels say otherwise, the files decide and the
// disagreement is reported.
func TestVersionsFromFiles(t *testing.T) {
	lib := "usr/lib/x86_64-linux-gnu/"
	all := pushAndScan(t, map[string]imagetest.Spec{
		"v-cuda-conflict": {Env: map[string]string{"CUDA_VERSION": "12.4.1"}, Extra: [][]imagetest.File{{
			{Path: lib + "libcudart.so.11.8.89", Body: fatbin.BuildELF(make([]byte, 512), nil)},
		}}},
		"v-rocm-conflict": {ROCm: "6.1.2", Env: map[string]string{"ROCM_VERSION": "6.3.0"}},
		"v-dpkg": {Extra: [][]imagetest.File{{
			{Path: "var/lib/dpkg/status", Body: []byte("Package: libamdhip64-5\nStatus: install ok installed\nVersion: 5.2.3-8\nArchitecture: amd64\n\nPackage: bash\nStatus: install ok installed\nVersion: 5.2.15-2+b2\n")},
		}}},
		// ROCm libraries' kernel files: a code object (gfx90a, XNACK off:
		// EF_AMDGPU_MACH 0x3f, code object v4 feature bits 0x200) and a
		// Tensile file named by its target.
		"v-rocm-kernels": {ROCm: "6.2.0", Extra: [][]imagetest.File{{
			{Path: "opt/rocm-6.2.0/lib/rocblas/library/Kernels.so-000-gfx90a-xnack-.hsaco", Body: offload.BuildCodeObject(2, 0x3f|0x200, make([]byte, 256))},
			{Path: "opt/rocm-6.2.0/lib/rocblas/library/TensileLibrary_gfx942.dat", Body: []byte("msgpack")},
		}}},
		// An executable without the executable bit and without a library
		// name still counts.
		"v-any-elf": {Extra: [][]imagetest.File{{
			{Path: "opt/app/kernels.bin", Body: codeELF(t, "sm_80 compute_80@8.0")},
		}}},
	})
	for _, tc := range []struct {
		image, field, want, conflict string
	}{
		{"m-debian-rocm5", "rocm", "5.2", ""},
		{"v-cuda-conflict", "cuda", "11.8", "declares CUDA 12.4 (CUDA_VERSION) but holds the CUDA 11.8 runtime"},
		{"v-rocm-conflict", "rocm", "6.1.2", "declares ROCm 6.3.0 (ROCM_VERSION)"},
		{"v-dpkg", "rocm", "5.2", ""},
		{"m-llama-cuda131", "cuda", "13.1", ""},
	} {
		req := all[tc.image]
		if req == nil {
			req = pushAndScan(t, matrixImages(t))[tc.image]
		}
		req.Image = tc.image
		// Evaluate completes what needs the knowledge base: an image without
		// a runtime needs the toolkit its binaries were built with.
		compat.Evaluate([]*compat.Requirements{req}, []compat.Node{{Name: "n", Snapshot: mnode(snapshot.VendorNVIDIA, "NVIDIA H100 80GB HBM3", "590.44.01")}}, kb.Default())
		got := req.ROCm
		if tc.field == "cuda" {
			got = req.CUDA
		}
		if got != tc.want {
			t.Errorf("%s: %s %q (from %q), want %q", tc.image, tc.field, got, firstOr(req.ROCmFrom, req.CUDAFrom), tc.want)
		}
		conflicts := strings.Join(req.Conflicts, "\n")
		if tc.conflict != "" && !strings.Contains(conflicts, tc.conflict) || tc.conflict == "" && conflicts != "" {
			t.Errorf("%s: conflicts %q, want one with %q", tc.image, conflicts, tc.conflict)
		}
	}
	var gfx []string
	for _, b := range all["v-rocm-kernels"].Binaries {
		gfx = append(gfx, b.Path+"="+strings.Join(b.GFX, " "))
	}
	if want := "opt/rocm-6.2.0/lib/rocblas/library/Kernels.so-000-gfx90a-xnack-.hsaco=gfx90a:xnack- opt/rocm-6.2.0/lib/rocblas/library/TensileLibrary_gfx942.dat=gfx942"; strings.Join(gfx, " ") != want {
		t.Errorf("ROCm kernel files read as %q, want %q", gfx, want)
	}
	if b := all["v-any-elf"].Binaries; len(b) != 1 || b[0].Path != "opt/app/kernels.bin" || strings.Join(b[0].SASS, " ") != "sm_80" {
		t.Errorf("an ELF without a library name or mode: %+v", b)
	}
}
