package serving_test

import (
	"strings"
	"testing"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/serving"
)

// A user's engine is sized like the catalogue's, but what kiln cannot read
// stays unknown: an image kiln compat has not read, a command on the node.
// A custom image whose read fails on the node is skipped with the reason.
func TestChooseCustomEngines(t *testing.T) {
	nodes := []serving.Node{{Name: "hgx", Snapshot: onDriver(load(t, hgx), "550.90.07")}}
	proc, err := serving.CustomEngine(serving.FormatSafetensors, "", []string{"/opt/engine", "--model", "{model}", "--port", "{port}"}, 9000, "/health")
	if err != nil {
		t.Fatal(err)
	}
	out, err := serving.Choose(model(t, "llama3-70b"), serving.Request{Custom: proc}, nodes, catalogue(t), kb.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := out.Best
	if b.Engine != serving.CustomName || b.Image != "" || b.Verdict != compat.Unknown || b.GPUs < 2 || b.Link != "NVLink" || len(b.Notes) == 0 {
		t.Errorf("process engine: %+v", b)
	}
	for _, o := range out.Others {
		if o.Engine != serving.CustomName {
			t.Errorf("a catalogue engine was considered beside the user's: %+v", o)
		}
	}
	img, err := serving.CustomEngine(serving.FormatSafetensors, "registry.lab/me/engine:1", nil, 8000, "/health")
	if err != nil {
		t.Fatal(err)
	}
	out, err = serving.Choose(model(t, "llama3-8b"), serving.Request{Custom: img}, nodes, catalogue(t), kb.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.Best.Image != "registry.lab/me/engine:1" || out.Best.Verdict != compat.Unknown || !strings.Contains(strings.Join(out.Best.Notes, " "), "kiln compat") {
		t.Errorf("unread image: %+v", out.Best)
	}
	needs13 := func(ref string) *compat.Requirements {
		return &compat.Requirements{Image: ref, CUDA: "13.0", CUDAFrom: "read"}
	}
	_, err = serving.Choose(model(t, "llama3-8b"), serving.Request{Custom: img}, nodes, catalogue(t), kb.Default(), needs13)
	if err == nil || !strings.Contains(err.Error(), "engine:1 skipped") {
		t.Errorf("an image read as CUDA 13 on driver 550: %v", err)
	}
	// --process runs a catalogue engine's command where it is installed:
	// unknown too, and not an image.
	out, err = serving.Choose(model(t, "llama3-8b"), serving.Request{Engine: "vllm", Process: true}, nodes, catalogue(t), kb.Default(), nil)
	if err != nil || out.Best.Image != "" || out.Best.Verdict != compat.Unknown || out.Best.Engine != "vllm" {
		t.Errorf("vllm as a process: %+v, %v", out, err)
	}
}

func TestCustomEngineRefusals(t *testing.T) {
	for name, f := range map[string]func() error{
		"no image, no command": func() error {
			_, err := serving.CustomEngine(serving.FormatGGUF, "", nil, 80, "/health")
			return err
		},
		"port": func() error {
			_, err := serving.CustomEngine(serving.FormatGGUF, "", []string{"x"}, 0, "/health")
			return err
		},
		"ready": func() error {
			_, err := serving.CustomEngine(serving.FormatGGUF, "", []string{"x"}, 80, "health")
			return err
		},
		"format": func() error {
			_, err := serving.CustomEngine("onnx", "", []string{"x"}, 80, "/health")
			return err
		},
		"placeholder": func() error {
			_, err := serving.CustomEngine(serving.FormatGGUF, "", []string{"x", "--key={secret}"}, 80, "/health")
			return err
		},
	} {
		if err := f(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestEngineArgs(t *testing.T) {
	e, ok := catalogue(t).Engine("vllm")
	if !ok {
		t.Fatal("no vllm")
	}
	args, err := e.Args(serving.Values{Model: "/models/llama", Name: "llama-3", Port: 8000, TP: 4, Context: 8192})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(args, " ")
	if got != "vllm serve /models/llama --served-model-name llama-3 --host 0.0.0.0 --port 8000 --tensor-parallel-size 4 --max-model-len 8192" {
		t.Errorf("vllm: %s", got)
	}
	e.Command = []string{"serve", "--opt={nope}"}
	if _, err := e.Args(serving.Values{}); err == nil || !strings.Contains(err.Error(), "{nope}") {
		t.Errorf("an unknown placeholder: %v", err)
	}
	// Every catalogue engine's command fills.
	for _, e := range catalogue(t).Engines {
		if _, err := e.Args(serving.Values{Model: "/m", ModelFile: "/m/f.gguf", Name: "n", Port: e.Port, TP: 1, Context: 4096}); err != nil {
			t.Errorf("%s: %v", e.Name, err)
		}
	}
}

func TestDeploymentNames(t *testing.T) {
	for in, want := range map[string]string{
		"Meta-Llama-3-8B-Instruct": "meta-llama-3-8b-instruct",
		"tiny llama (q4)":          "tiny-llama--q4",
		"../../etc":                "etc",
		"":                         "model",
		"\x1b[31mred":              "31mred",
	} {
		got := serving.DefaultName(in)
		if got != want {
			t.Errorf("DefaultName(%q) = %q, want %q", in, got, want)
		}
		if err := serving.CheckName(got); err != nil {
			t.Errorf("DefaultName(%q) = %q, which CheckName refuses: %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "-x", "a b", "a\nb", "a..b", strings.Repeat("a", 129), "é"} {
		if serving.CheckName(bad) == nil {
			t.Errorf("CheckName(%q) accepted", bad)
		}
	}
	for _, good := range []string{"llama-3", "org/model:q4", "Qwen2.5-7B"} {
		if err := serving.CheckName(good); err != nil {
			t.Errorf("CheckName(%q): %v", good, err)
		}
	}
}

// A model at a path on the nodes is served by engines run there as
// processes; an engine image would not see it, and says so.
func TestChoosePathModels(t *testing.T) {
	nodes := []serving.Node{{Name: "hgx", Snapshot: onDriver(load(t, hgx), "550.90.07")}}
	m := model(t, "llama3-8b")
	m.Path = "/models/llama3-8b"
	_, err := serving.Choose(m, serving.Request{Engine: "vllm"}, nodes, catalogue(t), kb.Default(), nil)
	if err == nil || !strings.Contains(err.Error(), "would not see the model at /models/llama3-8b") || !strings.Contains(err.Error(), "kiln model push") {
		t.Errorf("vllm's image for a path: %v", err)
	}
	out, err := serving.Choose(m, serving.Request{Engine: "vllm", Process: true}, nodes, catalogue(t), kb.Default(), nil)
	if err != nil || out.Best.Image != "" {
		t.Errorf("vllm as a process for a path: %+v, %v", out, err)
	}
	m.Path = ""
	if out, err := serving.Choose(m, serving.Request{Engine: "vllm"}, nodes, catalogue(t), kb.Default(), nil); err != nil || out.Best.Image == "" {
		t.Errorf("vllm's image for a model of the registry: %+v, %v", out, err)
	}
}
