package main

import (
	"encoding/json"
	"kiln.dev/kiln/compat/image"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/compat/imagetest"
)

const (
	capH100_535 = "../../testdata/captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"
	capH100_550 = "../../testdata/captures/nvidia-smi-summary/h100x8-550.90.07.txt"
	capRTX4090  = "../../testdata/captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt"
	capMI100    = "../../testdata/captures/rocm-smi/mi100-x4-rocm6.0.2-showall.json"
	fixHGX      = "../../testdata/fixtures/h100-hgx8-sysfs"
)

func pushTestImage(t *testing.T, reg *imagetest.Registry, repo string, spec imagetest.Spec) string {
	t.Helper()
	img, err := imagetest.Image(spec)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := imagetest.Push(reg.Host, repo, "1", img)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

type compatJSON struct {
	Requirements struct {
		Image      string   `json:"image"`
		CUDA       string   `json:"cuda"`
		CUDAFrom   string   `json:"cuda_from"`
		SASS       []string `json:"sass"`
		PTX        []string `json:"ptx"`
		Frameworks []struct {
			Name, Version, CUDA string
		} `json:"frameworks"`
	} `json:"requirements"`
	Nodes []struct {
		Node    string `json:"node"`
		Verdict string `json:"verdict"`
		GPUs    []struct {
			Index   int      `json:"index"`
			Verdict string   `json:"verdict"`
			Reasons []string `json:"reasons"`
			Fix     []string `json:"fix"`
		} `json:"gpus"`
	} `json:"nodes"`
	AllRun bool `json:"all_run"`
}

func TestCompatCommand(t *testing.T) {
	reg := imagetest.NewTestRegistry(t)
	cache := t.TempDir()
	torch := pushTestImage(t, reg, "team/torch", imagetest.Spec{
		CUDA: "11.8.89", Env: map[string]string{"CUDA_VERSION": "11.8.0", "NVIDIA_REQUIRE_CUDA": "cuda>=11.8"},
		Torch: "2.1.0+cu118", TorchCUDA: "11.8", TorchSASS: []int{80, 86}, TorchPTX: []int{86},
	})

	// JSON: every GPU verdict has verdict, reasons and fix; requirements are there.
	out, stderr, code := kiln(t, "compat", torch, "--insecure", "--cache-dir", cache, "--node", capH100_550, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d (runs via JIT counts as running); stderr %s", code, stderr)
	}
	var rep compatJSON
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Requirements.CUDA != "11.8" || len(rep.Requirements.Frameworks) == 0 || rep.Requirements.Frameworks[0].Version != "2.1.0+cu118" {
		t.Errorf("requirements: %+v", rep.Requirements)
	}
	if !strings.Contains(strings.Join(rep.Requirements.PTX, " "), "compute_86") {
		t.Errorf("PTX %v", rep.Requirements.PTX)
	}
	if len(rep.Nodes) != 1 || len(rep.Nodes[0].GPUs) != 8 {
		t.Fatalf("nodes %+v", rep.Nodes)
	}
	g := rep.Nodes[0].GPUs[0]
	if g.Verdict != "runs-via-jit" || len(g.Reasons) == 0 || len(g.Fix) == 0 {
		t.Errorf("H100 verdict %+v", g)
	}
	if !strings.Contains(strings.Join(g.Reasons, " "), "torch 2.1.0+cu118") {
		t.Errorf("reasons do not name torch: %q", g.Reasons)
	}

	// Two nodes, one failing: exit 1; text groups the eight identical GPUs.
	out, _, code = kiln(t, "compat", torch, "--insecure", "--cache-dir", cache,
		"--node", capH100_550, "--node", "../../testdata/captures/nvidia-smi-q/a100-sxm4-40gb-x8-azure-460.32.03.txt")
	if code != 1 {
		t.Errorf("exit %d, want 1 (fails on the 460 driver)", code)
	}
	text := string(out)
	for _, want := range []string{
		"image " + torch,
		"needs:      CUDA 11.8 (NVIDIA_REQUIRE_CUDA)",
		"frameworks: torch 2.1.0+cu118 (CUDA 11.8)",
		"GPUs 0-7 NVIDIA H100 80GB HBM3 (9.0): runs-via-jit",
		"3 layers (3 from cache)",
		"driver 460.32.03 supports CUDA up to 11.2; the image needs 11.8",
		"fix: upgrade the driver to >= 520.61.05",
		"The image does not run on every GPU checked.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}
	// The layer cache is on disk under the digests, beside the record of
	// the image that the server's fleet findings read.
	entries, _ := os.ReadDir(cache)
	if len(entries) != 4 {
		t.Errorf("cache holds %d entries, want 3 layers and images/", len(entries))
	}
	if recs, _, err := image.NewCache(cache).Images(); err != nil || len(recs) != 1 || len(recs[0].Layers) != 3 {
		t.Errorf("image records: %+v, %v", recs, err)
	}
}

func TestCompatForwardCompatAndVendors(t *testing.T) {
	reg := imagetest.NewTestRegistry(t)
	official := pushTestImage(t, reg, "nvidia/cuda", imagetest.Spec{
		CUDA: "12.4.127", CompatDriver: "550.54.15",
		Env: map[string]string{"CUDA_VERSION": "12.4.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536"},
	})
	rocm := pushTestImage(t, reg, "rocm/pytorch", imagetest.Spec{ROCm: "6.1.2", Torch: "2.3.0+rocm6.1", TorchHIP: "6.1.40091"})
	dir := t.TempDir()
	// A Snapshot written by kiln inventory -o json is a node too.
	snap, _, code := kiln(t, "inventory", "--from", fixHGX, "-o", "json")
	if code != 0 {
		t.Fatal("inventory failed")
	}
	snapPath := filepath.Join(dir, "hgx.json")
	os.WriteFile(snapPath, snap, 0o644)

	out, _, code := kiln(t, "compat", official, "--insecure", "--no-cache", "--node", snapPath, "--node", capRTX4090, "-o", "json")
	var rep compatJSON
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if code != 1 || rep.AllRun {
		t.Errorf("exit %d all_run %v, want 1/false", code, rep.AllRun)
	}
	if len(rep.Nodes) != 2 || rep.Nodes[0].Verdict != "runs-with-forward-compat" || rep.Nodes[1].Verdict != "fails" {
		t.Fatalf("verdicts %+v", rep.Nodes)
	}
	if !strings.Contains(strings.Join(rep.Nodes[1].GPUs[0].Reasons, " "), "forward compatibility works only on datacenter GPUs") {
		t.Errorf("RTX reasons %q", rep.Nodes[1].GPUs[0].Reasons)
	}

	// ROCm image on an NVIDIA node and on an AMD node (two capture files of one
	// node are joined by a comma).
	out, _, code = kiln(t, "compat", rocm, "--insecure", "--no-cache", "--node", capH100_535, "--node", capMI100, "-o", "json")
	rep = compatJSON{}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if code != 1 || rep.Nodes[0].Verdict != "fails" || rep.Nodes[1].Verdict != "runs" {
		t.Errorf("exit %d verdicts %s / %s", code, rep.Nodes[0].Verdict, rep.Nodes[1].Verdict)
	}
	if !strings.Contains(strings.Join(rep.Nodes[0].GPUs[0].Reasons, " "), "built for ROCm 6.1.2") {
		t.Errorf("NVIDIA node reasons %q", rep.Nodes[0].GPUs[0].Reasons)
	}
}

func TestCompatErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"compat", "oci:" + filepath.Join(dir, "nothing"), "--node", capH100_550}, "no such file"},
		{[]string{"compat", dir, "--node", capH100_550}, "not an OCI image layout"},
		{[]string{"compat", "Bad Ref!", "--node", capH100_550}, "neither a file"},
		{[]string{"compat", dir, "--node", filepath.Join(dir, "missing.txt")}, "--node"},
		{[]string{"compat", dir, "-o", "xml", "--node", capH100_550}, "-o xml"},
	} {
		_, stderr, code := kiln(t, tc.args...)
		if code != 3 {
			t.Errorf("%v: exit %d, want 3", tc.args, code)
		}
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: stderr %q lacks %q", tc.args, stderr, tc.want)
		}
	}
	if _, _, code := kiln(t, "compat"); code == 0 {
		t.Error("compat without an image succeeded")
	}
}
