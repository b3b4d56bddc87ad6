package serving_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/require"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/plan"
	"kiln.dev/kiln/serving"
	"kiln.dev/kiln/snapshot"
)

// load reads a recorded machine as kiln inventory --from does.
func load(t *testing.T, rel string) *snapshot.Snapshot {
	t.Helper()
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
	return s
}

// onDriver is a copy of a node on another NVIDIA driver.
func onDriver(s *snapshot.Snapshot, v string) *snapshot.Snapshot {
	c := *s
	c.Drivers.NVIDIAUser, c.Drivers.NVIDIAKernel, c.Drivers.CUDADriver = v, v, ""
	return &c
}

func model(t *testing.T, name string) serving.Model {
	t.Helper()
	m, ok := plan.ModelByName(name)
	if !ok {
		t.Fatalf("plan knows no %s", name)
	}
	return serving.Model{Name: name, Format: serving.FormatSafetensors, Arch: &m}
}

func catalogue(t *testing.T) *serving.Catalogue {
	t.Helper()
	c, err := serving.Default()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const (
	hgx     = "fixtures/h100-hgx8-sysfs"                                  // 8 x H100 SXM, NVSwitch, driver 535
	rtx4090 = "captures/nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt" // 8 x 24 GB on PCIe
	mi300x  = "captures/kfd-topology/mi300x-x8-cpx.tar.gz"
)

// A 70B model in bf16 does not fit one 80 GB GPU: it gets tensor
// parallelism over GPUs of one NVLink island, the fewest that hold it.
func TestChooseShardsInsideAnIsland(t *testing.T) {
	nodes := []serving.Node{{Name: "hgx", Snapshot: onDriver(load(t, hgx), "550.90.07")}}
	out, err := serving.Choose(model(t, "llama3-70b"), serving.Request{}, nodes, catalogue(t), kb.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := out.Best
	t.Logf("best: %s %s on %s, %d GPUs %v (%s), %.1f of %.1f GB a GPU; skipped: %q", b.Engine, b.Image, b.Node, b.GPUs, b.Island, b.Link, b.MemoryPerGPUBytes/1e9, b.CapacityBytes/1e9, out.Skipped)
	if b.GPUs < 2 || b.GPUs > 4 || b.Link != "NVLink" || len(b.Island) != b.GPUs {
		t.Fatalf("best: %d GPUs %v over %q", b.GPUs, b.Island, b.Link)
	}
	if b.MemoryPerGPUBytes > b.CapacityBytes || b.MemoryPerGPUBytes < 140e9/float64(b.GPUs) {
		t.Errorf("memory per GPU %.0f of %.0f: the weights alone are 140 GB", b.MemoryPerGPUBytes, b.CapacityBytes)
	}
	// Fewer GPUs would not hold it: the same model asked on one GPU is
	// refused with the sizes.
	_, err = serving.Choose(model(t, "llama3-70b"), serving.Request{GPUs: 1}, nodes, catalogue(t), kb.Default(), nil)
	var ref *serving.Refusal
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("on one GPU: %v", err)
	}
	// An 8B model takes one GPU.
	small, err := serving.Choose(model(t, "llama3-8b"), serving.Request{}, nodes, catalogue(t), kb.Default(), nil)
	if err != nil || small.Best.GPUs != 1 {
		t.Errorf("8B: %+v, %v", small, err)
	}
}

// An engine image whose CUDA needs a newer driver is skipped with the
// reason, and an older image of the same engine is taken; on a driver too
// old for every image, each is named.
func TestChooseSkipsImagesTheDriverCannotRun(t *testing.T) {
	nodes := []serving.Node{{Name: "hgx", Snapshot: onDriver(load(t, hgx), "550.90.07")}}
	out, err := serving.Choose(model(t, "llama3-8b"), serving.Request{Engine: "vllm"}, nodes, catalogue(t), kb.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.Best.Image != "docker.io/vllm/vllm-openai:v0.6.3" || out.Best.Verdict == compat.Fails {
		t.Errorf("best image %s (%s)", out.Best.Image, out.Best.Verdict)
	}
	skipped := strings.Join(out.Skipped, "\n")
	if !strings.Contains(skipped, "vllm-openai:v0.9.2 skipped") || !strings.Contains(skipped, "12.8") {
		t.Errorf("the CUDA 12.8 image is not skipped with its reason:\n%s", skipped)
	}
	t.Logf("skipped on 550: %q", out.Skipped)
	old := []serving.Node{{Name: "old", Snapshot: onDriver(load(t, hgx), "470.256.02")}}
	_, err = serving.Choose(model(t, "llama3-8b"), serving.Request{Engine: "vllm"}, old, catalogue(t), kb.Default(), nil)
	if err == nil || !strings.Contains(err.Error(), "v0.6.3 skipped") || !strings.Contains(err.Error(), "v0.9.2 skipped") {
		t.Errorf("driver 470: %v", err)
	}
}

// What kiln compat read of an image decides over the catalogue's line.
func TestChooseGoesByWhatCompatRead(t *testing.T) {
	nodes := []serving.Node{{Name: "hgx", Snapshot: onDriver(load(t, hgx), "550.90.07")}}
	read := func(ref string) *compat.Requirements {
		if ref != "docker.io/vllm/vllm-openai:v0.6.3" {
			return nil
		}
		// Read: a CUDA 12.9 build whose runtime check asks for 12.9.
		e, err := require.Parse("cuda>=12.9")
		if err != nil {
			t.Fatal(err)
		}
		return &compat.Requirements{Image: ref, CUDA: "12.9", CUDAFrom: "libcudart.so.12.9", Require: "cuda>=12.9", RequireExpr: &e}
	}
	out, err := serving.Choose(model(t, "llama3-8b"), serving.Request{Engine: "vllm"}, nodes, catalogue(t), kb.Default(), read)
	if err == nil {
		t.Fatalf("an image read as CUDA 12.9 was taken on driver 550: %+v", out.Best)
	}
	if !strings.Contains(err.Error(), "12.9") {
		t.Errorf("refusal without the read requirement: %v", err)
	}
}

// No engine runs: the refusal names what is missing on each node.
func TestChooseRefusesWithWhatIsMissing(t *testing.T) {
	cat := catalogue(t)
	gguf := serving.Model{Name: "qwen-7b-q4", Format: serving.FormatGGUF, WeightsBytes: 4_500_000_000}
	_, err := serving.Choose(gguf, serving.Request{}, []serving.Node{{Name: "mi300x", Snapshot: load(t, mi300x)}, {Name: "cpu", Snapshot: &snapshot.Snapshot{}}}, cat, kb.Default(), nil)
	var ref *serving.Refusal
	if !errors.As(err, &ref) {
		t.Fatalf("GGUF on AMD: %v", err)
	}
	for _, want := range []string{"mi300x: llama.cpp has no image for amd GPUs", "cpu: no GPU"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal lacks %q:\n%v", want, err)
		}
	}
	// The same file on an NVIDIA box is served, sized by its weights.
	out, err := serving.Choose(gguf, serving.Request{}, []serving.Node{{Name: "rtx", Snapshot: onDriver(load(t, rtx4090), "550.90.07")}}, cat, kb.Default(), nil)
	if err != nil || out.Best.Engine != "llama.cpp" || out.Best.GPUs != 1 || len(out.Best.Notes) == 0 {
		t.Errorf("GGUF on NVIDIA: %+v, %v", out, err)
	}
	// A model larger than one 24 GB GPU, on a box whose GPUs share no
	// NVLink: tensor parallelism over PCIe is not chosen.
	_, err = serving.Choose(model(t, "llama3-70b"), serving.Request{}, []serving.Node{{Name: "rtx", Snapshot: onDriver(load(t, rtx4090), "550.90.07")}}, cat, kb.Default(), nil)
	if err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("70B on PCIe 4090s: %v", err)
	}
	// 13B in bf16 (26 GB) would fit two 24 GB GPUs, but the 4090s share no
	// NVLink: no tensor parallelism over PCIe, and the refusal says why.
	_, err = serving.Choose(model(t, "llama2-13b"), serving.Request{Context: 4096, Batch: 1}, []serving.Node{{Name: "rtx", Snapshot: onDriver(load(t, rtx4090), "550.90.07")}}, cat, kb.Default(), nil)
	if err == nil || !strings.Contains(err.Error(), "beyond its largest NVLink or xGMI group (1 of its 8 GPUs)") {
		t.Errorf("13B on PCIe 4090s: %v", err)
	}
	// The model's config from a file, on a node that holds it.
	b, err := os.ReadFile(filepath.Join("..", "plan", "testdata", "mixtral-8x7b-config.json"))
	if err != nil {
		t.Fatal(err)
	}
	arch, err := plan.ParseHFConfig(b, "mixtral")
	if err != nil {
		t.Fatal(err)
	}
	out, err = serving.Choose(serving.Model{Name: "mixtral", Format: serving.FormatSafetensors, Arch: &arch}, serving.Request{Context: 4096},
		[]serving.Node{{Name: "hgx", Snapshot: onDriver(load(t, hgx), "550.90.07")}}, cat, kb.Default(), nil)
	if err != nil || out.Best.GPUs < 2 {
		t.Errorf("Mixtral 8x7B (93 GB in bf16): %+v, %v", out, err)
	}
}

