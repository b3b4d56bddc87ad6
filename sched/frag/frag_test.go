package frag

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// handWorkload: A = 1x500 with 4 cores (50%), B = 1x1000 with 8 cores
// (30%), C = CPU-only with 2 cores (20%).
func handWorkload() *Workload {
	return NewWorkload([]Shape{
		{Task: Task{CPU: 4000, GPUs: 1, GPUMilli: 500}, Weight: 5},
		{Task: Task{CPU: 8000, GPUs: 1, GPUMilli: 1000}, Weight: 3},
		{Task: Task{CPU: 2000}, Weight: 2},
	})
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestAmountByHand checks the measure against numbers worked out from the
// paper's definition.
func TestAmountByHand(t *testing.T) {
	w := handWorkload()
	cases := []struct {
		name string
		n    Node
		want float64
	}{
		// A fits; only the 300 GPU is fragment for it: 0.5*300 = 150.
		// B fits (one idle GPU, 16 >= 8 cores): 0.3*300 = 90.
		// C asks for no GPU: all 1300 free milli: 0.2*1300 = 260.
		{"both fit", Node{Model: "X", CPU: 16000, Free: []int32{1000, 300}}, 500},
		// B lacks CPU (6 < 8 cores): all 1300 for it: 390. 150 + 390 + 260.
		{"B lacks CPU", Node{Model: "X", CPU: 6000, Free: []int32{1000, 300}}, 800},
		// Neither fits a GPU: everything free is fragment.
		{"slivers", Node{Model: "X", CPU: 16000, Free: []int32{400, 300}}, 700},
		// Nothing free, nothing fragmented.
		{"full", Node{Model: "X", CPU: 16000, Free: []int32{0, 0}}, 0},
		// A node without GPUs has no GPU fragment.
		{"cpu node", Node{CPU: 16000}, 0},
	}
	for _, c := range cases {
		if got := w.Amount(c.n); !near(got, c.want) {
			t.Errorf("%s: Amount(%v) = %v, want %v", c.name, c.n, got, c.want)
		}
	}
}

func TestAmountModelConstraint(t *testing.T) {
	w := NewWorkload([]Shape{{Task: Task{CPU: 1000, GPUs: 1, GPUMilli: 500, Models: []string{"Y"}}, Weight: 1}})
	n := Node{Model: "X", CPU: 8000, Free: []int32{1000, 1000}}
	if got := w.Amount(n); got != 2000 {
		t.Errorf("model X for a task that wants Y: Amount = %v, want all 2000 free milli", got)
	}
	n.Model = "Y"
	if got := w.Amount(n); got != 0 {
		t.Errorf("model Y: Amount = %v, want 0", got)
	}
}

func TestScoreAndGPUChoiceByHand(t *testing.T) {
	w := handWorkload()
	task := Task{CPU: 4000, GPUs: 1, GPUMilli: 500}
	// Before: A 0, B 0.3*600 = 180, C 0.2*1600 = 320: 500.
	// GPU 0 -> [500 600], 12 cores: A 0, B 0.3*1100, C 0.2*1100: 550 (-50).
	// GPU 1 -> [1000 100]: A 0.5*100, B 0.3*100, C 0.2*1100: 300 (+200).
	n := Node{Model: "X", CPU: 16000, Memory: 1 << 20, Free: []int32{1000, 600}}
	if got := ChooseGPUs(n, task, w); !slices.Equal(got, []int{1}) {
		t.Errorf("ChooseGPUs = %v, want [1] (fills the partly used GPU)", got)
	}
	if got := Score(n, task, w); !near(got, 200) {
		t.Errorf("Score = %v, want 200", got)
	}
	m := NewMemo(w)
	gpu, delta := m.FGD(n, task, m.Amount(n), false)
	if gpu != 1 || !near(delta, 200) {
		t.Errorf("Memo.FGD = GPU %d delta %v, want GPU 1 delta 200", gpu, delta)
	}
	// Only one GPU has room: the score is what it costs, -50.
	n2 := Node{Model: "X", CPU: 16000, Memory: 1 << 20, Free: []int32{1000, 300}}
	if got := Score(n2, task, w); !near(got, -50) {
		t.Errorf("Score on [1000 300] = %v, want -50", got)
	}
	if got := Score(Node{Model: "X", CPU: 1000, Free: []int32{1000}}, task, w); !math.IsInf(got, -1) {
		t.Errorf("Score where the task does not fit = %v, want -Inf", got)
	}
}

func TestPaperScore(t *testing.T) {
	for _, c := range []struct {
		delta float64
		want  int64
	}{{0, 50}, {1000, 73}, {-1000, 26}, {1e6, 100}, {-1e6, 0}, {40, 50}, {41, 51}} {
		if got := PaperScore(c.delta); got != c.want {
			t.Errorf("PaperScore(%v) = %d, want %d", c.delta, got, c.want)
		}
	}
}

func TestFits(t *testing.T) {
	n := Node{Model: "T4", CPU: 8000, Memory: 4096, Free: []int32{1000, 400, 1000}}
	cases := []struct {
		t    Task
		want bool
	}{
		{Task{CPU: 8000, Memory: 4096, GPUs: 2, GPUMilli: 1000}, true},
		{Task{CPU: 8000, GPUs: 3, GPUMilli: 1000}, false},
		{Task{CPU: 9000}, false},
		{Task{Memory: 5000}, false},
		{Task{GPUs: 1, GPUMilli: 400}, true},
		{Task{GPUs: 1, GPUMilli: 400, Models: []string{"V100M16", "V100M32"}}, false},
		{Task{GPUs: 1, GPUMilli: 400, Models: []string{"T4"}}, true},
		{Task{CPU: 1000}, true},
	}
	for _, c := range cases {
		if got := Fits(n, c.t); got != c.want {
			t.Errorf("Fits(%v, %v) = %v, want %v", n, c.t, got, c.want)
		}
	}
}

func TestTargetWorkload(t *testing.T) {
	p := Task{CPU: 4000, GPUs: 1, GPUMilli: 500}
	q := Task{CPU: 8000, GPUs: 1, GPUMilli: 1000}
	r := Task{CPU: 1000}
	tasks := []Task{p, r, p, q, p, q}
	// Counts 3, 2, 1 of 6: P alone covers 50% < 80%, P+Q 83%.
	w := TargetWorkload(tasks, 0.8, ByCount)
	if len(w.Shapes) != 2 || w.Shapes[0].CPU != 4000 || w.Shapes[1].CPU != 8000 {
		t.Fatalf("shapes = %+v, want P then Q", w.Shapes)
	}
	if !near(w.Shapes[0].Weight, 0.6) || !near(w.Shapes[1].Weight, 0.4) {
		t.Errorf("weights %v %v, want 0.6 0.4 (renormalised)", w.Shapes[0].Weight, w.Shapes[1].Weight)
	}
	// Memory does not make a shape; order of tasks does not matter.
	q2 := q
	q2.Memory = 99
	w2 := TargetWorkload([]Task{q2, p, q, r, p, p}, 0.8, ByCount)
	if len(w2.Shapes) != 2 || !near(w2.Shapes[1].Weight, 0.4) {
		t.Errorf("shapes with memory and another order = %+v", w2.Shapes)
	}
	// Equal counts: the larger shape comes first.
	w3 := TargetWorkload([]Task{r, q}, 0.4, ByCount)
	if len(w3.Shapes) != 1 || w3.Shapes[0].CPU != 8000 {
		t.Errorf("tie: %+v, want the 8-core shape", w3.Shapes)
	}
	// By GPU: a whole GPU weighs twice a half one.
	w4 := TargetWorkload([]Task{p, q}, 1, ByGPU)
	if !near(w4.Shapes[0].Weight, 2.0/3) {
		t.Errorf("ByGPU: %+v", w4.Shapes)
	}
}

// TestMemoMatchesDirect checks the memo against direct measurement on
// random states, GPU orders included.
func TestMemoMatchesDirect(t *testing.T) {
	w := handWorkload()
	m := NewMemo(w)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		g := 1 + rng.IntN(8)
		free := make([]int32, g)
		for k := range free {
			free[k] = int32(rng.IntN(11) * 100)
		}
		n := Node{Model: []string{"A", "B"}[rng.IntN(2)], CPU: int64(rng.IntN(20)) * 1000, Free: free}
		if got, want := m.Amount(n), w.Amount(n); !near(got, want) {
			t.Fatalf("memo %v != direct %v for %v", got, want, n)
		}
		task := Task{CPU: 1000, GPUs: 1, GPUMilli: int32(100 * (1 + rng.IntN(9)))}
		if !Fits(n, task) {
			continue
		}
		_, d := m.FGD(n, task, m.Amount(n), false)
		if want := Score(n, task, w); !near(d, want) {
			t.Fatalf("memo FGD delta %v != Score %v for %v on %v", d, want, task, n)
		}
	}
	if m.Hits == 0 {
		t.Error("memo never hit")
	}
	// Larger nodes are measured directly.
	big := Node{Model: "A", CPU: 64000, Free: slices.Repeat([]int32{1000}, 16)}
	if m.Amount(big) != w.Amount(big) {
		t.Error("16-GPU node")
	}
}

