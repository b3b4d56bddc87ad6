// Package prom serves gpumetrics' families as a Prometheus collector: the
// agent sets the families of each new sample (made off the scrape path), and
// a scrape only copies the last set out. A scrape never reads hardware.
package prom

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln.dev/kiln/gpumetrics"
)

// Collector holds the metrics of the last sample. It is an unchecked
// collector (it describes nothing up front): the families differ from node
// to node and a GPU can go away between samples.
type Collector struct {
	mu      sync.RWMutex
	metrics []prometheus.Metric
	at      time.Time
	took    time.Duration
	samples float64
	errs    float64
	lastErr bool

	sampleAt   *prometheus.Desc
	sampleTook *prometheus.Desc
	sampleN    *prometheus.Desc
	sampleErrs *prometheus.Desc
	sampleOK   *prometheus.Desc
}

// New returns an empty collector.
func New() *Collector {
	return &Collector{
		sampleAt:   prometheus.NewDesc("kiln_agent_sample_timestamp_seconds", "When the agent last sampled its node (Unix time).", nil, nil),
		sampleTook: prometheus.NewDesc("kiln_agent_sample_duration_seconds", "How long the agent's last sample of its node took.", nil, nil),
		sampleN:    prometheus.NewDesc("kiln_agent_samples_total", "Samples the agent took of its node.", nil, nil),
		sampleErrs: prometheus.NewDesc("kiln_agent_sample_errors_total", "Samples of the node that failed (the series keep the last good sample's values).", nil, nil),
		sampleOK:   prometheus.NewDesc("kiln_agent_sample_ok", "1 when the agent's last sample of its node worked.", nil, nil),
	}
}

// Set replaces the families with those of a sample taken at at that took
// took. The metrics are made here, so a scrape does not make them.
func (c *Collector) Set(fams []gpumetrics.Family, at time.Time, took time.Duration) error {
	ms, err := Metrics(fams)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.metrics, c.at, c.took = ms, at, took
	c.samples++
	c.lastErr = false
	c.mu.Unlock()
	return nil
}

// Failed counts a sample that failed; the last good values stay.
func (c *Collector) Failed() {
	c.mu.Lock()
	c.samples++
	c.errs++
	c.lastErr = true
	c.mu.Unlock()
}

// Metrics turns families into Prometheus metrics.
func Metrics(fams []gpumetrics.Family) ([]prometheus.Metric, error) {
	var out []prometheus.Metric
	for _, f := range fams {
		d := prometheus.NewDesc(f.Name, f.Help, f.Labels, nil)
		vt := prometheus.GaugeValue
		if f.Kind == gpumetrics.Counter {
			vt = prometheus.CounterValue
		}
		for _, s := range f.Series {
			m, err := prometheus.NewConstMetric(d, vt, s.Value, s.Values...)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// Describe describes nothing: the collector is unchecked.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

// Collect sends the last sample's metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, m := range c.metrics {
		ch <- m
	}
	ok := 1.0
	if c.lastErr {
		ok = 0
	}
	ch <- prometheus.MustNewConstMetric(c.sampleN, prometheus.CounterValue, c.samples)
	ch <- prometheus.MustNewConstMetric(c.sampleErrs, prometheus.CounterValue, c.errs)
	ch <- prometheus.MustNewConstMetric(c.sampleOK, prometheus.GaugeValue, ok)
	if !c.at.IsZero() {
		ch <- prometheus.MustNewConstMetric(c.sampleAt, prometheus.GaugeValue, float64(c.at.UnixNano())/1e9)
		ch <- prometheus.MustNewConstMetric(c.sampleTook, prometheus.GaugeValue, c.took.Seconds())
	}
}
