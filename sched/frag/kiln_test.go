package frag

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAmountCountsMemory: a shape that asks for more host memory than the
// node has left cannot use its GPUs.
func TestAmountCountsMemory(t *testing.T) {
	w := NewWorkload([]Shape{{Task: Task{CPU: 1000, Memory: 48 << 10, GPUs: 1, GPUMilli: 1000}, Weight: 1}})
	n := Node{Model: "G2", CPU: 16000, Memory: 64 << 10, Free: []int32{1000, 1000}}
	if got := w.Amount(n); got != 0 {
		t.Errorf("64 GiB free for a 48 GiB shape: Amount %v, want 0", got)
	}
	n.Memory = 32 << 10
	if got := w.Amount(n); got != 2000 {
		t.Errorf("32 GiB free for a 48 GiB shape: Amount %v, want all 2000 free milli", got)
	}
}

// TestMemoKeysMemory: with a memory-aware target the memo tells apart
// states that differ only in free memory, and agrees with Amount.
func TestMemoKeysMemory(t *testing.T) {
	w := NewWorkload([]Shape{
		{Task: Task{CPU: 2000, Memory: 16 << 10, GPUs: 1, GPUMilli: 500}, Weight: 1},
		{Task: Task{CPU: 4000, Memory: 48 << 10, GPUs: 1, GPUMilli: 1000}, Weight: 1},
	})
	m := NewMemo(w)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 2000; i++ {
		free := make([]int32, 1+rng.IntN(8))
		for k := range free {
			free[k] = int32(rng.IntN(11) * 100)
		}
		n := Node{Model: "G2", CPU: int64(rng.IntN(16)) * 1000, Memory: int64(rng.IntN(8)) * 8 << 10, Free: free}
		if got, want := m.Amount(n), w.Amount(n); !near(got, want) {
			t.Fatalf("memo %v != direct %v for %v", got, want, n)
		}
		task := Task{CPU: 1000, Memory: 8 << 10, GPUs: 1, GPUMilli: 300}
		if !Fits(n, task) {
			continue
		}
		_, d := m.FGD(n, task, m.Amount(n), false)
		if want := Score(n, task, w); !near(d, want) {
			t.Fatalf("memo FGD delta %v != Score %v for %v on %v", d, want, task, n)
		}
	}
}

func TestKilnTarget(t *testing.T) {
	small := Task{CPU: 4000, GPUs: 1, GPUMilli: 1000}
	wide := Task{CPU: 120000, GPUs: 8, GPUMilli: 1000}
	var tasks []Task
	for _, mem := range []int64{8 << 10, 16 << 10, 32 << 10} { // 30 each: median 16 GiB
		for j := 0; j < 30; j++ {
			tk := small
			tk.Memory = mem
			tasks = append(tasks, tk)
		}
	}
	w8 := wide
	w8.Memory = 700 << 10
	tasks = append(tasks, w8)
	// Four 96-core nodes and one 128-core node, 8 GPUs each: the 120-core
	// 8-GPU shape fits on 8 of 40 GPUs (20%).
	eight := func(cpu int64) Node {
		return Node{Model: "G", CPU: cpu, Memory: 768 << 10, Free: slices.Repeat([]int32{1000}, 8)}
	}
	caps := []Node{eight(96000), eight(96000), eight(96000), eight(96000), eight(128000)}
	base := TargetWorkload(tasks, 0.95, ByCount)
	if len(base.Shapes) != 1 {
		t.Fatalf("base target %+v, want the one-GPU shape only", base.Shapes)
	}
	w := KilnTarget(base, tasks, caps)
	if len(w.Shapes) != 2 {
		t.Fatalf("kiln target %+v, want the base shape and the scarce 8-GPU shape", w.Shapes)
	}
	if w.Shapes[0].Memory != 16<<10 {
		t.Errorf("base shape memory %d MiB, want the median 16384", w.Shapes[0].Memory)
	}
	s := w.Shapes[1]
	if s.GPUs != 8 || s.CPU != 120000 || s.Memory != 700<<10 {
		t.Errorf("scarce shape %+v", s)
	}
	// Popularity 1/91, times 0.6 / 0.2; then both renormalised.
	p := 1.0 / 91 * 0.6 / 0.2
	if want := p / (1 + p); !near(s.Weight, want) {
		t.Errorf("scarce weight %v, want %v", s.Weight, want)
	}
	// A cluster where it fits on half the capacity: not scarce.
	if w := KilnTarget(base, tasks, []Node{eight(96000), eight(128000)}); len(w.Shapes) != 1 {
		t.Errorf("8-GPU shape that fits half the cluster was added: %+v", w.Shapes)
	}
}

