package plan

import (
	"flag"
	"os"
	"strings"
	"testing"

	"kiln.dev/kiln/kb"
)

var update = flag.Bool("update", false, "rewrite docs/plan-accuracy.md")

func h100s(t testing.TB, gpus int) *Cluster {
	t.Helper()
	c, err := CatalogCluster("H100-SXM5-80GB", gpus, 8, 400, kb.Default())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSearch70BOn64H100(t *testing.T) {
	m, _ := ModelByName("llama2-70b")
	res, err := Search(Job{Model: m, Mode: ModeTrain}, h100s(t, 64), SearchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Best) != 5 || res.Infeasible != "" {
		t.Fatalf("got %d layouts, infeasible %q", len(res.Best), res.Infeasible)
	}
	best := res.Best[0]
	if !best.Fits || best.MemoryPerGPUBytes > 80e9 {
		t.Errorf("best layout does not fit: %s, %.1f GB", best.LayoutString, best.MemoryPerGPUBytes/1e9)
	}
	// 70B on 64 H100s: tensor parallelism stays inside the 8-GPU NVLink
	// island, and MFU lands where published runs of this size do.
	if best.Layout.TP > 8 {
		t.Errorf("best layout %s puts tensor parallelism across nodes", best.LayoutString)
	}
	if best.MFU < 0.3 || best.MFU > 0.56 {
		t.Errorf("best MFU %.2f is implausible", best.MFU)
	}
	for i := 1; i < len(res.Best); i++ {
		if res.Best[i].TokensPerS > res.Best[i-1].TokensPerS {
			t.Errorf("layouts not ordered by throughput at %d", i)
		}
	}
	if len(res.Explanation) < 2 || !strings.Contains(res.Explanation[0], "Best "+best.LayoutString) || !strings.Contains(res.Explanation[1], "Runner-up") {
		t.Errorf("explanation: %q", res.Explanation)
	}
	if !strings.Contains(strings.Join(res.Explanation, " "), "NVLink NV18") {
		t.Errorf("explanation does not name the link: %q", res.Explanation)
	}
}

func TestInfeasibleSaysWhatItTakes(t *testing.T) {
	m, _ := ModelByName("llama2-70b")
	c, err := CatalogCluster("A100-SXM4-80GB", 4, 4, 0, kb.Default())
	if err != nil {
		t.Fatal(err)
	}
	res, err := Search(Job{Model: m, Mode: ModeTrain}, c, SearchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Best) != 0 || !strings.Contains(res.Infeasible, "llama2-70b training needs at least") ||
		!strings.Contains(res.Infeasible, "x 80 GB GPUs") || !strings.HasSuffix(res.Infeasible, "you have 4") {
		t.Fatalf("infeasible answer %q", res.Infeasible)
	}
	// 70B x 16 bytes of model state is 1.1 TB: at least 14 GPUs of 80 GB.
	var n int
	if _, err := fmtSscan(res.Infeasible, &n); err != nil || n < 14 || n > 64 {
		t.Errorf("needs %d GPUs (%q)", n, res.Infeasible)
	}
}

func TestPCIePairPenalisesTensorParallel(t *testing.T) {
	m, _ := ModelByName("llama2-7b")
	nv := h100s(t, 8)
	pcie, err := CatalogCluster("L40S", 8, 8, 0, kb.Default())
	if err != nil {
		t.Fatal(err)
	}
	l := Layout{DP: 1, TP: 8, PP: 1, VP: 1, MicroBatch: 1, Recompute: RecomputeSelective, SequenceParallel: true}
	j := Job{Model: m, Mode: ModeTrain, GlobalBatch: 64}
	a, err := Evaluate(j, nv, l)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Evaluate(j, pcie, l)
	if err != nil {
		t.Fatal(err)
	}
	// NV18 gives 450 GB/s (uni) per pair, PCIe Gen4 across sockets 32:
	// the same collectives take over 10x longer.
	if b.Breakdown.TPCommS < 10*a.Breakdown.TPCommS || !strings.Contains(b.Breakdown.TPLink, "SYS") {
		t.Errorf("tp=8 communication: NVLink %.3f s, PCIe %.3f s over %s", a.Breakdown.TPCommS, b.Breakdown.TPCommS, b.Breakdown.TPLink)
	}
	if b.Breakdown.TPCommS/b.StepTimeS < 0.5 {
		t.Errorf("tp=8 over PCIe takes only %.0f%% of the step", 100*b.Breakdown.TPCommS/b.StepTimeS)
	}
}

func TestEvaluateLayoutKeys(t *testing.T) {
	l, err := ParseLayout("dp=8,tp=8,pp=4,zero=1,mb=1,recompute=selective")
	if err != nil {
		t.Fatal(err)
	}
	if l.String() != "dp=8,tp=8,pp=4,zero=1,mb=1,recompute=selective" {
		t.Errorf("round trip: %s", l)
	}
	m, _ := ModelByName("llama3-70b")
	e, err := Evaluate(Job{Model: m}, h100s(t, 256), l)
	if err != nil {
		t.Fatal(err)
	}
	if e.MemoryPerGPUBytes <= 0 || e.StepTimeS <= 0 || e.TokensPerS <= 0 || e.TFLOPSPerGPU <= 0 {
		t.Errorf("estimate %+v", e)
	}
	if _, err := Evaluate(Job{Model: m}, h100s(t, 64), l); err == nil || !strings.Contains(err.Error(), "256 GPUs") {
		t.Errorf("layout of 256 GPUs on 64: %v", err)
	}
	for _, bad := range []string{"dp=x", "tp=0", "zero=5", "recompute=some", "foo=1", "tp"} {
		if _, err := ParseLayout(bad); err == nil {
			t.Errorf("ParseLayout(%q) accepted", bad)
		}
	}
}

func TestInferenceDecodeIsMemoryBound(t *testing.T) {
	m, _ := ModelByName("llama2-70b")
	l := Layout{DP: 1, TP: 8, PP: 1, VP: 1, MicroBatch: 1, Recompute: RecomputeNone}
	e, err := Evaluate(Job{Model: m, Mode: ModeInfer, GlobalBatch: 1, Seq: 512, GenTokens: 128}, h100s(t, 8), l)
	if err != nil {
		t.Fatal(err)
	}
	// Batch 1: each token streams 138 GB of bf16 weights over 8 GPUs at
	// 80% of 3.35 TB/s: about 6.4 ms, plus all-reduces.
	if tpot := e.TimePerOutputTokenS; tpot < 6e-3 || tpot > 12e-3 {
		t.Errorf("time per output token %.2f ms", tpot*1e3)
	}
}

func TestAccuracyDoc(t *testing.T) {
	rows, err := Accuracy(kb.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) < 15 {
		t.Fatalf("%d published rows, want at least 15", len(rows))
	}
	if e := MedianAbsError(rows, "throughput"); !(e <= 0.20) {
		t.Errorf("median throughput error %.1f%% > 20%%", 100*e)
	}
	if e := MedianAbsError(rows, "memory"); !(e <= 0.10) {
		t.Errorf("median memory error %.1f%% > 10%%", 100*e)
	}
	md := AccuracyMarkdown(rows)
	const path = "../docs/plan-accuracy.md"
	if *update {
		if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != md {
		t.Errorf("%s is stale: run go test ./plan -run TestAccuracyDoc -update", path)
	}
}

func BenchmarkSearch70BOn64GPUs(b *testing.B) {
	m, _ := ModelByName("llama2-70b")
	c := h100s(b, 64)
	j := Job{Model: m, Mode: ModeTrain}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Search(j, c, SearchOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// fmtSscan reads the GPU count after "needs at least ".
func fmtSscan(s string, n *int) (int, error) {
	_, rest, _ := strings.Cut(s, "needs at least ")
	return fmtSscanInt(rest, n)
}
