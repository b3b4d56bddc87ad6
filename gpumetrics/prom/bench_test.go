package prom_test

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kiln.dev/kiln/gpumetrics"
	"kiln.dev/kiln/gpumetrics/prom"
	"kiln.dev/kiln/snapshot"
)

// hgx is the recorded 8-GPU machine with a process of one lease on each
// GPU, as an agent running eight one-GPU leases samples it.
func hgx(b testing.TB) gpumetrics.Input {
	return withLeases(sample(b, "../../testdata/captures/nvidia-smi-q/h100x8-535.161.08-hw-power-brake.txt"))
}

// withLeases puts a process of one lease on each GPU.
func withLeases(in gpumetrics.Input) gpumetrics.Input {
	in.Cgroups = map[int]string{}
	for i := range in.Snapshot.GPUs {
		g := &in.Snapshot.GPUs[i]
		pid := 1000 + i
		g.ProcessList = []snapshot.GPUProcess{{PID: pid, MemoryBytes: snapshot.Ptr(uint64(1 << 30)), SMPercent: snapshot.Ptr(50.0)}}
		id := fmt.Sprintf("l-%d", i)
		in.Leases = append(in.Leases, gpumetrics.Lease{ID: id, Project: "p", User: "u", Cgroups: []string{"/kiln/job-" + id}})
		in.Cgroups[pid] = "/kiln/job-" + id
	}
	return in
}

// BenchmarkScrape8GPU: one scrape of an 8-GPU agent's /metrics (kiln's
// families and dcgm-exporter's), through the HTTP handler the agent uses.
func BenchmarkScrape8GPU(b *testing.B) {
	c := prom.New()
	if err := c.Set(gpumetrics.Families(hgx(b), gpumetrics.Options{DCGM: true}), time.Now(), time.Millisecond); err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	req := httptest.NewRequest("GET", "/metrics", nil)
	var size int
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		size = w.Body.Len()
	}
	b.ReportMetric(float64(size), "bytes/scrape")
}

// BenchmarkSample8GPU: what the agent does with each sample of an 8-GPU
// node, off the scrape path: the families and their metrics.
func BenchmarkSample8GPU(b *testing.B) {
	in := hgx(b)
	c := prom.New()
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Set(gpumetrics.Families(in, gpumetrics.Options{DCGM: true}), time.Now(), 0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSeriesBudget: the series an 8-GPU node gives, with a lease on each
// GPU, stay within a budget that a fleet's Prometheus can plan for: 90
// per GPU and 5 per lease (1,000 8-GPU nodes: under 760,000 series), on
// a recorded HGX H100 (18 NVLinks a GPU, counted by state, not one by one)
// and an nvidia-smi capture of one. The throttle reasons take 18 of the
// 90, dcgm-exporter's names about 25, kiln_gpu_metric_supported one per
// reading a GPU lacks.
func TestSeriesBudget(t *testing.T) {
	for _, in := range []gpumetrics.Input{hgx(t), withLeases(sample(t, "../../testdata/fixtures/h100-hgx8-sysfs"))} {
		fams := gpumetrics.Families(in, gpumetrics.Options{DCGM: true})
		n := 0
		for _, f := range fams {
			n += len(f.Series)
		}
		budget := 90*len(in.Snapshot.GPUs) + 5*len(in.Leases)
		t.Logf("%s: %d series for %d GPUs and %d leases (budget %d)", in.Snapshot.Host.Hostname, n, len(in.Snapshot.GPUs), len(in.Leases), budget)
		if n > budget {
			t.Errorf("%s: %d series, over the budget of %d", in.Snapshot.Host.Hostname, n, budget)
		}
	}
	in := hgx(t)
	n := 0
	for _, f := range gpumetrics.Families(in, gpumetrics.Options{DCGM: true}) {
		n += len(f.Series)
	}
	// A series count that grows with the samples (a label that changes)
	// would show as a second sample of the same node giving more.
	again := gpumetrics.Families(in, gpumetrics.Options{DCGM: true})
	m := 0
	for _, f := range again {
		m += len(f.Series)
	}
	if m != n {
		t.Errorf("a second sample gives %d series, the first %d", m, n)
	}
}
