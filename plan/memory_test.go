package plan

import (
	"fmt"
	"math"
	"testing"
)

// The ZeRO paper (Rajbhandari et al. 2020, Figure 1 and section 5): a 7.5B
// parameter model with 64-way data parallelism and mixed-precision Adam
// (K = 12) needs 120 GB per GPU of model states, 31.4 GB with P_os, 16.6 GB
// with P_os+g and 1.88 GB with P_os+g+p.
func TestZeROPaperModelStates(t *testing.T) {
	j := Job{Precision: "bf16", Optimizer: OptAdamW}
	if k := j.OptimizerBytes(); k != 12 {
		t.Fatalf("K for mixed-precision Adam = %v, want 12", k)
	}
	want := []string{"120", "31.4", "16.6", "1.88"}
	for stage, w := range want {
		got := ModelStateBytes(7.5e9, j.OptimizerBytes(), 64, stage) / 1e9
		if s := fmt.Sprintf("%.3g", got); s != w {
			t.Errorf("stage %d: %s GB (%.5f), paper says %s GB", stage, s, got, w)
		}
	}
	// The same through the training memory model: a model of 7.5B
	// parameters in its blocks on 64 GPUs of plain data parallelism.
	m := Model{Name: "zero-7.5b", Layers: 1, Hidden: 1000, Heads: 10, FFN: 1000, Vocab: 0, Seq: 1}
	// Scale the one block's MLP so that the model has exactly 7.5e9 params.
	c := &Cluster{GPU: GPUPerf{Name: "x", TFLOPS: map[string]float64{"fp32": 1}, MemoryBandwidthGBps: 1, Attainable: 1}, GPUsPerNode: 8, Nodes: 8, NetworkGBps: 50, MemoryBytes: 1e15}
	m.FFN = int((7.5e9 - m.attnParams() - 2*float64(m.Hidden)) / (2 * float64(m.Hidden)))
	if p := m.Params(); math.Abs(p-7.5e9) > 2000 {
		t.Fatalf("test model has %v params", p)
	}
	for stage, w := range want {
		l := Layout{DP: 64, TP: 1, PP: 1, VP: 1, Zero: stage, MicroBatch: 1, Recompute: RecomputeFull}
		mem := trainMemory(Job{Model: m, Precision: "bf16", Optimizer: OptAdamW, Seq: 1}, c, l, 1)
		if s := fmt.Sprintf("%.3g", mem.ModelStates()/1e9); s != w {
			t.Errorf("trainMemory stage %d: model states %s GB, want %s", stage, s, w)
		}
	}
}

func TestOptimizerBytes(t *testing.T) {
	cases := []struct {
		prec, opt string
		k         float64
	}{
		{"bf16", OptAdamW, 12}, {"bf16", OptAdam8bit, 6}, {"bf16", OptSGD, 8},
		{"fp32", OptAdamW, 8}, {"fp32", OptSGD, 4}, {"fp8", OptAdamW, 12},
	}
	for _, c := range cases {
		if k := (Job{Precision: c.prec, Optimizer: c.opt}).OptimizerBytes(); k != c.k {
			t.Errorf("%s %s: K = %v, want %v", c.prec, c.opt, k, c.k)
		}
	}
}

// Korthikanti et al. 2022, Table 2: activation bytes per transformer layer.
func TestActivationMemoryTable2(t *testing.T) {
	m := Model{Name: "gpt", Layers: 96, Hidden: 12288, Heads: 96, FFN: 4 * 12288, Vocab: 51200, Seq: 2048}
	s, b, h, a := 2048.0, 1.0, 12288.0, 96.0
	sbh := s * b * h
	for _, tc := range []struct {
		name string
		t    int
		sp   bool
		rc   string
		want float64
	}{
		{"no parallelism", 1, false, RecomputeNone, sbh * (34 + 5*a*s/h)},
		{"tensor parallel", 8, false, RecomputeNone, sbh * (10 + 24.0/8 + 5*a*s/(h*8))},
		{"tensor + sequence parallel", 8, true, RecomputeNone, sbh / 8 * (34 + 5*a*s/h)},
		{"tensor parallel + selective", 8, false, RecomputeSelective, sbh * (10 + 24.0/8)},
		{"tensor + sequence parallel + selective", 8, true, RecomputeSelective, sbh / 8 * 34},
		{"full recomputation", 8, false, RecomputeFull, 2 * sbh},
	} {
		got := m.layerActivationBytes(b, s, tc.t, tc.sp, tc.rc, 2, false)
		if math.Abs(got/tc.want-1) > 1e-12 {
			t.Errorf("%s: %.6g bytes, Table 2 gives %.6g", tc.name, got, tc.want)
		}
	}
	// A fused attention kernel stores no scores: as selective.
	if f, sel := m.layerActivationBytes(b, s, 8, true, RecomputeNone, 2, true), m.layerActivationBytes(b, s, 8, true, RecomputeSelective, 2, false); f != sel {
		t.Errorf("flash attention %v != selective %v", f, sel)
	}
}

func TestKVCacheMatchesPublished(t *testing.T) {
	// vLLM paper: OPT-13B needs 800 KB per token: 2 x 5120 x 40 x 2 bytes.
	opt := Model{Name: "opt-13b", Layers: 40, Hidden: 5120, Heads: 40, FFN: 20480, Vocab: 50272}
	if got := opt.KVCacheBytes(1, 2); got != 819200 {
		t.Errorf("OPT-13B KV per token %v bytes, want 819200", got)
	}
	// Hugging Face Llama 3.1 blog: 8B at 128,000 tokens in FP16 = 15.62 GiB.
	m, _ := ModelByName("llama3.1-8b")
	if got := m.KVCacheBytes(128000, 2) / (1 << 30); math.Abs(got-15.625) > 1e-9 {
		t.Errorf("Llama 3.1 8B KV at 128k tokens %.4f GiB, want 15.625", got)
	}
}
