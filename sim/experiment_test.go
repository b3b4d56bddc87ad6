package sim

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReducedExperiment runs every policy with one seed on the default
// trace and checks the paper's ranking, FGD's published number and that
// kiln allocates more than FGD.
func TestReducedExperiment(t *testing.T) {
	needTrace(t)
	tr, err := LoadTrace(traceDir, "default")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := Simulate(context.Background(), tr, PolicyNames(), []int64{42}, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Summary{}
	for _, s := range ex.Summary {
		got[s.Policy] = s
		t.Logf("%-10s alloc@100 %.2f%% alloc@130 %.2f%% failed %.0f", s.Policy, s.Alloc100Mean, s.Alloc130Mean, s.FailedMean)
	}
	a := func(p string) float64 { return got[p].Alloc130Mean }
	// The paper's order at 130%: Random < DotProd < GpuClustering ~
	// GpuPacking < BestFit < FGD; clustering and packing are 0.1 point
	// apart in the paper, so only their place between DotProd and BestFit
	// is checked.
	if !(a("random") < a("dotprod") && a("dotprod") < a("bestfit") && a("bestfit") < a("fgd")) {
		t.Errorf("ranking broken: random %.2f, dotprod %.2f, bestfit %.2f, fgd %.2f", a("random"), a("dotprod"), a("bestfit"), a("fgd"))
	}
	for _, p := range []string{"clustering", "packing"} {
		if !(a("random") < a(p) && a(p) < a("bestfit")) {
			t.Errorf("%s %.2f is not between random %.2f and bestfit %.2f", p, a(p), a("random"), a("bestfit"))
		}
	}
	// Published at 130% (mean of 10 seeds): FGD 95.39, BestFit 93.08,
	// Random 87.47; one seed may be off by its spread.
	for p, want := range map[string]float64{"fgd": 95.39, "bestfit": 93.08, "random": 87.47} {
		if math.Abs(a(p)-want) > 0.8 {
			t.Errorf("%s at 130%%: %.2f, published %.2f", p, a(p), want)
		}
	}
	if !(got["kiln"].Alloc130Mean > got["fgd"].Alloc130Mean && got["kiln"].Alloc100Mean > got["fgd"].Alloc100Mean) {
		t.Errorf("kiln (%.2f/%.2f) does not beat FGD (%.2f/%.2f) at 100%%/130%%", got["kiln"].Alloc100Mean, a("kiln"), got["fgd"].Alloc100Mean, a("fgd"))
	}
	// The curve and its CSV.
	var csv bytes.Buffer
	if err := ex.WriteCSV(&csv, true); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(csv.String(), "trace,policy,arrived_pct,alloc_pct,frag_pct,unallocated_gpus\ndefault,random,0,") || strings.Count(csv.String(), "\n") < 7*131 {
		t.Errorf("CSV starts %q and has %d lines", csv.String()[:80], strings.Count(csv.String(), "\n"))
	}
	png := filepath.Join(t.TempDir(), "alloc.png")
	if err := ex.WritePNG(png); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("PNG: %v", err)
	}
}

