package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/testenv"
)

// TestPrometheusScrapesServer: a real Prometheus (Debian's, on loopback)
// scrapes the server's /metrics over TLS with an admin's token, and PromQL
// through its HTTP API returns kiln's series with their labels; promtool
// check metrics passes on what the server exposes.
func TestPrometheusScrapesServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus")
	}
	prom := testenv.Need(t, "prometheus", "apt-get install prometheus")
	promtool := testenv.Need(t, "promtool", "apt-get install prometheus")
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second})
	c.addAgent("hgx", machines(t)["hgx"], nil, 300*time.Millisecond)
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
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = bytes.NewReader(body)
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

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
`, token, ca, u.Host)
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
}
