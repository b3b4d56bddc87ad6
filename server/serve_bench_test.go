package server_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/server/tunneltest"
	"kiln.dev/kiln/serving/enginetest"
)

// TestHelperServeEngine is the engine BenchmarkServeRouting deploys, not a
// test.
func TestHelperServeEngine(t *testing.T) {
	if !enginetest.Wanted(flag.Args()) {
		t.Skip("the engine of BenchmarkServeRouting")
	}
	t.Fatal(enginetest.Main(flag.Args()[1:]))
}

// BenchmarkServeRouting measures what the OpenAI-compatible endpoint costs
// against calling the engine directly, in one run, on loopback: an engine
// (serving/enginetest: a streamed chat completion of five words, a
// millisecond apart) is deployed as a serving lease, and at 1 and 100
// concurrent streams the same requests go to its port directly and through
// /openai/v1/chat/completions (TLS, the token checked, routed by model,
// through the agent's tunnel). It reports the requests per second of each
// and the time added at p50 and p99 to the first token and to the whole
// answer.
//
// Run:
//
//	go test -run '^$' -bench ServeRouting -benchtime 1x ./server
func BenchmarkServeRouting(b *testing.B) {
	c := newCluster(b, server.Config{})
	c.addAgent("n1", machines(b)["pcie"], nil, 200*time.Millisecond)
	c.waitNodes(1)
	alice := c.user("alice", "default")
	ports, err := tunneltest.FreePorts(1)
	if err != nil {
		b.Fatal(err)
	}
	port := ports[0]
	ctx := context.Background()
	model := b.TempDir() // the engine reads the model's folder
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1,
		Job: &api.JobSpec{Command: []string{os.Args[0], "-test.run=^TestHelperServeEngine$", enginetest.Arg, enginetest.Serve, strconv.Itoa(port), "bench", model},
			Ports: []int{port}},
		Serve: &api.ServeSpec{Model: "bench", Port: port, Ready: "/health"}})
	if err != nil {
		b.Fatal(err)
	}
	waitLease(b, alice, l.ID, 30*time.Second, func(l *api.Lease) bool {
		return l.Deployment != nil && l.Deployment.State == api.DeployReady
	})
	const body = `{"model":"bench","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"one two three four"}]}`
	direct := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	directURL := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	endpoint := c.url + "/openai/v1/chat/completions"
	call := func(url string, cl *http.Client, token string) (ttft, total time.Duration, err error) {
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		t0 := time.Now()
		resp, err := cl.Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, 0, fmt.Errorf("%s", resp.Status)
		}
		sc := bufio.NewScanner(resp.Body)
		done := false
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "data: ") && ttft == 0 {
				ttft = time.Since(t0)
			}
			done = done || line == "data: [DONE]"
		}
		if !done {
			return 0, 0, fmt.Errorf("the stream ended without [DONE]")
		}
		return ttft, time.Since(t0), nil
	}
	run := func(url string, cl *http.Client, token string, conc, n int) (ttfts, totals []time.Duration, rps float64) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		t0 := time.Now()
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n {
					f, t, err := call(url, cl, token)
					if err != nil {
						b.Error(err)
						return
					}
					if i >= 3 { // after the connections are open
						mu.Lock()
						ttfts, totals = append(ttfts, f), append(totals, t)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		return ttfts, totals, float64(conc*n) / time.Since(t0).Seconds()
	}
	b.ResetTimer()
	fmt.Printf("%-12s %6s %10s %10s %12s %12s %12s %12s\n", "streams", "conc", "direct/s", "kiln/s", "ttft+p50µs", "ttft+p99µs", "total+p50µs", "total+p99µs")
	for _, conc := range []int{1, 100} {
		n := 1000/conc + 10
		df, dt, drps := run(directURL, direct, "", conc, n)
		kf, kt, krps := run(endpoint, alice.HTTP, alice.Token, conc, n)
		b.ReportMetric(drps, fmt.Sprintf("direct-req/s@%d", conc))
		b.ReportMetric(krps, fmt.Sprintf("endpoint-req/s@%d", conc))
		b.ReportMetric(added(kf, df, 50), fmt.Sprintf("ttft-p50-added-µs@%d", conc))
		b.ReportMetric(added(kf, df, 99), fmt.Sprintf("ttft-p99-added-µs@%d", conc))
		b.ReportMetric(added(kt, dt, 50), fmt.Sprintf("total-p50-added-µs@%d", conc))
		b.ReportMetric(added(kt, dt, 99), fmt.Sprintf("total-p99-added-µs@%d", conc))
		fmt.Printf("%-12s %6d %10.0f %10.0f %12.0f %12.0f %12.0f %12.0f\n", "chat", conc, drps, krps,
			added(kf, df, 50), added(kf, df, 99), added(kt, dt, 50), added(kt, dt, 99))
	}
}
