package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/server/tunneltest"
)

// BenchmarkTunnels measures what the way through the server costs against
// reaching the job's ports directly, in one run, on loopback: a job runs
// a TCP echo and an HTTP server, and
//
//   - rtt: a 64-byte echo round trip on an open connection, direct and
//     through a tunnel (what kiln forward carries), with 1 and 100
//     connections at once: p50 and p99 of the time added;
//   - http: a small GET, direct (kept-alive) and through the server's HTTP
//     path (its tunnels kept alive): p50 and p99 added, 1 and 100 at once;
//   - MB/s: 1 GiB each way through the echo, direct and through a tunnel,
//     and the tunnel's share of direct.
//
// Run:
//
//	go test -run '^$' -bench Tunnels -benchtime 1x ./server
func BenchmarkTunnels(b *testing.B) {
	c := newCluster(b, server.Config{})
	c.addAgent("n1", machines(b)["pcie"], nil, 200*time.Millisecond)
	c.waitNodes(1)
	alice := c.user("alice", "default")
	ports, err := tunneltest.FreePorts(2)
	if err != nil {
		b.Fatal(err)
	}
	echoPort, httpPort := ports[0], ports[1]
	ctx := context.Background()
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: portServerJob(echoPort, httpPort)})
	if err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if s, err := alice.ConnectPort(ctx, l.ID, httpPort, "", 0); err == nil {
			s.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the job did not listen")
		}
	}
	direct := func() (io.ReadWriteCloser, error) { return net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", echoPort)) }
	tunnel := func() (io.ReadWriteCloser, error) { return alice.ConnectPort(ctx, l.ID, echoPort, "", 0) }
	b.ResetTimer()
	for _, conc := range []int{1, 100} {
		d := rtts(b, direct, conc, 2000/conc+20)
		t := rtts(b, tunnel, conc, 2000/conc+20)
		b.ReportMetric(added(t, d, 50), fmt.Sprintf("rtt-p50-added-µs@%d", conc))
		b.ReportMetric(added(t, d, 99), fmt.Sprintf("rtt-p99-added-µs@%d", conc))
	}
	directHTTP := &http.Client{}
	url := fmt.Sprintf("http://127.0.0.1:%d/hello", httpPort)
	path := fmt.Sprintf("%s/v1/leases/%s/ports/%d/http/hello", c.url, l.ID, httpPort)
	for _, conc := range []int{1, 100} {
		d := gets(b, func() (*http.Response, error) { return directHTTP.Get(url) }, conc, 1000/conc+10)
		t := gets(b, func() (*http.Response, error) {
			req, _ := http.NewRequest("GET", path, nil)
			req.Header.Set("Authorization", "Bearer "+alice.Token)
			return alice.HTTP.Do(req)
		}, conc, 1000/conc+10)
		b.ReportMetric(added(t, d, 50), fmt.Sprintf("http-p50-added-µs@%d", conc))
		b.ReportMetric(added(t, d, 99), fmt.Sprintf("http-p99-added-µs@%d", conc))
	}
	const gib = 1 << 30
	dr := throughput(b, direct, gib)
	tr := throughput(b, tunnel, gib)
	b.ReportMetric(dr, "direct-MB/s")
	b.ReportMetric(tr, "tunnel-MB/s")
	b.ReportMetric(tr/dr*100, "tunnel-%-of-direct")
}

// rtts opens conc connections and times n echo round trips on each.
func rtts(b *testing.B, open func() (io.ReadWriteCloser, error), conc, n int) []time.Duration {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	for range conc {
		conn, err := open()
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			msg, back := make([]byte, 64), make([]byte, 64)
			var mine []time.Duration
			for i := range n {
				t0 := time.Now()
				if _, err := conn.Write(msg); err != nil {
					b.Error(err)
					return
				}
				if _, err := io.ReadFull(conn, back); err != nil {
					b.Error(err)
					return
				}
				if i >= 10 { // warm
					mine = append(mine, time.Since(t0))
				}
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}

// gets times n requests on each of conc workers.
func gets(b *testing.B, get func() (*http.Response, error), conc, n int) []time.Duration {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := range n {
				t0 := time.Now()
				resp, err := get()
				if err != nil {
					b.Error(err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("GET: %s %s", resp.Status, body)
					return
				}
				if i >= 5 {
					mine = append(mine, time.Since(t0))
				}
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}

// throughput sends size bytes through the echo and reads them back at
// once; it returns MB/s each way.
func throughput(b *testing.B, open func() (io.ReadWriteCloser, error), size int64) float64 {
	conn, err := open()
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 256<<10)
	t0 := time.Now()
	errc := make(chan error, 1)
	go func() {
		var sent int64
		for sent < size {
			n, err := conn.Write(buf[:min(int64(len(buf)), size-sent)])
			if err != nil {
				errc <- err
				return
			}
			sent += int64(n)
		}
		errc <- nil
	}()
	if n, err := io.CopyN(io.Discard, conn, size); err != nil || n != size {
		b.Fatalf("read %d of %d: %v", n, size, err)
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return float64(size) / 1e6 / time.Since(t0).Seconds()
}

// added is the q-th percentile of got less that of base, in µs.
func added(got, base []time.Duration, q int) float64 {
	return float64(pct(got, q)-pct(base, q)) / float64(time.Microsecond)
}

func pct(d []time.Duration, q int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = append([]time.Duration(nil), d...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)*q/100, len(d)-1)]
}
