package plan

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestCatalogParamsMatchPublished(t *testing.T) {
	ms, err := Models()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 19 {
		t.Fatalf("catalog has %d models", len(ms))
	}
	for _, m := range ms {
		if m.PublishedParams == 0 {
			t.Errorf("%s: no published parameter count", m.Name)
			continue
		}
		if r := m.Params()/m.PublishedParams - 1; math.Abs(r) > 0.05 {
			t.Errorf("%s: kiln counts %.4g parameters, published %.4g (%+.1f%%)", m.Name, m.Params(), m.PublishedParams, 100*r)
		}
	}
	mx, ok := ModelByName("Mixtral-8x7B-v0.1")
	if !ok {
		t.Fatal("Mixtral not found by its Hugging Face name")
	}
	// Mixtral paper: 12.9B active of 46.7B.
	if a := mx.ActiveParams() / 1e9; math.Abs(a-12.9) > 0.3 {
		t.Errorf("Mixtral active params %.2fB, want 12.9B", a)
	}
	if _, ok := ModelByName("meta-llama/Llama-2-70b-hf"); !ok {
		t.Error("Llama 2 70B not found by its Hub path")
	}
}

func TestGPUTable(t *testing.T) {
	rows, err := GPUs()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"H100-SXM5-80GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "H200-SXM-141GB", "B200-180GB", "L40S", "V100-SXM2-32GB", "MI300X", "MI250X"} {
		if _, ok := GPUByName(name, nil); !ok {
			t.Errorf("no performance row for %s", name)
		}
	}
	h, _ := GPUByName("NVIDIA H100 80GB HBM3", nil)
	if h.Name != "" {
		t.Errorf("name matching without a knowledge base found %q", h.Name)
	}
	for _, g := range rows {
		if p, _ := g.Peak("bf16"); p < g.TFLOPS["fp32"] {
			t.Errorf("%s: bf16 peak %v below fp32", g.Name, p)
		}
	}
	v, _ := GPUByName("V100-SXM2-32GB", nil)
	if p, real := v.Peak("bf16"); real != "fp16" || p != 125 {
		t.Errorf("V100 bf16 falls back to %s %v, want fp16 125", real, p)
	}
}

func TestParseHFConfig(t *testing.T) {
	llama := `{"_name_or_path": "meta-llama/Llama-2-70b-hf", "model_type": "llama", "hidden_size": 8192,
	  "intermediate_size": 28672, "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
	  "vocab_size": 32000, "max_position_embeddings": 4096, "hidden_act": "silu", "tie_word_embeddings": false}`
	m, err := ParseHFConfig([]byte(llama), "x")
	if err != nil {
		t.Fatal(err)
	}
	cat, _ := ModelByName("llama2-70b")
	if m.Params() != cat.Params() || !m.Gated || m.KVHeads != 8 || m.Seq != 4096 {
		t.Errorf("parsed %+v (%.4g params), want the catalog's llama2-70b (%.4g)", m, m.Params(), cat.Params())
	}
	t5 := `{"model_type": "t5", "d_model": 1024, "d_ff": 65536, "d_kv": 128, "num_heads": 128, "num_layers": 24,
	  "num_decoder_layers": 24, "vocab_size": 32128, "feed_forward_proj": "relu"}`
	m, err = ParseHFConfig([]byte(t5), "t5-11b")
	if err != nil {
		t.Fatal(err)
	}
	if m.EncoderLayers != 24 || m.Layers != 24 || m.HeadDim != 128 || math.Abs(m.Params()/11.3e9-1) > 0.05 {
		t.Errorf("T5-11B parsed as %+v with %.4g params", m, m.Params())
	}
	for _, bad := range []string{``, `[]`, `{"hidden_size": 10}`, `{"hidden_size": 4096, "num_attention_heads": 7000, "num_hidden_layers": 2, "intermediate_size": 5}`} {
		if _, err := ParseHFConfig([]byte(bad), "bad"); err == nil {
			t.Errorf("config %q accepted", bad)
		}
	}
}

func FuzzParseHFConfig(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.json")
	for _, p := range seeds {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"model_type":"llama","hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":32,"intermediate_size":11008,"vocab_size":32000}`))
	f.Add([]byte(`{"model_type":"vit","hidden_size":1280,"num_attention_heads":16,"num_hidden_layers":32,"intermediate_size":5120,"image_size":224,"patch_size":14}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseHFConfig(b, "fuzz")
		if err != nil {
			return
		}
		if m.Layers <= 0 || m.Hidden <= 0 || m.Heads <= 0 || m.FFN <= 0 || m.Seq <= 0 || m.Vocab < 0 {
			t.Fatalf("accepted a model with a non-positive size: %+v", m)
		}
		if p := m.Params(); p <= 0 || math.IsNaN(p) || math.IsInf(p, 0) {
			t.Fatalf("params %v for %+v", p, m)
		}
	})
}
