package agent

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/process"
	"kiln.dev/kiln/gpumetrics"
	"kiln.dev/kiln/gpumetrics/prom"
	"kiln.dev/kiln/snapshot"
)

// MetricsConfig sets up the agent's sampling of its node and its
// Prometheus endpoint. The agent samples when it has a Listener or a
// Sample: the samples feed the heartbeats' readings (the web page) and
// what each job used of its GPUs, whether or not /metrics is served.
type MetricsConfig struct {
	// Listener serves /metrics; nil: the agent serves no metrics.
	Listener net.Listener
	// Interval is how often the node is sampled (default 5s). A scrape
	// reads the last sample; it never reads hardware.
	Interval time.Duration
	// Sample reads the node's changing values on the last full
	// discovery's Snapshot (discover.Resample over an NVMLSampler on a
	// live NVIDIA node); nil: the last full discovery as it is (a
	// recorded machine).
	Sample func(ctx context.Context, base *snapshot.Snapshot) (*snapshot.Snapshot, error)
	// DCGM adds dcgm-exporter's names for NVIDIA GPUs.
	DCGM bool
	// Proc is where the processes' cgroups are read (/proc when empty):
	// PID/cgroup for each process a GPU lists.
	Proc string
	// Token, when set, is the bearer token a scrape must send. The
	// per-lease series name the node's leases, projects and users: a
	// job on the node reaches the agent's port too.
	Token string
}

// metricsHandler serves the collector's metrics, on a registry of their
// own; with a token, only to a scrape that sends it.
func metricsHandler(c *prom.Collector, token string) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kiln agent metrics"`)
				http.Error(w, "this node's metrics need its bearer token (kiln agent --metrics-token-file)", http.StatusUnauthorized)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
	return mux
}

