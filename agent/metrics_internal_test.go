package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/process"
	"kiln.dev/kiln/gpumetrics"
	"kiln.dev/kiln/gpumetrics/prom"
	"kiln.dev/kiln/snapshot"
)

// cgroupHandle is a running job in a cgroup.
type cgroupHandle struct{ dir string }

func (cgroupHandle) Logs() io.ReadCloser                         { return io.NopCloser(nil) }
func (cgroupHandle) Wait(context.Context) (executor.Exit, error) { return executor.Exit{}, nil }
func (cgroupHandle) Stop(context.Context, time.Duration) error   { return nil }
func (h cgroupHandle) Cgroup() string                            { return h.dir }

// TestSampleAttributesLeases: a sample divides a GPU's processes between
// the leases whose jobs' cgroups hold them (read from the processes'
// /proc entries), with project and user on kiln_lease_info only; what no
// lease holds is the GPU's unattributed rest.
func TestSampleAttributesLeases(t *testing.T) {
	proc := t.TempDir()
	for pid, cg := range map[string]string{"101": "0::/kiln/job-j1/worker\n", "202": "0::/kiln/job-j2\n", "303": "0::/user.slice/other\n"} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const gib = 1 << 30
	snap := &snapshot.Snapshot{GPUs: []snapshot.GPU{{Index: 0, UUID: "GPU-x", Vendor: snapshot.VendorNVIDIA, MemoryTotalBytes: 80 * gib, MemoryUsedBytes: 10 * gib,
		ProcessList: []snapshot.GPUProcess{{PID: 101, MemoryBytes: snapshot.Ptr(uint64(3 * gib))}, {PID: 202, MemoryBytes: snapshot.Ptr(uint64(2 * gib))},
			{PID: 303, MemoryBytes: snapshot.Ptr(uint64(1 * gib))}, {PID: 404, MemoryBytes: snapshot.Ptr(uint64(1 * gib))}}}}}
	a := &Agent{node: "n1", log: slog.New(slog.NewTextHandler(io.Discard, nil)), snap: snap,
		cfg: Config{Metrics: MetricsConfig{Proc: proc}},
		jobs: map[string]*job{
			"j1": {a: api.Assignment{JobID: "j1", LeaseID: "l-1", Project: "vision", User: "ana"}, h: cgroupHandle{"/sys/fs/cgroup/kiln/job-j1"}},
			"j2": {a: api.Assignment{JobID: "j2", LeaseID: "l-2", Project: "nlp", User: "bo"}, h: cgroupHandle{"/sys/fs/cgroup/kiln/job-j2"}},
		}}
	c := prom.New()
	if err := a.sampleOnce(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP kiln_lease_gpu_memory_used_bytes GPU memory a lease's processes use, by GPU and MIG instance.
# TYPE kiln_lease_gpu_memory_used_bytes gauge
kiln_lease_gpu_memory_used_bytes{gpu="0",lease="l-1",mig_instance="",uuid="GPU-x"} 3.221225472e+09
kiln_lease_gpu_memory_used_bytes{gpu="0",lease="l-2",mig_instance="",uuid="GPU-x"} 2.147483648e+09
# HELP kiln_gpu_unattributed_memory_bytes GPU memory in use that no lease accounts for: the driver's own and processes kiln did not start.
# TYPE kiln_gpu_unattributed_memory_bytes gauge
kiln_gpu_unattributed_memory_bytes{gpu="0",uuid="GPU-x"} 5.36870912e+09
# HELP kiln_gpu_unattributed_processes Processes on the GPU that no lease accounts for.
# TYPE kiln_gpu_unattributed_processes gauge
kiln_gpu_unattributed_processes{gpu="0",uuid="GPU-x"} 2
# HELP kiln_lease_info A lease whose jobs run on the node (1), with its project and user: join on lease for the per-lease series.
# TYPE kiln_lease_info gauge
kiln_lease_info{lease="l-1",project="vision",user="ana"} 1
kiln_lease_info{lease="l-2",project="nlp",user="bo"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "kiln_lease_gpu_memory_used_bytes", "kiln_gpu_unattributed_memory_bytes",
		"kiln_gpu_unattributed_processes", "kiln_lease_info"); err != nil {
		t.Error(err)
	}
}

// TestReadCgroup reads this process's own cgroup v2 path.
func TestReadCgroup(t *testing.T) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil || !strings.Contains(string(b), "0::") {
		t.Skip("no cgroup v2 here")
	}
	got := process.CgroupOf("/proc", os.Getpid())
	if !strings.HasPrefix(got, "/") {
		t.Errorf("CgroupOf(self) = %q, want a path", got)
	}
	if process.CgroupOf("/proc", 1<<30) != "" {
		t.Error("a process that does not exist has a cgroup")
	}
}

