package compat_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/image"
	"kiln.dev/kiln/compat/imagetest"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// requireClauses is NVIDIA_REQUIRE_CUDA the way nvidia/cuda images write
// it from 12.6 on (shared reference cuda-driver-compat.md, section 4): the
// cuda>= clause, then brand clauses admitting older driver branches through
// the forward-compatibility package.
func requireClauses(cuda string, branches ...int) string {
	brands := []string{"unknown", "grid", "tesla", "nvidia", "quadro", "quadrortx", "nvidiartx", "vapps", "vpc", "vcs", "vws", "cloudgaming"}
	parts := []string{"cuda>=" + cuda}
	for _, b := range branches {
		for _, br := range brands {
			parts = append(parts, fmt.Sprintf("brand=%s,driver>=%d,driver<%d", br, b, b+1))
		}
	}
	return strings.Join(parts, " ")
}

// images are built once, pushed to a real registry and read back by kiln.
var specs = map[string]imagetest.Spec{
	// nvidia/cuda:12.4.1-style image with the compat package and brand
	// clauses for the 470 and 535 branches.
	"cuda124-official": {CUDA: "12.4.127", CompatDriver: "550.54.15", CuDNN: "9.1.0", NCCL: "2.21.5", Env: map[string]string{
		"CUDA_VERSION": "12.4.1", "NVIDIA_REQUIRE_CUDA": requireClauses("12.4", 470, 535),
		"NV_CUDA_COMPAT_PACKAGE": "cuda-compat-12-4"}},
	// A third-party image that sets a bare requirement.
	"cuda124-plain": {CUDA: "12.4.127", Env: map[string]string{"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}},
	// An image that declares nothing: kiln reads libcudart's name.
	"cuda124-undeclared": {CUDA: "12.4.127"},
	// PyTorch 2.1.0+cu118 built for Ampere only, without and with PTX.
	"torch-ampere-noptx": {CUDA: "11.8.89", Env: map[string]string{"CUDA_VERSION": "11.8.0", "NVIDIA_REQUIRE_CUDA": "cuda>=11.8"},
		Torch: "2.1.0+cu118", TorchCUDA: "11.8", TorchSASS: []int{80, 86}},
	"torch-ampere-ptx": {CUDA: "11.8.89", Env: map[string]string{"CUDA_VERSION": "11.8.0", "NVIDIA_REQUIRE_CUDA": "cuda>=11.8"},
		Torch: "2.1.0+cu118", TorchCUDA: "11.8", TorchSASS: []int{80, 86}, TorchPTX: []int{86}},
	// A CUDA 13.0 image (its libraries target 7.5 and newer).
	"cuda130": {CUDA: "13.0.48", Env: map[string]string{"CUDA_VERSION": "13.0.0", "NVIDIA_REQUIRE_CUDA": requireClauses("13.0", 535, 550)}},
	// CUDA 11.8 images from the 11.x era admit 450/470/510/515 branches.
	"cuda118-compat": {CUDA: "11.8.89", CompatDriver: "520.61.05", Env: map[string]string{
		"CUDA_VERSION": "11.8.0", "NVIDIA_REQUIRE_CUDA": requireClauses("11.8", 450, 470, 510, 515)}},
	// A legacy image: CUDA_VERSION only.
	"cuda118-legacy": {CUDA: "11.8.89", Env: map[string]string{"CUDA_VERSION": "11.8.0"}},
	// CUDA 11.7 libraries: no toolkit before 11.8 targets Hopper.
	"cuda117": {CUDA: "11.7.99", CUDAArchs: []int{70, 75, 80, 86}, Env: map[string]string{"CUDA_VERSION": "11.7.1", "NVIDIA_REQUIRE_CUDA": "cuda>=11.7"}},
	// ROCm images (PyTorch ROCm wheels).
	"rocm61": {ROCm: "6.1.2", Torch: "2.3.0+rocm6.1", TorchHIP: "6.1.40091", Env: map[string]string{"ROCM_VERSION": "6.1.2"}},
	"rocm63": {ROCm: "6.3.0", Torch: "2.4.0+rocm6.3", TorchHIP: "6.3.42131"},
	// TensorFlow built with CUDA 12.3, no declared requirement.
	"tf-cuda123": {CUDA: "12.3.101", Extra: [][]imagetest.File{{{
		Path: "usr/local/lib/python3.10/dist-packages/tensorflow/python/platform/build_info.py",
		Body: []byte("import collections\nbuild_info = collections.OrderedDict([('cuda_version', '12.3'), ('cudnn_version', '8'), ('is_cuda_build', True), ('is_rocm_build', False)])\n")}}}},
	// A CPU-only image.
	"cpu-only": {},
}

var (
	scanMu  sync.Mutex
	scanned = map[string]*compat.Requirements{}
	regErr  error
)

// reqs pushes every image to a docker-registry started for the test
// package and reads them back through the registry.
func reqs(t *testing.T) map[string]*compat.Requirements {
	t.Helper()
	return pushAndScan(t, specs)
}

// pushAndScan builds, pushes and reads back the images of specs not read
// yet, and returns what kiln read of every image read so far.
func pushAndScan(t *testing.T, specs map[string]imagetest.Spec) map[string]*compat.Requirements {
	t.Helper()
	bin := imagetest.NeedRegistry(t)
	scanMu.Lock()
	defer scanMu.Unlock()
	if registry == nil && regErr == nil {
		dir, err := os.MkdirTemp("", "kiln-compat-registry-")
		if err == nil {
			registry, err = imagetest.StartRegistry(bin, dir)
		}
		regErr = err
	}
	if regErr != nil {
		t.Fatalf("compat integration tests need a real registry: %v", regErr)
	}
	cache := image.NewCache("")
	for name, spec := range specs {
		if scanned[name] != nil {
			continue
		}
		img, err := imagetest.Image(spec)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := imagetest.Push(registry.Host, "kiln/"+name, "test", img)
		if err != nil {
			t.Fatal(err)
		}
		opened, err := image.Open(context.Background(), ref, image.OpenOptions{Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		res, err := image.Scan(context.Background(), opened, image.ScanOptions{Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		scanned[name] = compat.FromScan(res)
	}
	return scanned
}

var registry *imagetest.Registry

func TestMain(m *testing.M) {
	code := m.Run()
	registry.Stop()
	os.Exit(code)
}

var (
	nodeMu sync.Mutex
	nodes  = map[string]*snapshot.Snapshot{}
)

// node loads a capture or fixture the way `kiln inventory --from` does.
func node(t *testing.T, rel string) *snapshot.Snapshot {
	t.Helper()
	nodeMu.Lock()
	defer nodeMu.Unlock()
	if s, ok := nodes[rel]; ok {
		return s
	}
	p := filepath.Join("..", "testdata", rel)
	var s *snapshot.Snapshot
	var err error
	if st, serr := os.Stat(p); serr == nil && st.IsDir() && discover.IsBundle(p) {
		s, err = discover.Replay(context.Background(), p)
	} else {
		s, err = capture.Load(context.Background(), p)
	}
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	kb.Default().Annotate(s)
	nodes[rel] = s
	return s
}

// withDriver is a copy of a node whose driver versions are replaced: for
// captures that lack the version (KFD topology) or to place a real GPU on
// another driver branch.
func withDriver(s *snapshot.Snapshot, nvidia, amdgpu string) *snapshot.Snapshot {
	c := *s
	c.Drivers.NVIDIAUser, c.Drivers.NVIDIAKernel, c.Drivers.CUDADriver, c.Drivers.AMDGPU = nvidia, "", "", amdgpu
	return &c
}

const (
	h100_535    = "captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"
	h100_550    = "captures/nvidia-smi-summary/h100x8-550.90.07.txt"
	hgxFixture  = "fixtures/h100-hgx8-sysfs"
	rtx4090_535 = "captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt"
	consumer2   = "fixtures/consumer2-nop2p"
	a100_460    = "captures/nvidia-smi-q/a100-sxm4-40gb-x8-azure-460.32.03.txt"
	a100mig_535 = "captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml"
	a10g_515    = "captures/nvidia-smi-q-xml/a10g-aws-515.105.01.xml"
	titanv_560  = "captures/nvidia-smi-q/titanv-560.35.03.txt"
	p2000_525   = "captures/nvidia-smi-q-xml/quadro-p2000-525.125.06.xml"
	pro6000_590 = "captures/nvidia-smi-q-xml/rtx-pro-6000-blackwell-maxq-590.44.01.xml"
	rtx3090_590 = "captures/nvidia-smi-q-xml/rtx3090-590.44.01.xml"
	l40s_550    = "fixtures/pcie4-downtrained-acs"
	gb200       = "captures/lspci/gb200-lspci.txt"
	mi300x      = "captures/kfd-topology/mi300x-x8-cpx.tar.gz"
	mi100       = "captures/rocm-smi/mi100-x4-rocm6.0.2-showall.json"
	rx6700xt    = "captures/rocm-smi/rx6700xt-rocm6.1.2-showall.json"
	mi50        = "captures/rocm-smi/mi50-rocm5.x-showall.json"
)

func TestVerdicts(t *testing.T) {
	all := reqs(t)
	for _, tc := range []struct {
		name  string
		image string
		node  string
		// amdgpu or nvidia replace the node's driver version when set.
		amdgpu, nvidia string
		want           compat.Verdict
		// every string must occur in the reasons (or fix, for fix).
		reasons, fix []string
	}{
		{name: "CUDA 12.4 bare requirement on 535 fails and names the driver", image: "cuda124-plain", node: h100_535, want: compat.Fails,
			reasons: []string{"driver 535.183.01 supports CUDA up to 12.2; the image needs 12.4", "refuses to start"},
			fix:     []string{"upgrade the driver to >= 550.54.14 or use a CUDA 12.2 build of the image"}},
		{name: "CUDA 12.4 official on datacenter H100 535 runs with forward compat", image: "cuda124-official", node: h100_535, want: compat.RunsForwardCompat,
			reasons: []string{"starts through its CUDA forward-compatibility package (compat/libcuda.so.550.54.15)", "brand=tesla,driver>=535,driver<536", "H100-SXM5-80GB"}},
		{name: "CUDA 12.4 official on HGX fixture runs with forward compat", image: "cuda124-official", node: hgxFixture, want: compat.RunsForwardCompat,
			reasons: []string{"datacenter GPUs such as H100-SXM5-80GB may use forward compatibility"}},
		{name: "CUDA 12.4 official on consumer RTX 4090 535 fails: no forward compat", image: "cuda124-official", node: rtx4090_535, want: compat.Fails,
			reasons: []string{"driver 535.154.05 supports CUDA up to 12.2", "forward compatibility works only on datacenter GPUs and RTX-4090 is a consumer GPU"},
			fix:     []string{">= 550.54.14"}},
		{name: "CUDA 12.4 official on consumer fixture fails", image: "cuda124-official", node: consumer2, want: compat.Fails,
			reasons: []string{"only for brand", "consumer GPU"}},
		{name: "CUDA 12.4 official on H100 550 runs", image: "cuda124-official", node: h100_550, want: compat.Runs,
			reasons: []string{"driver 550.90.07 supports CUDA 12.4"}},
		{name: "CUDA 12.4 official on L40S 550 fixture runs", image: "cuda124-official", node: l40s_550, want: compat.Runs},
		{name: "CUDA 12.4 official on Quadro P2000 525 fails (branch not admitted)", image: "cuda124-official", node: p2000_525, want: compat.Fails,
			reasons: []string{"driver 525.125.06 supports CUDA up to 12.0"}},
		{name: "CUDA 12.4 official on A100 460 fails; compat branches named", image: "cuda124-official", node: a100_460, want: compat.Fails,
			reasons: []string{"supports CUDA up to 11.2"}, fix: []string{"driver branch the image's forward-compatibility clauses admit for this GPU (470, 535)"}},
		{name: "undeclared CUDA 12.4 on 535 runs under minor-version compatibility", image: "cuda124-undeclared", node: rtx4090_535, want: compat.Runs,
			reasons: []string{"minor-version compatibility", "libcudart.so.12.4.127"}},
		{name: "undeclared CUDA 12.4 on 460 fails", image: "cuda124-undeclared", node: a100_460, want: compat.Fails,
			reasons: []string{"could run it with the CUDA forward-compatibility package, which the image does not carry"}},
		{name: "PyTorch sm_80/sm_86 without PTX on H100 fails", image: "torch-ampere-noptx", node: h100_550, want: compat.Fails,
			reasons: []string{"torch 2.1.0+cu118", "has sm_80 sm_86 and no PTX", "no kernel image is available for execution on the device"},
			fix:     []string{"sm_90"}},
		{name: "PyTorch sm_80/sm_86 with PTX on H100 runs via JIT", image: "torch-ampere-ptx", node: h100_550, want: compat.RunsViaJIT,
			reasons: []string{"has sm_80 sm_86 and PTX compute_86 (PTX ISA 7.8)", "only through JIT compilation of PTX", "a start-up delay", "JIT cache"}},
		{name: "PyTorch Ampere build on A100 runs", image: "torch-ampere-noptx", node: a100mig_535, want: compat.Runs},
		{name: "PyTorch sm_86 SASS runs on Ada 8.9", image: "torch-ampere-noptx", node: rtx4090_535, want: compat.Runs},
		{name: "PyTorch Ampere build on GB200 fails", image: "torch-ampere-ptx", node: gb200, want: compat.Fails,
			reasons: []string{"driver version is unknown", "no PTX the driver can compile"}},
		{name: "PyTorch cu118 on A100 460 fails on the driver", image: "torch-ampere-ptx", node: a100_460, want: compat.Fails,
			reasons: []string{"supports CUDA up to 11.2; the image needs 11.8"}},
		{name: "CUDA 13 image on Volta (TITAN V, 560) fails: architecture dropped", image: "cuda130", node: titanv_560, want: compat.Fails,
			reasons: []string{"CUDA 13 dropped Volta (compute capability 7.0)"}, fix: []string{"use a CUDA 12.x build"}},
		{name: "CUDA 13 image on Volta with a 580 driver still fails", image: "cuda130", node: titanv_560, nvidia: "580.65.06", want: compat.Fails,
			reasons: []string{"CUDA 13 dropped Volta"}},
		{name: "CUDA 13 image on Blackwell RTX PRO 6000 590 runs", image: "cuda130", node: pro6000_590, want: compat.Runs},
		{name: "CUDA 13 image on RTX 3090 590 runs", image: "cuda130", node: rtx3090_590, want: compat.Runs},
		{name: "CUDA 13 image on H100 535 runs with forward compat", image: "cuda130", node: h100_535, want: compat.RunsForwardCompat,
			reasons: []string{"kiln found no compat/libcuda.so in the image"}},
		{name: "CUDA 13 image on RTX 4090 535 fails", image: "cuda130", node: rtx4090_535, want: compat.Fails},
		{name: "CUDA 11.8 era image on A10G 515 runs with forward compat", image: "cuda118-compat", node: a10g_515, want: compat.RunsForwardCompat,
			reasons: []string{"driver 515.105.01 supports CUDA up to 11.7", "brand=tesla,driver>=515,driver<516"}},
		{name: "CUDA 11.8 era image on A100 460 fails", image: "cuda118-compat", node: a100_460, want: compat.Fails,
			fix: []string{"(450, 470, 510, 515)"}},
		{name: "legacy CUDA_VERSION image is checked as cuda>=11.8", image: "cuda118-legacy", node: a10g_515, want: compat.Fails,
			reasons: []string{"(CUDA_VERSION)", "refuses to start"}},
		{name: "CUDA 11.7 libraries on H100 fail: no sm_90, no PTX", image: "cuda117", node: h100_550, want: compat.Fails,
			reasons: []string{"has sm_70 sm_75 sm_80 sm_86 and no PTX: no sm_90 code and no PTX the driver can compile"}},
		{name: "TensorFlow CUDA 12.3 on 535 runs under minor-version compatibility", image: "tf-cuda123", node: rtx4090_535, want: compat.Runs,
			reasons: []string{"minor-version compatibility"}},
		{name: "TensorFlow CUDA 12.3 on 460 fails", image: "tf-cuda123", node: a100_460, want: compat.Fails},
		{name: "ROCm image on an NVIDIA node fails", image: "rocm61", node: h100_550, want: compat.Fails,
			reasons: []string{"built for ROCm 6.1.2 (AMD GPUs) and has no CUDA stack"}, fix: []string{"use a CUDA build"}},
		{name: "CUDA image on an AMD node fails", image: "cuda124-official", node: mi300x, amdgpu: "6.3.6", want: compat.Fails,
			reasons: []string{"built for CUDA 12.4 (NVIDIA GPUs) and has no ROCm stack"}, fix: []string{"use a ROCm build"}},
		{name: "ROCm 6.1 on MI300X with a ROCm 6.0 driver runs", image: "rocm61", node: mi300x, amdgpu: "6.3.6", want: compat.Runs,
			reasons: []string{"ROCm 6.1.2 supports gfx942", "amdgpu driver 6.3.6 (ROCm 6.0) supports ROCm 6.1 user space"}},
		{name: "ROCm 6.3 on MI300X outside the driver's window fails", image: "rocm63", node: mi300x, amdgpu: "6.3.6", want: compat.Fails,
			reasons: []string{"amdgpu driver 6.3.6 belongs to ROCm 6.0, which AMD supports with ROCm user space 5.6, 5.7, 6.0, 6.1, 6.2 only; the image has ROCm 6.3.0"},
			fix:     []string{"upgrade the amdgpu driver to that of ROCm 6.1, 6.2, 6.3, 6.4, 30.10, or use an image with ROCm 5.6"}},
		{name: "ROCm 6.3 on MI300X with an unknown driver version is unknown, never runs", image: "rocm63", node: mi300x, want: compat.Unknown,
			reasons: []string{"amdgpu driver version is unknown"}, fix: []string{"/sys/module/amdgpu/version"}},
		{name: "ROCm 6.1 on MI100 runs", image: "rocm61", node: mi100, want: compat.Runs},
		{name: "ROCm 6.1 on RX 6700 XT (gfx1031) fails", image: "rocm61", node: rx6700xt, want: compat.Fails,
			reasons: []string{"ROCm 6.1.2 does not support gfx1031"}},
		{name: "ROCm 6.1 on MI50 (gfx906) fails", image: "rocm61", node: mi50, want: compat.Fails,
			reasons: []string{"does not support gfx906", "cannot tell which ROCm release amdgpu driver 5.9.17 belongs to"}},
		{name: "CPU-only image runs on NVIDIA", image: "cpu-only", node: h100_535, want: compat.Runs,
			reasons: []string{"no GPU requirement kiln recognises"}},
		{name: "CPU-only image runs on AMD", image: "cpu-only", node: mi100, want: compat.Runs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := all[tc.image]
			if req == nil {
				t.Fatalf("no image %q", tc.image)
			}
			s := node(t, tc.node)
			if tc.amdgpu != "" || tc.nvidia != "" {
				s = withDriver(s, tc.nvidia, tc.amdgpu)
			}
			nr := compat.Check(req, compat.Node{Name: tc.node, Snapshot: s}, kb.Default())
			if len(nr.GPUs) == 0 {
				t.Fatalf("no GPU verdicts: %+v", nr)
			}
			g := nr.GPUs[0]
			text := strings.Join(g.Reasons, "\n")
			fix := strings.Join(g.Fix, "\n")
			if g.Verdict != tc.want {
				t.Errorf("verdict %s, want %s\nreasons:\n%s\nfix:\n%s", g.Verdict, tc.want, text, fix)
			}
			for _, w := range tc.reasons {
				if !strings.Contains(text, w) {
					t.Errorf("reasons lack %q:\n%s", w, text)
				}
			}
			for _, w := range tc.fix {
				if !strings.Contains(fix, w) {
					t.Errorf("fix lacks %q:\n%s", w, fix)
				}
			}
			if g.Verdict == compat.Fails && len(g.Fix) == 0 {
				t.Errorf("a failing verdict names no fix: %s", text)
			}
			// Every GPU of one model on the node gets the same verdict.
			for _, o := range nr.GPUs {
				if o.Model == g.Model && o.Verdict != g.Verdict {
					t.Errorf("GPU %d (%s) %s, GPU 0 %s", o.Index, o.Model, o.Verdict, g.Verdict)
				}
			}
			if nr.Verdict != g.Verdict {
				t.Errorf("node verdict %s, GPU verdict %s", nr.Verdict, g.Verdict)
			}
		})
	}
}

func TestRequirementsRead(t *testing.T) {
	all := reqs(t)
	off := all["cuda124-official"]
	if off.CUDA != "12.4" || off.CUDAFrom != "NVIDIA_REQUIRE_CUDA" || off.CompatDriver != "550.54.15" || off.CuDNN != "9.1.0" || off.NCCL != "2.21.5" {
		t.Errorf("official image read as cuda %q from %q, compat %q, cudnn %q, nccl %q", off.CUDA, off.CUDAFrom, off.CompatDriver, off.CuDNN, off.NCCL)
	}
	if !slices.Contains(off.SASS, "sm_90") || !slices.Contains(off.SASS, "sm_70") {
		t.Errorf("official image SASS %v", off.SASS)
	}
	torch := all["torch-ampere-ptx"]
	var fw *compat.Framework
	for i := range torch.Frameworks {
		if torch.Frameworks[i].Name == "torch" {
			fw = &torch.Frameworks[i]
		}
	}
	if fw == nil || fw.Version != "2.1.0+cu118" || fw.CUDA != "11.8" || !strings.HasSuffix(fw.Path, "torch/version.py") {
		t.Errorf("torch read as %+v", fw)
	}
	var torchLib *compat.Binary
	for i := range torch.Binaries {
		if strings.HasSuffix(torch.Binaries[i].Path, "libtorch_cuda.so") {
			torchLib = &torch.Binaries[i]
		}
	}
	if torchLib == nil || !slices.Equal(torchLib.SASS, []string{"sm_80", "sm_86"}) || len(torchLib.PTX) != 1 || torchLib.PTX[0] != (compat.PTXCode{Target: "compute_86", ISA: "7.8", CUDA: "11.8"}) {
		t.Errorf("libtorch_cuda.so read as %+v", torchLib)
	}
	rocm := all["rocm61"]
	if rocm.ROCm != "6.1.2" || !rocm.HasROCm() || rocm.HasCUDA() {
		t.Errorf("rocm image: rocm %q from %q, cuda %v", rocm.ROCm, rocm.ROCmFrom, rocm.HasCUDA())
	}
	if l := all["cuda124-undeclared"]; l.CUDA != "12.4" || l.CUDAFrom != "libcudart.so.12.4.127" {
		t.Errorf("undeclared image: %q from %q", l.CUDA, l.CUDAFrom)
	}
	if tf := all["tf-cuda123"]; tf.CUDA != "12.3" {
		t.Errorf("tensorflow image CUDA %q", tf.CUDA)
	}
	if c := all["cpu-only"]; c.HasCUDA() || c.HasROCm() {
		t.Errorf("cpu-only image has a GPU stack: %+v", c)
	}
}

func TestEvaluateExitCode(t *testing.T) {
	all := reqs(t)
	req := all["cuda124-official"]
	ok := compat.Evaluate([]*compat.Requirements{req}, []compat.Node{
		{Name: "h100-550", Snapshot: node(t, h100_550)},
		{Name: "h100-535", Snapshot: node(t, h100_535)},
	}, kb.Default())
	if !ok.AllRun || ok.ExitCode() != 0 {
		t.Errorf("runs everywhere (one with forward compat): all_run %v exit %d", ok.AllRun, ok.ExitCode())
	}
	bad := compat.Evaluate([]*compat.Requirements{req}, []compat.Node{
		{Name: "h100-550", Snapshot: node(t, h100_550)},
		{Name: "rtx4090", Snapshot: node(t, rtx4090_535)},
	}, kb.Default())
	if bad.AllRun || bad.ExitCode() != 1 {
		t.Errorf("fails on the RTX node: all_run %v exit %d", bad.AllRun, bad.ExitCode())
	}
	if bad.Nodes[1].Verdict != compat.Fails || len(bad.Nodes[1].GPUs) != 8 {
		t.Errorf("rtx node: %s with %d GPUs", bad.Nodes[1].Verdict, len(bad.Nodes[1].GPUs))
	}
}
