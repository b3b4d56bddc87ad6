package gpubench_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/gpubench"
	"kiln.dev/kiln/gpubench/benchtest"
	"kiln.dev/kiln/snapshot"
)

func small() gpubench.Plan {
	p := gpubench.DefaultPlan()
	// Sizes whose copy times at the rates the tests use are whole
	// nanoseconds, as the drivers' timers report them.
	p.Bytes = 1_000_000
	p.CollectiveBytes = 1_000_000
	p.Warmup = 1
	p.Repetitions = 5
	p.LatencyCopies = 10
	return p
}

func run(t *testing.T, d *benchtest.Driver, opt gpubench.Options) *snapshot.Measurements {
	t.Helper()
	ms, _, err := gpubench.Run(context.Background(), d, opt)
	if err != nil {
		t.Fatal(err)
	}
	if n := d.Live(); n != 0 {
		t.Errorf("%d buffers left allocated after the run", n)
	}
	return ms
}

func find(t *testing.T, ms *snapshot.Measurements, test string, keep func(m snapshot.Measurement) bool) snapshot.Measurement {
	t.Helper()
	var got []snapshot.Measurement
	for _, m := range ms.Results {
		if m.Test == test && (keep == nil || keep(m)) {
			got = append(got, m)
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d %s measurements match, want 1: %+v", len(got), test, got)
	}
	return got[0]
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func isLocal(want bool, mem string) func(m snapshot.Measurement) bool {
	return func(m snapshot.Measurement) bool {
		return m.HostLocal != nil && *m.HostLocal == want && m.Memory == mem && m.GPUs[0] == 0
	}
}

// TestPlanTasks checks which tests a run makes on two GPUs on two NUMA
// nodes: every host test from each node, pinned and pageable, both ways;
// device memory per GPU; p2p both ways, both at once and latency per pair;
// the three collectives.
func TestPlanTasks(t *testing.T) {
	d := benchtest.New(2, 0, 1)
	c := &benchtest.Collectives{Driver: d, Time: func(gpubench.Op, int64, int) time.Duration { return time.Millisecond }}
	ms := run(t, d, gpubench.Options{Plan: small(), Collectives: c})
	count := map[string]int{}
	for _, m := range ms.Results {
		if m.Error != "" {
			t.Errorf("%s failed: %s", m.Test, m.Error)
		}
		count[m.Test]++
	}
	want := map[string]int{"h2d": 8, "d2h": 8, "device": 2, "p2p": 2, "p2p-bidi": 1, "p2p-latency": 1, "all-reduce": 1, "all-gather": 1, "reduce-scatter": 1}
	for k, v := range want {
		if count[k] != v {
			t.Errorf("%s: %d measurements, want %d", k, count[k], v)
		}
	}
	// GPU0 is on node 0: its local host memory is there, the remote on 1.
	m := find(t, ms, "h2d", isLocal(false, "pinned"))
	if m.HostNUMANode == nil || *m.HostNUMANode != 1 {
		t.Errorf("GPU0's remote host memory on node %v, want 1", m.HostNUMANode)
	}
	for _, a := range d.Allocs() {
		if a.Kind != gpubench.DeviceMemory && a.NUMANode != 0 && a.NUMANode != 1 {
			t.Errorf("host memory not placed: %+v", a)
		}
	}
	if ms.Collectives != "fakeccl 2.0" || ms.Driver != "fake" || ms.DriverVersion != "1.0" {
		t.Errorf("libraries: %q %q %q", ms.Driver, ms.DriverVersion, ms.Collectives)
	}
	if len(ms.Notes) != 0 {
		t.Errorf("notes: %q", ms.Notes)
	}
}

// TestSizesAndRepetitions checks every copy's size and count: warm-up plus
// timed runs, one copy each for bandwidth, LatencyCopies small ones for
// latency, two streams at once for bidi.
func TestSizesAndRepetitions(t *testing.T) {
	d := benchtest.New(2, 0)
	p := small()
	p.Groups = []string{gpubench.GroupHost}
	run(t, d, gpubench.Options{Plan: p})
	// One node: local only; 2 GPUs x pinned/pageable x h2d/d2h = 8 tests.
	cs := d.Copies()
	if want := 8 * (p.Warmup + p.Repetitions); len(cs) != want {
		t.Fatalf("%d copies, want %d", len(cs), want)
	}
	for _, c := range cs {
		if c.Bytes != p.Bytes {
			t.Fatalf("copy of %d bytes, want %d", c.Bytes, p.Bytes)
		}
	}

	d = benchtest.New(2, 0)
	p.Groups = []string{gpubench.GroupLatency}
	ms := run(t, d, gpubench.Options{Plan: p})
	cs = d.Copies()
	if want := (p.Warmup + p.Repetitions) * p.LatencyCopies; len(cs) != want {
		t.Fatalf("latency: %d copies, want %d", len(cs), want)
	}
	for _, c := range cs {
		if c.Bytes != p.LatencyBytes || c.Src.Device != 0 || c.Dst.Device != 1 || c.Stream.Device != 0 {
			t.Fatalf("latency copy %+v: want %d bytes from GPU0 to GPU1 on GPU0's stream", c, p.LatencyBytes)
		}
	}
	m := find(t, ms, "p2p-latency", nil)
	if m.Copies != p.LatencyCopies || m.Bytes != p.LatencyBytes || m.Repetitions != p.Repetitions || m.Warmup != p.Warmup {
		t.Errorf("latency measurement %+v", m)
	}

	d = benchtest.New(2, 0)
	p.Groups = []string{gpubench.GroupP2P}
	run(t, d, gpubench.Options{Plan: p})
	cs = d.Copies()
	// 2 uni tests with one stream, 1 bidi with two.
	if want := 4 * (p.Warmup + p.Repetitions); len(cs) != want {
		t.Fatalf("p2p: %d copies, want %d", len(cs), want)
	}
	if !d.PeerEnabled(0, 1) || !d.PeerEnabled(1, 0) {
		t.Error("peer access not enabled both ways")
	}
}

// TestMedianAndSpread: the fake's rate changes from run to run; the
// figure is the median of the timed runs and min/max their spread, the
// warm-up runs left out.
func TestMedianAndSpread(t *testing.T) {
	d := benchtest.New(1, 0)
	p := small()
	p.Groups = []string{gpubench.GroupDevice}
	p.Warmup = 2
	p.Repetitions = 5
	// Copies 0-1 are the warm-up (very slow: must not count), then 5 runs.
	rates := []float64{1, 1, 50, 10, 40, 20, 25}
	d.Rate = func(c benchtest.Copy) float64 { return rates[c.Seq] }
	ms := run(t, d, gpubench.Options{Plan: p})
	m := find(t, ms, "device", nil)
	// Device memory counts bytes read and written: twice the copy rate.
	if !near(m.MedianGBps, 50) || !near(m.MinGBps, 20) || !near(m.MaxGBps, 100) {
		t.Errorf("median %v min %v max %v, want 50, 20, 100", m.MedianGBps, m.MinGBps, m.MaxGBps)
	}
	if m.Direction != "read+write" {
		t.Errorf("direction %q", m.Direction)
	}

	// An even count takes the mean of the middle two.
	d = benchtest.New(1, 0)
	p.Groups = []string{gpubench.GroupHost}
	p.Warmup = 0
	p.Repetitions = 4
	rates = []float64{10, 40, 20, 25}
	d.Rate = func(c benchtest.Copy) float64 { return rates[c.Seq%4] }
	ms = run(t, d, gpubench.Options{Plan: p})
	m = find(t, ms, "h2d", isLocal(true, "pinned"))
	if !near(m.MedianGBps, 22.5) {
		t.Errorf("median of 10, 40, 20, 25 = %v, want 22.5", m.MedianGBps)
	}
}

// TestBidirectional: both copies run at once, so the time is the slower
// one's and the figure is both sizes over it.
func TestBidirectional(t *testing.T) {
	d := benchtest.New(2, 0)
	p := small()
	p.Groups = []string{gpubench.GroupP2P}
	d.Rate = func(c benchtest.Copy) float64 {
		if c.Src.Device == 1 {
			return 20 // GB/s from GPU1 to GPU0
		}
		return 40
	}
	ms := run(t, d, gpubench.Options{Plan: p})
	if m := find(t, ms, "p2p", func(m snapshot.Measurement) bool { return m.GPUs[0] == 0 }); !near(m.MedianGBps, 40) || m.Direction != "uni" {
		t.Errorf("GPU0->GPU1 %v %s, want 40 uni", m.MedianGBps, m.Direction)
	}
	if m := find(t, ms, "p2p", func(m snapshot.Measurement) bool { return m.GPUs[0] == 1 }); !near(m.MedianGBps, 20) {
		t.Errorf("GPU1->GPU0 %v, want 20", m.MedianGBps)
	}
	m := find(t, ms, "p2p-bidi", nil)
	if !near(m.MedianGBps, 40) || m.Direction != "bidi" || m.PeerAccess == nil || !*m.PeerAccess {
		t.Errorf("bidi %v %s peer %v, want 40 (2 x 1 MB in the time of the slower leg) bidi with peer access", m.MedianGBps, m.Direction, m.PeerAccess)
	}
}

// TestLatency: the figure is one small copy's time, in microseconds.
func TestLatency(t *testing.T) {
	d := benchtest.New(2, 0)
	d.Overhead = 2 * time.Microsecond
	d.Rate = func(benchtest.Copy) float64 { return 8 } // 8 bytes in 1 ns
	p := small()
	p.Groups = []string{gpubench.GroupLatency}
	ms := run(t, d, gpubench.Options{Plan: p})
	m := find(t, ms, "p2p-latency", nil)
	if !near(m.MedianUS, 2.001) || !near(m.MinUS, 2.001) || !near(m.MaxUS, 2.001) {
		t.Errorf("latency %v us (%v-%v), want 2.001", m.MedianUS, m.MinUS, m.MaxUS)
	}
	if m.MedianGBps != 0 {
		t.Errorf("latency test with a bandwidth: %v", m.MedianGBps)
	}
}

// TestCollectives: bus bandwidth is algorithm bandwidth times 2(n-1)/n for
// all-reduce and (n-1)/n for the others, the size as nccl-tests counts it.
func TestCollectives(t *testing.T) {
	d := benchtest.New(4, 0)
	// Every operation moves its size at 100 GB/s of algorithm bandwidth.
	c := &benchtest.Collectives{Driver: d, Time: func(_ gpubench.Op, bytes int64, _ int) time.Duration {
		return time.Duration(float64(bytes) / 100)
	}}
	p := small()
	p.Groups = []string{gpubench.GroupCollective}
	ms := run(t, d, gpubench.Options{Plan: p, Collectives: c})
	for op, bus := range map[string]float64{"all-reduce": 150, "all-gather": 75, "reduce-scatter": 75} {
		m := find(t, ms, op, nil)
		if !near(m.AlgGBps, 100) || !near(m.MedianGBps, bus) || m.Direction != "bus" || m.Bytes != p.CollectiveBytes {
			t.Errorf("%s: alg %v bus %v %s size %d, want 100, %v bus, %d", op, m.AlgGBps, m.MedianGBps, m.Direction, m.Bytes, bus, p.CollectiveBytes)
		}
		if len(m.Devices) != 4 {
			t.Errorf("%s over %d devices", op, len(m.Devices))
		}
	}
	launches := c.Launches()
	if want := 3 * (p.Warmup + p.Repetitions); len(launches) != want {
		t.Fatalf("%d launches, want %d", len(launches), want)
	}
	counts := map[gpubench.Op]int64{}
	for _, l := range launches {
		counts[l.Op] = l.Count
	}
	if counts[gpubench.AllReduce] != p.CollectiveBytes/4 || counts[gpubench.AllGather] != p.CollectiveBytes/16 || counts[gpubench.ReduceScatter] != p.CollectiveBytes/16 {
		t.Errorf("element counts %v: want all-reduce the whole buffer, the others a quarter each", counts)
	}
}

func TestBusFactor(t *testing.T) {
	for _, c := range []struct {
		op    gpubench.Op
		n     int
		want  float64
		label string
	}{
		{gpubench.AllReduce, 8, 1.75, "2(n-1)/n"},
		{gpubench.AllReduce, 2, 1, "2(n-1)/n"},
		{gpubench.AllGather, 8, 0.875, "(n-1)/n"},
		{gpubench.ReduceScatter, 4, 0.75, "(n-1)/n"},
		{gpubench.AllReduce, 1, 0, "one rank"},
		{gpubench.AllReduce, 0, 0, "no rank"},
	} {
		if got := gpubench.BusFactor(c.op, c.n); !near(got, c.want) {
			t.Errorf("%s over %d (%s) = %v, want %v", c.op, c.n, c.label, got, c.want)
		}
	}
}

// TestNoCollectiveLibrary: without NCCL or RCCL the run goes on and says
// why collectives are missing.
func TestNoCollectiveLibrary(t *testing.T) {
	d := benchtest.New(2, 0)
	p := small()
	p.Groups = []string{gpubench.GroupCollective}
	ms := run(t, d, gpubench.Options{Plan: p, CollectivesMissing: "libnccl.so.2 not found"})
	if len(ms.Results) != 0 || len(ms.Notes) != 1 || !strings.Contains(ms.Notes[0], "libnccl.so.2 not found") {
		t.Errorf("results %d notes %q", len(ms.Results), ms.Notes)
	}
	c := &benchtest.Collectives{Driver: d, Err: errors.New("ncclCommInitAll: unhandled system error")}
	ms = run(t, d, gpubench.Options{Plan: p, Collectives: c})
	if len(ms.Results) != 0 || len(ms.Notes) != 1 || !strings.Contains(ms.Notes[0], "unhandled system error") {
		t.Errorf("results %d notes %q", len(ms.Results), ms.Notes)
	}
}

// TestPeerAccessRefused: a pair without peer access is measured all the
// same (the driver stages the copies) and says so.
func TestPeerAccessRefused(t *testing.T) {
	d := benchtest.New(2, 0)
	d.Peer = func(a, b int) bool { return false }
	p := small()
	p.Groups = []string{gpubench.GroupP2P}
	ms := run(t, d, gpubench.Options{Plan: p})
	for _, m := range ms.Results {
		if m.PeerAccess == nil || *m.PeerAccess || m.Error != "" {
			t.Errorf("%s: peer access %v, error %q", m.Test, m.PeerAccess, m.Error)
		}
	}
	if d.PeerEnabled(0, 1) {
		t.Error("peer access enabled where the driver refused it")
	}
}

// TestFailedTestIsKept: a test that fails is kept with its error and the
// others still run.
func TestFailedTestIsKept(t *testing.T) {
	d := benchtest.New(2, 0, 1)
	d.Fail = func(method string, args ...any) error {
		if method == "AllocHost" && args[1] == true && args[2] == 1 {
			return errors.New("out of memory")
		}
		return nil
	}
	p := small()
	p.Groups = []string{gpubench.GroupHost}
	ms := run(t, d, gpubench.Options{Plan: p})
	failed := 0
	for _, m := range ms.Results {
		pinnedOn1 := m.Memory == "pinned" && m.HostNUMANode != nil && *m.HostNUMANode == 1
		if pinnedOn1 != (m.Error != "") {
			t.Errorf("%s %s node %v: error %q", m.Test, m.Memory, *m.HostNUMANode, m.Error)
		}
		if m.Error != "" {
			failed++
			if m.Verdict != snapshot.VerdictFailed || !strings.Contains(m.Error, "on NUMA node 1: out of memory") {
				t.Errorf("failed test: verdict %q error %q", m.Verdict, m.Error)
			}
		}
	}
	if failed != 4 {
		t.Errorf("%d failed tests, want 4 (h2d and d2h of two GPUs)", failed)
	}
}

func TestNoGPU(t *testing.T) {
	d := benchtest.New(0)
	_, _, err := gpubench.Run(context.Background(), d, gpubench.Options{Plan: small()})
	if !errors.Is(err, gpubench.ErrNoDriver) {
		t.Fatalf("err %v, want ErrNoDriver", err)
	}
}

func TestChosenDevices(t *testing.T) {
	d := benchtest.New(4, 0)
	p := small()
	p.Groups = []string{gpubench.GroupDevice}
	p.Devices = []int{2, 3}
	ms := run(t, d, gpubench.Options{Plan: p})
	var got []int
	for _, m := range ms.Results {
		got = append(got, m.GPUs...)
	}
	if !slices.Equal(got, []int{2, 3}) {
		t.Errorf("measured GPUs %v, want [2 3]", got)
	}
	p.Devices = []int{7}
	if _, _, err := gpubench.Run(context.Background(), d, gpubench.Options{Plan: p}); err == nil || !strings.Contains(err.Error(), "GPU 7") {
		t.Errorf("GPU 7 of 4: %v", err)
	}
}

// TestStopped: a cancelled run returns what it measured and the reason.
func TestStopped(t *testing.T) {
	d := benchtest.New(2, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := small()
	calls := 0
	ms, _, err := gpubench.Run(ctx, d, gpubench.Options{Plan: p, Progress: func(done, total int, test string) {
		// 8 host tests, 2 device, 2 p2p, 1 bidi, 1 latency.
		if total != 14 {
			t.Errorf("total %d, want 14", total)
		}
		calls++
		if done == 3 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) || len(ms.Results) != 3 {
		t.Fatalf("err %v with %d results, want canceled after 3", err, len(ms.Results))
	}
	if d.Live() != 0 {
		t.Errorf("%d buffers left", d.Live())
	}
}

func TestPlanValidate(t *testing.T) {
	if err := gpubench.DefaultPlan().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*gpubench.Plan){
		"size":    func(p *gpubench.Plan) { p.Bytes = 0 },
		"reps":    func(p *gpubench.Plan) { p.Repetitions = 0 },
		"warmup":  func(p *gpubench.Plan) { p.Warmup = -1 },
		"group":   func(p *gpubench.Plan) { p.Groups = []string{"nvlink"} },
		"device":  func(p *gpubench.Plan) { p.Devices = []int{-1} },
		"latency": func(p *gpubench.Plan) { p.LatencyCopies = 0 },
		"coll":    func(p *gpubench.Plan) { p.CollectiveBytes = 2 },
	} {
		p := gpubench.DefaultPlan()
		mut(&p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestPlacementRefused: where host memory cannot be bound to a node (a
// container without mbind), the GPU's own node is measured from memory the
// kernel placed, marked so, and the other node's tests are left out with a
// note (they would measure the same memory).
func TestPlacementRefused(t *testing.T) {
	d := benchtest.New(1, 0, 1)
	d.Fail = func(method string, args ...any) error {
		if method == "AllocHost" && args[2] != gpubench.AnyNode {
			return fmt.Errorf("%w: mbind: operation not permitted", gpubench.ErrPlacement)
		}
		return nil
	}
	p := small()
	p.Groups = []string{gpubench.GroupHost}
	ms := run(t, d, gpubench.Options{Plan: p})
	for _, m := range ms.Results {
		if m.Error != "" || m.HostNUMANode != nil || m.HostLocal != nil {
			t.Errorf("%+v", m)
		}
	}
	if len(ms.Results) != 4 || len(ms.Notes) != 2 || !strings.Contains(ms.Notes[0], "could not be bound to a GPU's own NUMA node") ||
		!strings.Contains(ms.Notes[1], "could not be bound to NUMA node 1, so transfers from it were not measured") || !strings.Contains(ms.Notes[0], "operation not permitted") {
		t.Errorf("%d results, notes %q", len(ms.Results), ms.Notes)
	}
}

// TestLatencyIsGated: latency runs are queued behind a held stream that is
// opened before every wait, also when a copy fails half way; bandwidth
// runs are never held (a pageable copy behind a gate would never start).
func TestLatencyIsGated(t *testing.T) {
	d := benchtest.New(2, 0)
	p := small()
	run(t, d, gpubench.Options{Plan: p})
	queued, held := d.Gates()
	if want := p.Warmup + p.Repetitions; queued != want || held != 0 {
		t.Errorf("%d gates (%d held), want %d, all opened", queued, held, want)
	}

	d = benchtest.New(2, 0)
	d.Fail = func(method string, args ...any) error {
		if method == "Copy" && args[0].(benchtest.Copy).Seq == 5 {
			return errors.New("copy engine fault")
		}
		return nil
	}
	p.Groups = []string{gpubench.GroupLatency}
	ms := run(t, d, gpubench.Options{Plan: p})
	if _, held := d.Gates(); held != 0 || !strings.Contains(ms.Results[0].Error, "copy engine fault") {
		t.Errorf("%d gates held after a failed copy; result %+v", held, ms.Results[0])
	}

	// A driver that cannot hold a stream: the runs go on and say so.
	d = benchtest.New(2, 0)
	d.Fail = func(method string, args ...any) error {
		if method == "Gate" {
			return errors.New("cuLaunchHostFunc not supported")
		}
		return nil
	}
	ms = run(t, d, gpubench.Options{Plan: p})
	if ms.Results[0].Error != "" || len(ms.Notes) != 1 || !strings.Contains(ms.Notes[0], "not held until queued") {
		t.Errorf("result %+v notes %q", ms.Results[0], ms.Notes)
	}
}