// TestSamplesAreValid: what the agent sends with its heartbeats is what the
// server takes: each GPU index once, readings within range (a broken one
// is left out, not sent).
func TestSamplesAreValid(t *testing.T) {
	nan, big, util := 0.0, 1e9, 42.0
	nan = nan / nan
	a := &Agent{snap: &snapshot.Snapshot{GPUs: []snapshot.GPU{
		{Index: 0, UtilizationGPU: &util, MemoryTotalBytes: 80 << 30, MemoryUsedBytes: 1 << 30, Power: &snapshot.Power{DrawW: &big}},
		{Index: 0, UtilizationGPU: &util}, // a partition under the same index
		{Index: 1, UtilizationGPU: &nan, Temperature: &snapshot.Temperature{JunctionC: &util}},
		{Index: 300},
	}}}
	got := a.samples()
	if len(got) != 2 || got[0].GPU != 0 || got[1].GPU != 1 {
		t.Fatalf("samples %+v, want GPUs 0 and 1 once each", got)
	}
	if got[0].Utilization == nil || *got[0].Utilization != 42 || got[0].PowerW != nil || got[0].MemoryUsedBytes == nil {
		t.Errorf("GPU 0: %+v (want 42%%, memory, no impossible power)", got[0])
	}
	if got[1].Utilization != nil || got[1].TemperatureC == nil || *got[1].TemperatureC != 42 {
		t.Errorf("GPU 1: %+v (want no NaN utilization, the junction temperature)", got[1])
	}
}

// TestJobUse: a job's peak GPU memory is the most its processes held at
// once over its GPUs, its mean SM use counts the samples where it had no
// GPU process as idle, and a job on MIG (no per-process SM samples) says
// no SM figure rather than zero.
func TestJobUse(t *testing.T) {
	a := &Agent{}
	jobs := []gpumetrics.Lease{{ID: "j1"}, {ID: "j2"}}
	sm := func(v float64) *float64 { return &v }
	a.accumulate(jobs, []gpumetrics.Use{{Lease: "j1", GPU: 0, MemoryBytes: 2 << 30, SMPercent: sm(80)}, {Lease: "j1", GPU: 1, MemoryBytes: 3 << 30, SMPercent: sm(40)},
		{Lease: "j2", GPU: 2, Instance: "3/0", MemoryBytes: 1 << 30}})
	a.accumulate(jobs, []gpumetrics.Use{{Lease: "j1", GPU: 0, MemoryBytes: 4 << 30, SMPercent: sm(60)}, {Lease: "j2", GPU: 2, Instance: "3/0", MemoryBytes: 2 << 30}})
	a.accumulate(jobs, nil) // both idle
	u1 := a.takeUse("j1")
	if u1 == nil || u1.Samples != 3 || u1.PeakMemoryBytes != 5<<30 || u1.MeanSMPercent == nil || *u1.MeanSMPercent != 60 {
		t.Errorf("j1: %+v (want 3 samples, peak 5 GiB, mean SM (120+60+0)/3 = 60)", u1)
	}
	u2 := a.takeUse("j2")
	if u2 == nil || u2.PeakMemoryBytes != 2<<30 || u2.MeanSMPercent != nil {
		t.Errorf("j2 on MIG: %+v (want peak 2 GiB and no SM figure)", u2)
	}
	if a.takeUse("j1") != nil || a.takeUse("never") != nil {
		t.Error("a job's use is given once, and none for a job no sample saw")
	}
}

// TestOlderServer: a server older than the agent refuses the fields it does
// not know; the agent leaves such a field out from then on, and takes no
// other refusal for that.
func TestOlderServer(t *testing.T) {
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	old := &api.Error{Status: 400, Message: `request body: json: unknown field "samples"`}
	if !a.refusesField(old, "samples") || !a.olderServer("samples") {
		t.Error("an older server's refusal of samples was not taken as such")
	}
	if a.olderServer("gpu") {
		t.Error("a field the server did not refuse is left out")
	}
	for _, err := range []error{
		&api.Error{Status: 400, Message: `samples: GPU index 3 out of range or twice`},
		&api.Error{Status: 500, Message: `unknown field "gpu"`},
		errors.New(`unknown field "gpu"`),
	} {
		if a.refusesField(err, "gpu") {
			t.Errorf("%v taken for an older server", err)
		}
	}
	if a.olderServer("gpu") {
		t.Error("gpu left out after refusals of other kinds")
	}
}

// TestMetricsToken: with a token, a scrape without it, or with another,
// gets nothing; with it, the series.
func TestMetricsToken(t *testing.T) {
	c := prom.New()
	if err := c.Set(nil, time.Now(), 0); err != nil {
		t.Fatal(err)
	}
	h := metricsHandler(c, "s3cret-token-0123456789")
	for _, tc := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer wrong-token-0123456789", 401}, {"Basic czNjcmV0", 401}, {"Bearer s3cret-token-0123456789", 200}} {
		req := httptest.NewRequest("GET", "/metrics", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != tc.want || (tc.want == 401 && strings.Contains(w.Body.String(), "kiln_agent_samples_total")) {
			t.Errorf("Authorization %q: %d %q, want %d", tc.auth, w.Code, w.Body.String(), tc.want)
		}
	}
	w := httptest.NewRecorder()
	metricsHandler(c, "").ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 || !strings.Contains(w.Body.String(), "kiln_agent_samples_total") {
		t.Errorf("without a token the endpoint is open: %d", w.Code)
	}
}