func TestKilnScore(t *testing.T) {
	w := handWorkload()
	k := NewKiln(w, ModelPressure([]Task{{GPUs: 1, GPUMilli: 1000, Models: []string{"V100"}}}, map[string]int64{"V100": 2000, "T4": 2000}))
	if !near(k.Pressure["V100"], 0.5) || k.Pressure["T4"] != 0 {
		t.Errorf("pressure = %v, want V100 0.5", k.Pressure)
	}
	task := Task{CPU: 16000, GPUs: 1, GPUMilli: 1000}
	n := Node{Model: "T4", CPU: 104000, Memory: 1 << 20, Free: []int32{1000, 1000}}
	s := k.Score(n, 104000, task)
	if int64(s) != PaperScore(Score(n, task, w)) {
		t.Errorf("kiln's first key %v is not FGD's integer score %d", s, PaperScore(Score(n, task, w)))
	}
	// Same state on a CPU-poorer node type (12 cores per GPU instead of 52)
	// for a task of 16 cores per GPU: the better CPU match wins.
	lean := n
	if k.Score(lean, 24000, task) <= s {
		t.Errorf("node of 12 cores/GPU should match a 16-core task better than one of 52")
	}
	// A model that constrained tasks need is spared by unconstrained ones.
	v := n
	v.Model = "V100"
	if k.Score(v, 104000, task) >= s {
		t.Errorf("V100 (needed by constrained tasks) should score lower than T4")
	}
	if !math.IsInf(k.Score(Node{Model: "T4", CPU: 0, Free: []int32{1000}}, 1000, task), -1) {
		t.Error("no fit should be -Inf")
	}
	if g := k.GPUs(Node{Model: "T4", CPU: 64000, Memory: 1, Free: []int32{1000, 600}}, Task{GPUs: 1, GPUMilli: 500}); !slices.Equal(g, []int{1}) {
		t.Errorf("GPUs = %v", g)
	}
}

func TestApplyAndHelpers(t *testing.T) {
	n := Node{Model: "X", CPU: 10, Memory: 10, Free: []int32{1000, 300, 1000}}
	m := Apply(n, Task{CPU: 4, Memory: 3, GPUs: 2, GPUMilli: 1000}, FirstFree(n.Free, 1000, 2))
	if m.CPU != 6 || m.Memory != 7 || !slices.Equal(m.Free, []int32{0, 300, 0}) || n.Free[0] != 1000 {
		t.Errorf("Apply: %v (original %v)", m, n)
	}
	if FirstFree(n.Free, 1000, 3) != nil {
		t.Error("FirstFree of 3 idle on a node with 2")
	}
	if g := TightestGPU(n.Free, 200); g != 1 {
		t.Errorf("TightestGPU = %d, want 1", g)
	}
	if n.FreeGPU() != 2300 {
		t.Errorf("FreeGPU = %d", n.FreeGPU())
	}
}
