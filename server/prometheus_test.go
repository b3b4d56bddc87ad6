package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/testenv"
)

// TestPrometheusScrapesServer: a real Prometheus (Debian's, on loopback)
// scrapes the server's /metrics over TLS with an admin's token, and an
// agent's /metrics that replays a recorded 8-GPU machine; PromQL through
// its HTTP API returns kiln's series with their labels, and every query of
// dcgm-exporter's Grafana dashboard (12239) returns data; promtool check
// metrics passes on what the server and the agent expose.
func TestPrometheusScrapesServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus")
	}
	prom := testenv.Need(t, "prometheus", "apt-get install prometheus")
	promtool := testenv.Need(t, "promtool", "apt-get install prometheus")
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second})
	agentLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addAgentWith("hgx", machines(t)["hgx"], nil, 300*time.Millisecond, func(cfg *agent.Config) {
		cfg.Metrics = agent.MetricsConfig{Listener: agentLn, Interval: 200 * time.Millisecond, DCGM: true}
	})
	c.waitNodes(1)
	ctx := context.Background()
	var l api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 3}, &l); err != nil || l.State != api.LeaseGranted {
		t.Fatalf("lease: %v %+v", err, l)
	}

	body, err := c.admin.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	promtoolCheck(t, promtool, "the server's", body)
	agentBody := getBody(t, "http://"+agentLn.Addr().String()+"/metrics")
	// dcgm-exporter's names break Prometheus' naming rules by design
	// (upper case, camelCase labels); promtool holds kiln's own families.
	promtoolCheck(t, promtool, "the agent's", kilnFamilies(agentBody))

	dir := t.TempDir()
	u, err := url.Parse(c.url)
	if err != nil {
		t.Fatal(err)
	}
	ca, token := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "token")
	if err := os.WriteFile(ca, c.srv.CAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte(c.srv.Bootstrap.AdminToken), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, scrape_timeout: 900ms}
scrape_configs:
- job_name: kiln-server
  scheme: https
  authorization: {type: Bearer, credentials_file: %q}
  tls_config: {ca_file: %q}
  static_configs: [{targets: [%q]}]
- job_name: kiln-agent
  static_configs: [{targets: [%q]}]
