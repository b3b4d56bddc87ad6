package server

import (
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/lease"
)

// metrics are the server's Prometheus series, on its own registry (never
// the process's default one): counters and histograms fed from the
// changes the server persists and from the requests it answers, and the
// state of the queue, projects and nodes read from the lease core at each
// scrape. Projects and nodes label their own series only: both are named
// by admins and agents the server knows, so their number is bounded.
type metrics struct {
	reg         *prometheus.Registry
	requests    *prometheus.HistogramVec
	grants      *prometheus.CounterVec
	ends        *prometheus.CounterVec
	preemptions *prometheus.CounterVec
	refusals    *prometheus.CounterVec
	wait        *prometheus.HistogramVec
	gpuSeconds  *prometheus.CounterVec
	handler     http.Handler // the scrape, made once
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kiln_http_request_duration_seconds",
			Help:    "Time to answer an API request, by route (its pattern) and method; streams (tunnels, sessions, logs followed) until they end.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30}}, []string{"route", "method"}),
		grants: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_lease_grants_total",
			Help: "Leases granted, by project."}, []string{"project"}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_lease_ends_total",
			Help: "Leases ended, by project and final state (done, cancelled, refused, preempted, expired, lost)."}, []string{"project", "state"}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_lease_preemptions_total",
			Help: "Preemption notices given to leases, by project of the lease preempted."}, []string{"project"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_lease_refusals_total",
			Help: "Leases refused, by project and reason: sandbox, no-pod-nodes, project-max-gpus, project-gpu-hours, image, never-fits."}, []string{"project", "reason"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kiln_lease_wait_seconds",
			Help:    "Time from a lease's request to its grant, by project.",
			Buckets: []float64{.01, .1, 1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600}}, []string{"project"}),
		gpuSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_project_gpu_seconds_total",
			Help: "GPU-seconds of ended leases, by project (what fair share and GPU-hour quotas count)."}, []string{"project"}),
	}
	m.reg.MustRegister(m.requests, m.grants, m.ends, m.preemptions, m.refusals, m.wait, m.gpuSeconds, stateCollector{s})
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
	return m
}

// finalStates are the values of kiln_lease_ends_total's state label.
var finalStates = map[string]bool{api.LeaseDone: true, api.LeaseCancelled: true, api.LeaseRefused: true,
	api.LeasePreempted: true, api.LeaseExpired: true, api.LeaseLost: true}

// observe counts what a batch of changes says happened; s.mu is held.
func (m *metrics) observe(b *lease.Changes) {
	for _, e := range b.Events {
		final, isLease := strings.CutPrefix(e.Kind, "lease.")
		switch {
		case e.Kind == "lease.granted":
			m.grants.WithLabelValues(e.Project).Inc()
			if l := b.Leases[e.Subject]; l != nil && l.GrantedAt != nil {
				m.wait.WithLabelValues(e.Project).Observe(l.GrantedAt.Sub(l.CreatedAt).Seconds())
			}
		case e.Kind == "lease.preempting":
			m.preemptions.WithLabelValues(e.Project).Inc()
		case isLease && finalStates[final]:
			m.ends.WithLabelValues(e.Project, final).Inc()
		}
	}
	for _, u := range b.Usage {
		m.gpuSeconds.WithLabelValues(u.Project).Add(u.Seconds)
	}
	for _, r := range b.Refusals {
		m.refusals.WithLabelValues(r.Project, string(r.Kind)).Inc()
	}
}

// timed records how long the route's handler took.
func (m *metrics) timed(rt route, h http.HandlerFunc) http.HandlerFunc {
	obs := m.requests.WithLabelValues(rt.path, rt.method)
	return func(w http.ResponseWriter, r *http.Request) {
		t := time.Now()
		h(w, r)
		obs.Observe(time.Since(t).Seconds())
	}
}

// serveMetrics answers a scrape (the Prometheus text format, or
// OpenMetrics when asked).
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	s.metrics.handler.ServeHTTP(w, r)
}

// stateCollector reads the queue, the projects and the nodes from the
// lease core when scraped.
type stateCollector struct{ s *Server }

var (
	descQueued   = prometheus.NewDesc("kiln_project_queued_leases", "Leases waiting in the project's queue.", []string{"project"}, nil)
	descHeld     = prometheus.NewDesc("kiln_project_gpus_held", "GPU equivalents the project's leases hold now.", []string{"project"}, nil)
	descLimit    = prometheus.NewDesc("kiln_project_gpus_limit", "GPU equivalents the project may hold at once (absent: no limit).", []string{"project"}, nil)
	descShare    = prometheus.NewDesc("kiln_project_fair_share_ratio", "The project's weight over all projects' weights: its share of the cluster while every project waits.", []string{"project"}, nil)
	descNodes    = prometheus.NewDesc("kiln_nodes", "Nodes known to the server, by state (ready, lost).", []string{"state"}, nil)
	descNodeUp   = prometheus.NewDesc("kiln_node_up", "1 while the node's agent heartbeats in time, 0 when it is lost.", []string{"node"}, nil)
	descLastSeen = prometheus.NewDesc("kiln_node_last_seen_timestamp_seconds", "When the node's agent was last heard from.", []string{"node"}, nil)
	descGPUs     = prometheus.NewDesc("kiln_node_gpus", "GPUs of the node: total, and free for a whole-GPU lease.", []string{"node", "kind"}, nil)
)

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueued, descHeld, descLimit, descShare, descNodes, descNodeUp, descLastSeen, descGPUs} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	projects := c.s.core.Projects(time.Now(), func(string) bool { return true })
	nodes := c.s.core.Nodes()
	c.s.mu.Unlock()
	weights := 0.0
	for _, p := range projects {
		weights += weightOf(p)
	}
	for _, p := range projects {
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(p.QueuedLease), p.Name)
		ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, p.HeldGPUs, p.Name)
		if p.MaxGPUs > 0 {
			ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, p.MaxGPUs, p.Name)
		}
		if weights > 0 {
			ch <- prometheus.MustNewConstMetric(descShare, prometheus.GaugeValue, weightOf(p)/weights, p.Name)
		}
	}
	states := map[string]int{api.NodeReady: 0, api.NodeLost: 0}
	for _, n := range nodes {
		states[n.State]++
		up := 0.0
		if n.State == api.NodeReady {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descNodeUp, prometheus.GaugeValue, up, n.ID)
		ch <- prometheus.MustNewConstMetric(descLastSeen, prometheus.GaugeValue, float64(n.LastSeen.UnixMilli())/1000, n.ID)
		ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(n.Total), n.ID, "total")
		ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, n.Free, n.ID, "free")
	}
	for st, k := range states {
		ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(k), st)
	}
}

// weightOf is a project's weight, 1 when it sets none (as fair share
// counts it).
func weightOf(p api.Project) float64 {
	if p.Weight <= 0 {
		return 1
	}
	return p.Weight
}
