package server_test

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kiln.dev/kiln/placement"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// BenchmarkLeaseGrantRelease measures lease request -> grant -> release
// over TLS on loopback while 1,000 simulated agents (8 GPUs each, each on
// its own TLS connection) heartbeat as kiln agent does: a heartbeat the
// server holds up to the agent's 5 s interval. The agents run in a second
// process and the users in a third (this test binary started again), as
// they run on other machines: the server's process holds the server
// alone. Run:
//
//	go test -run '^$' -bench LeaseGrantRelease -cpu 2 -benchtime 20000x ./server
//
// It runs b.N grant-release pairs twice. First 32 users ask again as soon
// as they are answered: grants/s is the server's top speed and
// p99-ms-32users the p99 of one request (a grant or a release) at that
// speed, with 32 requests always in line. Then the same number of pairs
// arrive at a fixed rate (KILN_BENCH_RATE, default 2,000 grants/s):
// p99-ms@RATE counts each request from the moment it was due, so a stall
// of the server is charged in full, and %late is the share over 20 ms.
// heartbeats/s counts the agents' heartbeats answered during the first run;
// server-cpu-µs/pair@rate is the CPU time the server's process spent per
// pair during the fixed-rate run (what leaves room for its collector).
//
// KILN_BENCH_BEATS=1s makes every agent send a plain heartbeat each second
// instead (about five times the requests); KILN_BENCH_PLACER=first-fit
// places with placement.FirstFit instead of the sched engine; KILN_BENCH_CPUPROFILE
// writes a CPU profile of the server's process during the measured part;
// KILN_BENCH_HEAPPROFILE writes the server process's heap profile after
// the fixed-rate run (what it still holds); KILN_BENCH_DUMP writes the fixed-rate run's latencies, one line per pair
// (due time, grant and release latency in microseconds).
func BenchmarkLeaseGrantRelease(b *testing.B) {
	agents := 1000
	if testing.Short() {
		agents = 100
	}
	// The server runs with the collector kiln server sets (server.TuneGC).
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(server.GCPercent))
	}
	// The fleet joins from one address, faster than the limit on requests
	// without credentials allows a source.
	cfg := server.Config{HeartbeatTimeout: 30 * time.Second, UnauthRate: 1e6, UnauthBurst: 1 << 20}
	// Agents heartbeat as kiln agent does (held by the server up to the
	// agent's 5 s interval); KILN_BENCH_BEATS=1s makes each send a plain
	// heartbeat every second instead, five times the requests.
	plainBeats, agentInterval := false, 5*time.Second
	switch v := os.Getenv("KILN_BENCH_BEATS"); v {
	case "", "agent":
	case "1s":
		plainBeats, agentInterval = true, time.Second
	default:
		b.Fatalf("KILN_BENCH_BEATS=%q: want agent or 1s", v)
	}
	if v := os.Getenv("KILN_BENCH_GAP"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("KILN_BENCH_GAP=%q: want a duration", v)
		}
		cfg.CommitGap = d
	}
	if os.Getenv("KILN_BENCH_PLACER") == "first-fit" {
		cfg.Placer = placement.FirstFit{}
	}
	c := newCluster(b, cfg)
	// The agents run in a process of their own, as they run on machines of
	// their own: the server's collector does not walk their connections.
	var jt api.JoinToken
	if err := c.admin.Do(context.Background(), "POST", "/v1/join-tokens", api.JoinTokenRequest{Uses: agents}, &jt); err != nil {
		b.Fatal(err)
	}
	fleet := startAgents(b, benchAgents{URL: c.url, CAPEM: string(c.srv.CAPEM()), JoinToken: jt.Secret, CAFingerprint: c.srv.CAFingerprint(),
		AdminToken: c.srv.Bootstrap.AdminToken, Count: agents, Plain: plainBeats, Interval: agentInterval})
	defer fleet.stop()
	time.Sleep(agentInterval + time.Second) // every agent heartbeats from here on
	// 32 users, each with a connection of its own (HTTP/2 over TLS, kept
	// alive), ask for one GPU and release it, again and again. They run in
	// a third process: users are on machines other than the server's and
	// the agents', and the collector of a process holding 1,000 agents'
	// connections would stop the users' clocks as well.
	const clients = 32
	users := startAgents(b, benchAgents{URL: c.url, CAPEM: string(c.srv.CAPEM()), AdminToken: c.srv.Bootstrap.AdminToken})
	defer users.stop()
	if err := users.do(fmt.Sprintf("users %d", clients)); err != nil {
		b.Fatal(err)
	}
	rate := 2000.0
	if v := os.Getenv("KILN_BENCH_RATE"); v != "" {
		if _, err := fmt.Sscan(v, &rate); err != nil || rate <= 0 {
			b.Fatalf("KILN_BENCH_RATE=%q: want a positive number of grants per second", v)
		}
	}
	b.ResetTimer()
	beats0 := fleet.beats()
	start := time.Now()
	closed, err := users.run(fmt.Sprintf("closed %d", b.N))
	if err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	beats1 := fleet.beats()
	// The same requests offered at a fixed rate, as users arrive: each
	// latency runs from the moment the request was due, so a server that
	// falls behind is charged for the wait (no coordinated omission).
	if f := os.Getenv("KILN_BENCH_CPUPROFILE"); f != "" {
		// A CPU profile of the fixed-rate part alone (-cpuprofile would
		// include the agents joining and the closed loop).
		pf, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			b.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if f := os.Getenv("KILN_BENCH_TRACE"); f != "" {
		// An execution trace of the fixed-rate part alone (go tool trace):
		// where a late request waited, the collector's cycles, the
		// server's lock.
		tf, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		defer tf.Close()
		if err := trace.Start(tf); err != nil {
			b.Fatal(err)
		}
		defer trace.Stop()
	}
	cpu0 := processCPU()
	open, err := users.run(fmt.Sprintf("open %d %g", b.N, rate))
	cpuOpen := processCPU() - cpu0
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if f := os.Getenv("KILN_BENCH_HEAPPROFILE"); f != "" {
		if err := writeHeapProfile(f); err != nil {
			b.Error(err)
		}
	}
	if f := os.Getenv("KILN_BENCH_DUMP"); f != "" {
		if err := dumpOpen(f, open, rate); err != nil {
			b.Error(err)
		}
	}
	late := 0
	for _, d := range open.lat {
		if d > 20*time.Millisecond {
			late++
		}
	}
	p99 := func(lat []time.Duration) float64 {
		if len(lat) == 0 {
			return 0
		}
		lat = append([]time.Duration(nil), lat...)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		return float64(lat[len(lat)*99/100].Microseconds()) / 1000
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "grants/s")
	b.ReportMetric(p99(closed.lat), "p99-ms-32users")
	b.ReportMetric(p99(open.lat), fmt.Sprintf("p99-ms@%.0f/s", rate))
	b.ReportMetric(float64(late)/float64(len(open.lat))*100, "%late")
	b.ReportMetric(float64(beats1-beats0)/elapsed.Seconds(), "heartbeats/s")
	b.ReportMetric(float64(cpuOpen.Microseconds())/float64(b.N), "server-cpu-µs/pair@rate")
}