// serveMetrics samples the node on its interval and serves /metrics until
// ctx ends.
func (a *Agent) serveMetrics(ctx context.Context) {
	mc := a.cfg.Metrics
	var c *prom.Collector
	if mc.Listener != nil {
		c = prom.New()
		srv := &http.Server{Handler: metricsHandler(c, mc.Token), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
			BaseContext: func(net.Listener) context.Context { return ctx }}
		go func() {
			<-ctx.Done()
			shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(shut)
		}()
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			if err := srv.Serve(mc.Listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Warn("the metrics endpoint stopped", "err", err)
			}
		}()
	}
	interval := mc.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failing := false
	for {
		if err := a.sampleOnce(ctx, c); err != nil {
			if ctx.Err() != nil {
				return
			}
			if c != nil {
				c.Failed()
			}
			if !failing {
				a.log.Warn("sampling the node for metrics failed; the series keep the last sample", "err", err)
			}
			failing = true
		} else {
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleOnce takes one sample: for the heartbeats, the jobs' GPU use and,
// when c is set (the node serves its metrics), into c.
func (a *Agent) sampleOnce(ctx context.Context, c *prom.Collector) error {
	a.mu.Lock()
	base, finds := a.snap, a.finds
	a.mu.Unlock()
	if base == nil {
		return errors.New("the node was not discovered yet")
	}
	start := time.Now()
	s := base
	if f := a.cfg.Metrics.Sample; f != nil {
		var err error
		if s, err = f(ctx, base); err != nil {
			return fmt.Errorf("sampling the node: %w", err)
		}
	}
	a.mu.Lock()
	a.sampled = s
	a.mu.Unlock()
	leases, jobs := a.leaseCgroups()
	in := gpumetrics.Input{Snapshot: s, Findings: findingsOf(finds), Hostname: a.node, Leases: leases}
	if len(leases) > 0 {
		in.Cgroups = processCgroups(a.cfg.Metrics.Proc, s)
		// Each job's own share, for what it used at its end.
		uses, _ := gpumetrics.Attribute(s, jobs, in.Cgroups)
		a.accumulate(jobs, uses)
	}
	if c == nil {
		return nil // nobody scrapes: the families would be made for nothing
	}
	return c.Set(gpumetrics.Families(in, gpumetrics.Options{DCGM: a.cfg.Metrics.DCGM}), start, time.Since(start))
}

// cgroupMount is where the cgroup v2 hierarchy is mounted: a job's cgroup
// directory below it is the path /proc/PID/cgroup gives.
const cgroupMount = "/sys/fs/cgroup"

// leaseCgroups are the leases of the jobs running here, each with the
// cgroups of its jobs (those the executor gave one), and the jobs with a
// cgroup, each as a lease of its own (named by the job).
func (a *Agent) leaseCgroups() (leases, jobs []gpumetrics.Lease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	byID := map[string]*gpumetrics.Lease{}
	var order []string
	for id, j := range a.jobs {
		l := byID[j.a.LeaseID]
		if l == nil {
			l = &gpumetrics.Lease{ID: j.a.LeaseID, Project: j.a.Project, User: j.a.User}
			byID[j.a.LeaseID] = l
			order = append(order, j.a.LeaseID)
		}
		if c, ok := j.h.(executor.Cgrouped); ok && j.h != nil {
			if dir := c.Cgroup(); dir != "" {
				if rel, ok := strings.CutPrefix(dir, cgroupMount); ok && rel != "" {
					l.Cgroups = append(l.Cgroups, rel)
					jobs = append(jobs, gpumetrics.Lease{ID: id, Cgroups: []string{rel}})
				}
			}
		}
	}
	sort.Strings(order)
	leases = make([]gpumetrics.Lease, 0, len(order))
	for _, id := range order {
		leases = append(leases, *byID[id])
	}
	sort.Slice(jobs, func(i, k int) bool { return jobs[i].ID < jobs[k].ID })
	return leases, jobs
}

// jobUse adds up what a job used in the samples taken while it ran.
type jobUse struct {
	samples int
	peak    uint64
	smSum   float64
	smN     int
	sawSM   bool
}

// accumulate adds one sample's uses to each running job's; a job with no
// process on a GPU in the sample used nothing then.
func (a *Agent) accumulate(jobs []gpumetrics.Lease, uses []gpumetrics.Use) {
	mem, sm, hasSM := map[string]uint64{}, map[string]float64{}, map[string]bool{}
	for _, u := range uses {
		mem[u.Lease] += u.MemoryBytes
		if u.SMPercent != nil {
			sm[u.Lease] += *u.SMPercent
			hasSM[u.Lease] = true
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.use == nil {
		a.use = map[string]*jobUse{}
	}
	for _, j := range jobs {
		u := a.use[j.ID]
		if u == nil {
			u = &jobUse{}
			a.use[j.ID] = u
		}
		u.samples++
		u.peak = max(u.peak, mem[j.ID])
		if hasSM[j.ID] || mem[j.ID] == 0 {
			// No process on a GPU is no SM use; a process the driver does
			// not sample (MIG) says nothing.
			u.smSum += sm[j.ID]
			u.smN++
			u.sawSM = u.sawSM || hasSM[j.ID]
		}
	}
}

// takeUse is what a job used, for its exit report, and forgets it; nil
// when no sample saw it run.
func (a *Agent) takeUse(job string) *api.GPUUse {
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.use[job]
	delete(a.use, job)
	if u == nil || u.samples == 0 {
		return nil
	}
	interval := a.cfg.Metrics.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	// Held to what the server takes: a refused exit report would leave
	// the job running in its view.
	out := &api.GPUUse{PeakMemoryBytes: min(u.peak, 1<<50), Samples: u.samples, SampleSeconds: min(interval.Seconds(), 86400)}
	if u.sawSM && u.smN > 0 {
		m := min(max(u.smSum/float64(u.smN), 0), 100*256)
		out.MeanSMPercent = &m
	}
	return out
}

// processCgroups reads the cgroup v2 path of every process a GPU of s
// lists; a process that is gone, or in another PID namespace than the
// agent's /proc, is left out (its use is nobody's lease's).
func processCgroups(proc string, s *snapshot.Snapshot) map[int]string {
	if proc == "" {
		proc = "/proc"
	}
	out := map[int]string{}
	for _, g := range s.GPUs {
		for _, p := range g.ProcessList {
			if _, done := out[p.PID]; done || p.PID <= 0 {
				continue
			}
			if c := process.CgroupOf(proc, p.PID); c != "" {
				out[p.PID] = c
			}
		}
	}
	return out
}

// samples are the GPUs' last readings for a heartbeat: the last metrics
// sample's, else the last discovery's.
func (a *Agent) samples() []api.GPUSample {
	a.mu.Lock()
	s := a.sampled
	if s == nil {
		s = a.snap
	}
	a.mu.Unlock()
	if s == nil {
		return nil
	}
	// What the server would refuse (and with it the heartbeat) is left
	// out: a GPU index twice or out of range, a reading out of range.
	within := func(v *float64, lo, hi float64) *float64 {
		if v == nil || !(*v >= lo && *v <= hi) {
			return nil
		}
		return v
	}
	var out []api.GPUSample
	seen := map[int]bool{}
	for _, g := range s.GPUs {
		if g.Index < 0 || g.Index > 255 || seen[g.Index] || len(out) >= 256 {
			continue
		}
		seen[g.Index] = true
		x := api.GPUSample{GPU: g.Index, Utilization: within(g.UtilizationGPU, 0, 100)}
		if g.ProcessesRead || g.Processes > 0 {
			// Zero is a reading only where the processes were listed.
			x.Processes = snapshot.Ptr(min(g.Processes, 4096))
		}
		if g.MemoryTotalBytes > 0 {
			m := g.MemoryUsedBytes
			x.MemoryUsedBytes = &m
		}
		if g.Power != nil {
			x.PowerW = within(g.Power.DrawW, 0, 100000)
		}
		if t := g.Temperature; t != nil {
			for _, v := range []*float64{t.GPUC, t.JunctionC, t.EdgeC} {
				if x.TemperatureC == nil {
					x.TemperatureC = within(v, -273, 1000)
				}
			}
		}
		out = append(out, x)
	}
	return out
}

func findingsOf(fs []api.Finding) []gpumetrics.Finding {
	out := make([]gpumetrics.Finding, 0, len(fs))
	for _, f := range fs {
		out = append(out, gpumetrics.Finding{Check: f.ID, Severity: f.Severity, Devices: f.Devices})
	}
	return out
}