// TestKilnBeatsFGDOnVariants runs FGD and kiln with one seed on the
// variants where kiln's margin once was thinnest or where its target's
// extra shapes matter: all GPU tasks fractional (gpushare100), 40% of the
// GPU demand in multi-GPU tasks (multigpu40) and a third of the GPU tasks
// bound to GPU models (gpuspec33).
func TestKilnBeatsFGDOnVariants(t *testing.T) {
	needTrace(t)
	for _, name := range []string{"gpushare100", "multigpu40", "gpuspec33"} {
		tr, err := LoadTrace(traceDir, name)
		if err != nil {
			t.Fatal(err)
		}
		ex, err := Simulate(context.Background(), tr, []string{"fgd", "kiln"}, []int64{42}, DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		f, k := ex.Summary[0], ex.Summary[1]
		t.Logf("%s: fgd %.2f/%.2f kiln %.2f/%.2f", name, f.Alloc100Mean, f.Alloc130Mean, k.Alloc100Mean, k.Alloc130Mean)
		if k.Alloc100Mean < f.Alloc100Mean+0.05 || k.Alloc130Mean < f.Alloc130Mean+0.05 {
			t.Errorf("%s: kiln %.2f/%.2f does not beat FGD %.2f/%.2f by 0.05 points at 100%%/130%%", name, k.Alloc100Mean, k.Alloc130Mean, f.Alloc100Mean, f.Alloc130Mean)
		}
	}
}

// TestSameSeedSameResult runs FGD twice with one seed and once with
// another on a reduced workload.
func TestSameSeedSameResult(t *testing.T) {
	needTrace(t)
	tr, err := LoadTrace(traceDir, "gpushare40")
	if err != nil {
		t.Fatal(err)
	}
	run := func(seed int64) Run {
		ex, err := Simulate(context.Background(), tr, []string{"fgd", "random"}, []int64{seed}, Options{Ratio: 1.0, Coverage: 0.95, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		return ex.Runs[0]
	}
	a, b, c := run(7), run(7), run(8)
	if a.Alloc100 != b.Alloc100 || a.Failed != b.Failed {
		t.Errorf("seed 7 twice: %.4f/%d and %.4f/%d", a.Alloc100, a.Failed, b.Alloc100, b.Failed)
	}
	if a.Alloc100 == c.Alloc100 && a.Failed == c.Failed {
		t.Errorf("seeds 7 and 8 gave the same result %.4f/%d", a.Alloc100, a.Failed)
	}
}

func TestReplay(t *testing.T) {
	needTrace(t)
	tr, err := LoadTrace(traceDir, "default")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Replay(context.Background(), tr, []string{"random", "fgd", "kiln"}, 42, Options{Coverage: 0.95, Speedup: 20000})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Tasks != 8152 || r.AvgAlloc <= 0 || r.PeakAlloc > 100 || r.PeakAlloc < r.AvgAlloc {
			t.Errorf("%+v", r)
		}
	}
	// Random fragments more: more tasks wait.
	if res[0].Waited <= res[1].Waited {
		t.Errorf("random queued %d tasks, FGD %d: want random more", res[0].Waited, res[1].Waited)
	}
	// kiln keeps the 128-core nodes whole for the 8-GPU tasks that need
	// 120 cores and 720 GiB: nothing waits longer than under FGD.
	if k, f := res[2], res[1]; k.Waited > f.Waited || k.MaxWait > f.MaxWait {
		t.Errorf("kiln queued %d tasks (max wait %s), FGD %d (%s)", k.Waited, human(k.MaxWait), f.Waited, human(f.MaxWait))
	}
	var b bytes.Buffer
	if err := WriteReplayTable(&b, res); err != nil || !strings.Contains(b.String(), "avg GPU alloc") {
		t.Errorf("table %q, %v", b.String(), err)
	}
	mg, err := LoadTrace(traceDir, "multigpu20")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Replay(context.Background(), mg, []string{"fgd"}, 42, DefaultOptions()); err == nil || !strings.Contains(err.Error(), "no creation_time") {
		t.Errorf("replay of a list without times: %v", err)
	}
}

// BenchmarkFullRun is the whole experiment: seven policies, ten seeds,
// the default trace.
func BenchmarkFullRun(b *testing.B) {
	needTrace(b)
	tr, err := LoadTrace(traceDir, "default")
	if err != nil {
		b.Fatal(err)
	}
	seeds := []int64{42, 43, 44, 45, 46, 47, 48, 49, 50, 51}
	for b.Loop() {
		if _, err := Simulate(context.Background(), tr, PolicyNames(), seeds, DefaultOptions()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFGDOneRun is one FGD simulation (about 10,600 tasks on 1,213
// nodes).
func BenchmarkFGDOneRun(b *testing.B) {
	needTrace(b)
	tr, err := LoadTrace(traceDir, "default")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Simulate(context.Background(), tr, []string{"fgd"}, []int64{42}, Options{Ratio: 1.3, Coverage: 0.95, Workers: 1}); err != nil {
			b.Fatal(err)
		}
	}
}