func TestKilnDeadTable(t *testing.T) {
	// 470 and 320 are common (>= 5%), 160 popular (2%), 50 rare.
	w := NewWorkload([]Shape{
		{Task: Task{GPUs: 1, GPUMilli: 470}, Weight: 60},
		{Task: Task{GPUs: 1, GPUMilli: 320}, Weight: 30},
		{Task: Task{GPUs: 1, GPUMilli: 160}, Weight: 2},
		{Task: Task{GPUs: 1, GPUMilli: 50}, Weight: 0.5},
		{Task: Task{CPU: 1000}, Weight: 7.5},
	})
	k := NewKiln(w, nil)
	cases := []struct{ free, dead int32 }{
		{0, 0},
		{60, 60},   // nothing popular fits
		{190, 110}, // 160 fills 160 of it; common shares nothing: (30+190)/2
		{320, 0},
		{530, 55},    // 320+160 leaves 50; 470 leaves 60
		{940, 0},     // 470+470
		{1000, 40},   // 320*3 = 960 with or without 160
		{-5, 0},      // outside: clamped
		{1200, 1200}, // outside the table
	}
	for _, c := range cases {
		if got := k.Dead(c.free); got != c.dead {
			t.Errorf("Dead(%d) = %d, want %d", c.free, got, c.dead)
		}
	}
	if k.CloseBelow != 50 {
		t.Errorf("CloseBelow %d, want the smallest share 50", k.CloseBelow)
	}
	if SmallestShare([]Task{{GPUs: 1, GPUMilli: 1000}, {GPUs: 1, GPUMilli: 230}, {CPU: 1}, {GPUs: 1, GPUMilli: 110}}) != 110 {
		t.Error("SmallestShare")
	}
}

// TestKilnCloses: a share that leaves less than CloseBelow on a GPU goes
// there before anything else, on the tightest GPU, whatever FGD's GPU.
func TestKilnCloses(t *testing.T) {
	w := NewWorkload([]Shape{
		{Task: Task{GPUs: 1, GPUMilli: 810}, Weight: 1},
		{Task: Task{GPUs: 1, GPUMilli: 1000}, Weight: 1},
	})
	k := NewKiln(w, nil)
	k.CloseBelow = 50
	task := Task{CPU: 1000, GPUs: 1, GPUMilli: 160}
	sliver := Node{Model: "G2", CPU: 64000, Memory: 1 << 20, Free: []int32{1000, 190, 1000}}
	fresh := Node{Model: "G2", CPU: 64000, Memory: 1 << 20, Free: []int32{1000, 1000, 1000}}
	if g := k.GPUs(sliver, task); !slices.Equal(g, []int{1}) {
		t.Errorf("GPUs on %v = %v, want the 190 sliver [1]", sliver.Free, g)
	}
	ss, sf := k.Score(sliver, 96000, task), k.Score(fresh, 96000, task)
	if ss < closeBase || sf >= closeBase {
		t.Errorf("scores %v (sliver) and %v (fresh): want the sliver above %d, the fresh node below", ss, sf, closeBase)
	}
	// A share that closes nothing is scored by FGD's integer score first,
	// of FGD's reduction less the dead capacity it leaves: 500 on an idle
	// GPU leaves 500 that neither 810 nor 1000 fills.
	big := Task{CPU: 1000, GPUs: 1, GPUMilli: 500}
	if k.Dead(500) != 500 || k.Dead(1000) != 0 {
		t.Fatalf("Dead(500) %d, Dead(1000) %d", k.Dead(500), k.Dead(1000))
	}
	want := PaperScore(Score(fresh, big, w) - DefaultDeadWeight*500)
	if s := k.Score(fresh, 96000, big); s >= closeBase || math.Floor(s) != float64(want) {
		t.Errorf("score %v for a 500 share on an idle node, want %d first", s, want)
	}
}

