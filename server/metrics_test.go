package server_test

import (
	"context"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// scrape reads /metrics as c, lints it as promtool does, and returns the
// families by name.
func scrape(t *testing.T, c *api.Client) map[string]*dto.MetricFamily {
	t.Helper()
	body, err := c.Metrics(context.Background())
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	problems, err := promlint.New(strings.NewReader(string(body))).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, body)
	}
	return fams
}

// value is the series of the family with exactly these labels (counter,
// gauge, or a histogram's count); NaN when absent.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return math.NaN()
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return math.NaN()
}

// TestServerMetrics: /metrics (an admin's) counts grants, ends by state
// and request latency from what the server did, and shows the projects'
// queue, holdings and fair share and the nodes as they are now; it passes
// promtool's lint, and a member who is not an admin is refused it.
func TestServerMetrics(t *testing.T) {
	t.Parallel()
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second})
	c.addAgent("hgx", machines(t)["hgx"], nil, 300*time.Millisecond)
	c.waitNodes(1)
	c.project("vision", 3)
	ctx := context.Background()
	var held, refused api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 2}, &held); err != nil || held.State != api.LeaseGranted {
		t.Fatalf("lease: %v %+v", err, held)
	}
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "vision", GPUs: 64}, &refused); err != nil || refused.State != api.LeaseRefused {
		t.Fatalf("a lease for 64 GPUs: %v %+v, want refused", err, refused)
	}
	fams := scrape(t, c.admin)
	for _, want := range []struct {
		name   string
		labels []string
		v      float64
	}{
		{"kiln_lease_grants_total", []string{"project", "default"}, 1},
		{"kiln_lease_wait_seconds", []string{"project", "default"}, 1},
		{"kiln_lease_ends_total", []string{"project", "vision", "state", "refused"}, 1},
		{"kiln_lease_refusals_total", []string{"project", "vision", "reason", "never-fits"}, 1},
		{"kiln_project_gpus_held", []string{"project", "default"}, 2},
		{"kiln_project_queued_leases", []string{"project", "vision"}, 0},
		{"kiln_project_fair_share_ratio", []string{"project", "vision"}, 0.75},
		{"kiln_project_fair_share_ratio", []string{"project", "default"}, 0.25},
		{"kiln_node_up", []string{"node", "hgx"}, 1},
		{"kiln_node_gpus", []string{"node", "hgx", "kind", "total"}, 8},
		{"kiln_node_gpus", []string{"node", "hgx", "kind", "free"}, 6},
		{"kiln_nodes", []string{"state", "ready"}, 1},
		{"kiln_http_request_duration_seconds", []string{"route", "/v1/leases", "method", "POST"}, 2},
	} {
		if got := value(fams, want.name, want.labels...); got != want.v {
			t.Errorf("%s%v = %v, want %v", want.name, want.labels, got, want.v)
		}
	}
	if seen := value(fams, "kiln_node_last_seen_timestamp_seconds", "node", "hgx"); math.Abs(seen-float64(time.Now().Unix())) > 10 {
		t.Errorf("hgx last seen at %v, want within 10 s of now", seen)
	}
	resp, err := c.admin.Raw(ctx, http.MethodDelete, "/v1/leases/"+held.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitLease(t, c.admin, held.ID, 10*time.Second, final)
	fams = scrape(t, c.admin)
	if got := value(fams, "kiln_lease_ends_total", "project", "default", "state", "done"); got != 1 {
		t.Errorf("done leases of default: %v, want 1", got)
	}
	if got := value(fams, "kiln_project_gpus_held", "project", "default"); got != 0 {
		t.Errorf("default holds %v GPUs after the release, want 0", got)
	}
	if got := value(fams, "kiln_project_gpu_seconds_total", "project", "default"); !(got > 0) {
		t.Errorf("default's GPU-seconds %v after a lease ended, want more than 0", got)
	}
	member := c.user("ana", "vision")
	if _, err := member.Metrics(ctx); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("a member's scrape: %v, want 403", err)
	}
}