// processCPU is the CPU time this process (the server's) used so far, user
// and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// dumpOpen writes the fixed-rate run's latencies, one line per pair: due
// time from the start, grant and release latency, in microseconds; the
// first line gives the start in this process's time, to line it up with
// GODEBUG=gctrace=1.
// writeHeapProfile writes the heap profile of this process after a
// collection, so that it shows what is live.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func dumpOpen(path string, r runResult, rate float64) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	interval := time.Duration(float64(time.Second) / rate)
	fmt.Fprintf(out, "# start %d\n", r.start.Sub(processStart).Microseconds())
	for k := 0; 2*k+1 < len(r.lat); k++ {
		fmt.Fprintf(out, "%d %d %d\n", (time.Duration(k) * interval).Microseconds(), r.lat[2*k].Microseconds(), r.lat[2*k+1].Microseconds())
	}
	return nil
}

// grantRelease asks for one GPU and releases it; it returns the two
// request latencies.
func grantRelease(ctx context.Context, u *api.Client) (grant, release time.Duration, err error) {
	t0 := time.Now()
	var l api.Lease
	if err := u.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1}, &l); err != nil {
		return 0, 0, err
	}
	t1 := time.Now()
	if l.State != api.LeaseGranted {
		// Every GPU was held: the server fell so far behind the offered
		// rate that more leases were open than the cluster has GPUs.
		return 0, 0, fmt.Errorf("lease %s %s (the server fell behind the offered load): %s", l.ID, l.State, l.Reason)
	}
	resp, err := u.Raw(ctx, http.MethodDelete, "/v1/leases/"+l.ID, nil)
	if err != nil {
		return 0, 0, err
	}
	resp.Body.Close()
	return t1.Sub(t0), time.Since(t1), nil
}

// grantReleaseClosed runs n grant-release pairs with every user asking
// again as soon as the last answer came (the server's top speed); it
// returns every request's latency.
func grantReleaseClosed(ctx context.Context, users []*api.Client, n int) ([]time.Duration, error) {
	var lat []time.Duration
	var mu sync.Mutex
	var first error
	var next atomic.Int64
	var cw sync.WaitGroup
	for _, u := range users {
		cw.Add(1)
		go func(u *api.Client) {
			defer cw.Done()
			var mine []time.Duration
			for next.Add(1) <= int64(n) {
				g, r, err := grantRelease(ctx, u)
				if err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
					return
				}
				mine = append(mine, g, r)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}(u)
	}
	cw.Wait()
	return lat, first
}

// grantReleaseOpen starts n grant-release pairs at rate per second,
// spread over the users' connections, whether or not earlier ones have
// been answered. A grant's latency counts from the moment it was due; a
// release is sent when its grant arrives. It returns the latencies, pair
// by pair in order, and when it started.
func grantReleaseOpen(ctx context.Context, users []*api.Client, n int, rate float64) ([]time.Duration, time.Time, error) {
	lat := make([]time.Duration, 2*n)
	var mu sync.Mutex
	var first error
	var cw sync.WaitGroup
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	for k := 0; k < n; k++ {
		due := start.Add(time.Duration(k) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		cw.Add(1)
		go func(k int, due time.Time) {
			defer cw.Done()
			behind := time.Since(due)
			g, r, err := grantRelease(ctx, users[k%len(users)])
			if err != nil {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
				return
			}
			lat[2*k], lat[2*k+1] = behind+g, r
		}(k, due)
	}
	cw.Wait()
	return lat, start, first
}

// processStart lines a dump up with the times GODEBUG=gctrace=1 prints.
var processStart = time.Now()