// Bad input is refused by name.
func TestChooseBadInput(t *testing.T) {
	cat := catalogue(t)
	nodes := []serving.Node{{Name: "hgx", Snapshot: load(t, hgx)}}
	for name, tc := range map[string]struct {
		m    serving.Model
		r    serving.Request
		want string
	}{
		"format":         {serving.Model{Name: "m", Format: "pickle"}, serving.Request{}, `format "pickle"`},
		"no config":      {serving.Model{Name: "m", Format: serving.FormatSafetensors}, serving.Request{}, "without a config.json"},
		"unknown engine": {model(t, "llama3-8b"), serving.Request{Engine: "ollama"}, `engine "ollama" is not in kiln's catalogue`},
		"wrong format":   {model(t, "llama3-8b"), serving.Request{Engine: "llama.cpp"}, "serves gguf, not safetensors"},
		"negative":       {model(t, "llama3-8b"), serving.Request{Batch: -1}, "cannot be negative"},
	} {
		if _, err := serving.Choose(tc.m, tc.r, nodes, cat, kb.Default(), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// The catalogue refuses entries without what kiln serve needs, and the
// embedded one names a source for every image.
func TestCatalogue(t *testing.T) {
	cat := catalogue(t)
	for _, e := range cat.Engines {
		for _, im := range e.Images {
			if !strings.HasPrefix(im.Source, "https://") {
				t.Errorf("%s: %s has no source address", e.Name, im.Ref)
			}
		}
	}
	for name, y := range map[string]string{
		"empty":       "engines: []",
		"twice":       "engines: [{name: a, formats: [gguf], port: 1, ready: /h, command: [x], source: s, images: [{ref: r, vendor: nvidia, cuda: '12.4', source: s}]}, {name: a, formats: [gguf], port: 1, ready: /h, command: [x], source: s, images: [{ref: r, vendor: nvidia, cuda: '12.4', source: s}]}]",
		"format":      "engines: [{name: a, formats: [onnx], port: 1, ready: /h, command: [x], source: s, images: [{ref: r, vendor: nvidia, cuda: '12.4', source: s}]}]",
		"no cuda":     "engines: [{name: a, formats: [gguf], port: 1, ready: /h, command: [x], source: s, images: [{ref: r, vendor: nvidia, source: s}]}]",
		"vendor":      "engines: [{name: a, formats: [gguf], port: 1, ready: /h, command: [x], source: s, images: [{ref: r, vendor: intel, cuda: '1', source: s}]}]",
		"ready":       "engines: [{name: a, formats: [gguf], port: 1, ready: h, command: [x], source: s, images: [{ref: r, vendor: nvidia, cuda: '12.4', source: s}]}]",
		"unknown key": "engines: [{name: a, formats: [gguf], port: 1, ready: /h, command: [x], source: s, gpus: 2, images: [{ref: r, vendor: nvidia, cuda: '12.4', source: s}]}]",
	} {
		if _, err := serving.ParseCatalogue([]byte(y)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseCatalogue(f *testing.F) {
	f.Add([]byte("engines: [{name: a, formats: [gguf], port: 1, ready: /h, command: [x], source: s, images: [{ref: r, vendor: nvidia, cuda: '12.4', source: s}]}]"))
	f.Add([]byte("engines:\r\n  - name: b\r\n    formats: [safetensors]\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := serving.ParseCatalogue(b)
		if err != nil {
			return
		}
		for _, e := range c.Engines {
			if e.Name == "" || len(e.Images) == 0 || e.Port < 1 || e.Port > 65535 || !strings.HasPrefix(e.Ready, "/") {
				t.Fatalf("accepted %+v", e)
			}
			for _, im := range e.Images {
				if im.Ref == "" || (im.CUDA == "") == (im.ROCm == "") {
					t.Fatalf("accepted image %+v", im)
				}
			}
		}
	})
}