`, token, ca, u.Host, agentLn.Addr().String())
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var log bytes.Buffer
	cmd := exec.Command(prom, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", log.String())
		}
	})

	// query runs PromQL until it returns a sample for which ok holds.
	query := func(q string, ok func(labels map[string]string, v string) bool) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(q))
			if err != nil {
				last = err.Error()
				continue
			}
			var r struct {
				Status string `json:"status"`
				Data   struct {
					Result []struct {
						Metric map[string]string `json:"metric"`
						Value  [2]any            `json:"value"`
					} `json:"result"`
				} `json:"data"`
			}
			err = json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
			if err != nil || r.Status != "success" {
				last = fmt.Sprintf("%s %v", r.Status, err)
				continue
			}
			for _, s := range r.Data.Result {
				if v, _ := s.Value[1].(string); ok(s.Metric, v) {
					return
				}
			}
			last = fmt.Sprintf("%+v", r.Data.Result)
		}
		t.Errorf("PromQL %s: no sample as expected within 45 s; last answer %s", q, last)
	}
	query(`up{job="kiln-server"}`, func(_ map[string]string, v string) bool { return v == "1" })
	query(`kiln_lease_grants_total`, func(m map[string]string, v string) bool { return m["project"] == "default" && v == "1" })
	query(`kiln_project_gpus_held{project="default"}`, func(_ map[string]string, v string) bool { return v == "3" })
	query(`kiln_node_gpus{kind="free"}`, func(m map[string]string, v string) bool { return m["node"] == "hgx" && v == "5" })
	query(`sum(kiln_project_fair_share_ratio)`, func(_ map[string]string, v string) bool { return v == "1" })
	query(`histogram_quantile(0.99, sum by (le) (rate(kiln_http_request_duration_seconds_bucket{route="/v1/agent/nodes/{node}/heartbeat"}[1m])))`,
		func(_ map[string]string, v string) bool { return v != "NaN" && !strings.HasPrefix(v, "-") })

	// The agent: one info series per GPU, kiln's own families, and
	// dcgm-exporter's names with its labels.
	query(`up{job="kiln-agent"}`, func(_ map[string]string, v string) bool { return v == "1" })
	query(`count(kiln_gpu_info{job="kiln-agent", vendor="nvidia"})`, func(_ map[string]string, v string) bool { return v == "8" })
	query(`count(kiln_gpu_memory_total_bytes > 0)`, func(_ map[string]string, v string) bool { return v == "8" })
	query(`count(DCGM_FI_DEV_FB_FREE{Hostname="hgx"})`, func(_ map[string]string, v string) bool { return v == "8" })
	query(`DCGM_FI_DEV_GPU_TEMP{gpu="0"}`, func(m map[string]string, _ string) bool {
		return strings.HasPrefix(m["UUID"], "GPU-") && m["device"] == "nvidia0" && strings.Contains(m["modelName"], "H100") && m["pci_bus_id"] != ""
	})
	query(`kiln_agent_sample_ok`, func(_ map[string]string, v string) bool { return v == "1" })
	// The profiling readings are there: every GPU says it gives them.
	query(`count(kiln_gpu_tensor_active_ratio)`, func(_ map[string]string, v string) bool { return v == "8" })
	query(`count(kiln_gpu_metric_supported{metric="fans"} == 0)`, func(_ map[string]string, v string) bool { return v == "8" }) // an SXM board has no fan of its own
	query(`count(rate(kiln_gpu_energy_joules_total[10s]) >= 0)`, func(_ map[string]string, v string) bool { return v == "8" })

	// Every query of dashboard 12239, its variables set to every value.
	for _, q := range dashboardQueries(t, "../testdata/grafana/dcgm-exporter-dashboard.json") {
		if strings.HasPrefix(q, "label_values(") {
			metric, label, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(q, "label_values("), ")"), ",")
			label = strings.TrimSpace(label)
			query(fmt.Sprintf("count(count by (%s) (%s))", label, metric), func(_ map[string]string, v string) bool { return v != "0" })
			continue
		}
		query(q, func(_ map[string]string, v string) bool { return v != "NaN" })
	}
}

// dashboardQueries are the PromQL queries of a Grafana dashboard's panels
// and template variables, its variables ($instance, $gpu, ...) made to
// match every value.
func dashboardQueries(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var qs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if tg.Expr != "" {
				qs = append(qs, tg.Expr)
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if json.Unmarshal(v.Query, &q) != nil {
			var o struct {
				Query string `json:"query"`
			}
			if json.Unmarshal(v.Query, &o) != nil {
				continue
			}
			q = o.Query
		}
		qs = append(qs, q)
	}
	if len(qs) < 5 {
		t.Fatalf("%s: %d queries; is it the dashboard?", path, len(qs))
	}
	vars := regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
	for i, q := range qs {
		qs[i] = vars.ReplaceAllString(q, ".+")
	}
	return qs
}

func promtoolCheck(t *testing.T, promtool, what string, body []byte) {
	t.Helper()
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = bytes.NewReader(body)
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on %s metrics: %v\n%s", what, err, out)
	}
}

// kilnFamilies keeps the lines of kiln_ families of a text exposition.
func kilnFamilies(body []byte) []byte {
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(body), "\n") {
		name := line
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name = rest
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name = rest
		}
		if strings.HasPrefix(name, "kiln_") {
			out.WriteString(line)
		}
	}
	return out.Bytes()
}

func getBody(t *testing.T, url string) []byte {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(url)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == 200 && bytes.Contains(b, []byte("kiln_gpu_info")) {
				return b
			}
			err = fmt.Errorf("%s: %v", resp.Status, rerr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
}