// TestKilnScoreMemoMatchesScore: the memo path and the direct path agree
// on score and GPU.
func TestKilnScoreMemoMatchesScore(t *testing.T) {
	w := NewWorkload([]Shape{
		{Task: Task{CPU: 3000, Memory: 4 << 10, GPUs: 1, GPUMilli: 810}, Weight: 4},
		{Task: Task{CPU: 8000, Memory: 32 << 10, GPUs: 1, GPUMilli: 470}, Weight: 3},
		{Task: Task{CPU: 4000, Memory: 16 << 10, GPUs: 1, GPUMilli: 320}, Weight: 2},
		{Task: Task{CPU: 12000, Memory: 48 << 10, GPUs: 1, GPUMilli: 1000}, Weight: 5},
		{Task: Task{CPU: 16000, Memory: 32 << 10}, Weight: 1},
	})
	k := NewKiln(w, map[string]float64{"V": 0.2})
	m := NewMemo(w)
	rng := rand.New(rand.NewPCG(7, 8))
	shares := []int32{50, 160, 230, 320, 470, 650, 810, 1000}
	for i := 0; i < 3000; i++ {
		free := make([]int32, 1+rng.IntN(8))
		for g := range free {
			free[g] = int32(rng.IntN(21) * 50)
		}
		n := Node{Model: []string{"G", "V"}[rng.IntN(2)], CPU: int64(rng.IntN(40)) * 1000, Memory: int64(rng.IntN(16)) * 16 << 10, Free: free}
		task := Task{CPU: int64(1+rng.IntN(12)) * 1000, Memory: int64(rng.IntN(4)) * 8 << 10, GPUs: 1, GPUMilli: shares[rng.IntN(len(shares))]}
		if rng.IntN(5) == 0 {
			task.GPUs, task.GPUMilli = 0, 0
		}
		if !Fits(n, task) {
			if !math.IsInf(k.Score(n, 96000, task), -1) {
				t.Fatalf("no fit but score %v", k.Score(n, 96000, task))
			}
			continue
		}
		s, g := k.ScoreMemo(m, n, 96000, task, m.Amount(n))
		if want := k.Score(n, 96000, task); !near(s, want) {
			t.Fatalf("ScoreMemo %v != Score %v for %v on %v", s, want, task, n)
		}
		if task.Sharing() {
			if want := k.GPUs(n, task); len(want) != 1 || want[0] != g {
				t.Fatalf("ScoreMemo GPU %d != GPUs %v for %v on %v", g, want, task, n)
			}
			if n.Free[g] < task.GPUMilli {
				t.Fatalf("GPU %d has %d free for %v", g, n.Free[g], task)
			}
		}
	}
}

// TestCPUReserveFor: the reserve is the GPU tasks' CPU per milli-GPU, and
// off when the tasks ask for more of the CPU than of the GPUs.
func TestCPUReserveFor(t *testing.T) {
	caps := []Node{{Model: "G2", CPU: 192000, Memory: 384 << 10, Free: []int32{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}}}
	tasks := []Task{
		{CPU: 12000, GPUs: 1, GPUMilli: 1000},
		{CPU: 4000, GPUs: 1, GPUMilli: 500},
		{CPU: 8000}, // without GPU: not in the ratio, but in the CPU demand
	}
	// 16 cores for 1.5 GPUs; CPU asked 24/192 = 12.5%, GPU 1.5/8 = 18.75%: on.
	if got, want := CPUReserveFor(tasks, caps), 16000.0/1500; !near(got, want) {
		t.Errorf("CPUReserveFor = %v, want %v milli-cores per milli-GPU", got, want)
	}
	// Two more CPU-only tasks of 8 cores: CPU 40/192 = 20.8% > 0.97 * 18.75%.
	tasks = append(tasks, Task{CPU: 8000}, Task{CPU: 8000})
	if got := CPUReserveFor(tasks, caps); got != 0 {
		t.Errorf("CPU-bound workload: CPUReserveFor = %v, want 0 (off)", got)
	}
	if got := CPUReserveFor([]Task{{CPU: 8000}}, caps); got != 0 {
		t.Errorf("no GPU task: CPUReserveFor = %v, want 0", got)
	}
}

// TestKilnKeepsCPUForFreeGPUs: among nodes of equal FGD score, a GPU task
// avoids the node it would leave with less CPU than its free GPUs need,
// even where that node's CPU per GPU matches the task better; with the
// reserve off, the match decides.
func TestKilnKeepsCPUForFreeGPUs(t *testing.T) {
	w := NewWorkload([]Shape{{Task: Task{CPU: 1000, GPUs: 1, GPUMilli: 1000}, Weight: 1}})
	k := NewKiln(w, nil)
	k.CPUReserve = 10 // 10 cores per free GPU
	task := Task{CPU: 12000, GPUs: 1, GPUMilli: 1000}
	// 12 cores per GPU like the task; 30 cores free for 3 idle GPUs: after
	// the task 18 cores for 2 GPUs, 2 cores short.
	tight := Node{Model: "G2", CPU: 30000, Memory: 1 << 20, Free: []int32{0, 0, 0, 0, 0, 1000, 1000, 1000}}
	// 24 cores per GPU, 60 cores free: plenty.
	roomy := Node{Model: "G2", CPU: 60000, Memory: 1 << 20, Free: []int32{0, 0, 0, 0, 0, 1000, 1000, 1000}}
	if short := k.cpuShort(tight, 96000, task); short != 2000 {
		t.Errorf("cpuShort(tight) = %d, want 2000 milli-cores", short)
	}
	if short := k.cpuShort(roomy, 192000, task); short != 0 {
		t.Errorf("cpuShort(roomy) = %d, want 0", short)
	}
	st, sr := k.Score(tight, 96000, task), k.Score(roomy, 192000, task)
	if math.Floor(st) != math.Floor(sr) {
		t.Fatalf("FGD scores differ: %v and %v", st, sr)
	}
	if !(sr > st) {
		t.Errorf("score roomy %v <= tight %v: want the node that keeps CPU for its GPUs", sr, st)
	}
	// The cap: a node with 8 cores per GPU is never short by more than its
	// own ratio asks (8 cores per free GPU, not 10).
	lean := Node{Model: "P100", CPU: 16000, Memory: 1 << 20, Free: []int32{1000, 1000}}
	if short := k.cpuShort(lean, 16000, Task{CPU: 8000, GPUs: 1, GPUMilli: 1000}); short != 0 {
		t.Errorf("cpuShort(lean) = %d, want 0: 8 cores left for 1 GPU of an 8-core-per-GPU node", short)
	}
	k.CPUReserve = 0
	if st, sr := k.Score(tight, 96000, task), k.Score(roomy, 192000, task); !(st > sr) {
		t.Errorf("reserve off: score tight %v <= roomy %v: want the better CPU-per-GPU match", st, sr)
	}
}

// TestKilnStranded: capacity counts as stranded when a share of the target
// fits it by size but the node's CPU left is too little for every such
// share; the score of a placement that strands capacity drops.
func TestKilnStranded(t *testing.T) {
	w := NewWorkload([]Shape{
		{Task: Task{CPU: 4000, GPUs: 1, GPUMilli: 320}, Weight: 1},
		{Task: Task{CPU: 12000, GPUs: 1, GPUMilli: 650}, Weight: 1},
		{Task: Task{CPU: 3000, GPUs: 1, GPUMilli: 1000}, Weight: 1},
	})
	k := NewKiln(w, nil)
	cases := []struct {
		n    Node
		want int64
	}{
		{Node{Model: "P100", CPU: 940, Memory: 1 << 16, Free: []int32{350, 0}}, 350}, // 320 fits 350 by share, not by CPU
		{Node{Model: "P100", CPU: 4000, Memory: 1 << 16, Free: []int32{350, 0}}, 0},
		{Node{Model: "P100", CPU: 940, Memory: 1 << 16, Free: []int32{200, 1000}}, 1000}, // 200: no share fits it at all
		{Node{Model: "P100", CPU: 3500, Memory: 1 << 16, Free: []int32{700, 1000}}, 700}, // the whole GPU needs only 3 cores
	}
	for _, c := range cases {
		if got := k.Stranded(c.n); got != c.want {
			t.Errorf("Stranded(%v) = %d, want %d", c.n, got, c.want)
		}
	}
	// A 650 with 12 cores on a node with 15 cores and one idle GPU left
	// would strand that GPU's 350; on a node with 32 cores it strands
	// nothing.
	task := Task{CPU: 12000, GPUs: 1, GPUMilli: 650}
	tight := Node{Model: "P100", CPU: 15000, Memory: 1 << 16, Free: []int32{1000, 0}}
	roomy := Node{Model: "P100", CPU: 32000, Memory: 1 << 16, Free: []int32{1000, 0}}
	if got := k.strandedAfter(tight, task.CPU, 0, []int{0}, task.GPUMilli); got != 350 {
		t.Fatalf("650 with 12 cores on 15 cores strands %d, want 350", got)
	}
	st, rm := k.Score(tight, 16000, task), k.Score(roomy, 32000, task)
	if !(st < rm) {
		t.Errorf("score on the node it strands %v, want below %v on the node with CPU to spare", st, rm)
	}
	k.StrandWeight = 0
	if got := k.Score(roomy, 32000, task); got != rm {
		t.Errorf("score on the node with CPU to spare moved with the strand weight: %v, %v", got, rm)
	}
	if got := k.Score(tight, 16000, task); !(math.Floor(got) > math.Floor(st)) {
		t.Errorf("the strand weight did not lower the integer score on the node it strands: %v without, %v with", got, st)
	}
}
