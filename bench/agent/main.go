// Command agent measures kiln's agent on a recorded 8-GPU machine (the HGX
// H100 fixture) sampling its metrics once a second, as kiln-agent (the
// agent-only build) and as the full kiln: resident memory, CPU share of one
// core, and the time a scrape of /metrics takes, as a table. The goals are
// under 30 MB resident, under 1% of one core and under 5 ms a scrape.
//
//	go run ./bench/agent [-for 30s] [-scrapes 200]
//
// KILN_BENCH_AGENT_ENV=NAME=VALUE sets one variable in both agents'
// environment (GOGC=25, say).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"kiln.dev/kiln/bench/kilnbin"
)

func main() {
	dur := flag.Duration("for", 30*time.Second, "how long each agent's memory and CPU are watched")
	scrapes := flag.Int("scrapes", 200, "scrapes timed")
	flag.Parse()
	dir, err := os.MkdirTemp("", "kiln-bench-agent")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	full, err := kilnbin.Build(dir)
	if err != nil {
		fail(err)
	}
	slim, err := kilnbin.BuildAs(dir, "kiln-agent")
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srvAddr := freeAddr()
	srv := exec.CommandContext(ctx, full, "server", "--data", filepath.Join(dir, "server"), "--listen", srvAddr)
	out, err := srv.StdoutPipe()
	if err != nil {
		fail(err)
	}
	srv.Stderr = io.Discard
	if err := srv.Start(); err != nil {
		fail(err)
	}
	defer func() { cancel(); _ = srv.Wait() }()
	join := regexp.MustCompile(`kiln join (\S+) --token (\S+) --ca-sha256 (\S+)`)
	var m []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if m = join.FindStringSubmatch(sc.Text()); m != nil {
			break
		}
	}
	if m == nil {
		fail(fmt.Errorf("the server printed no join command"))
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	// Each binary joins as a node of its own; the server's first join
	// token joins one node, so the second asks for another.
	cfgFile := filepath.Join(dir, "server", "admin-client.json")
	tok := exec.Command(full, "token", "join")
	tok.Env = append(os.Environ(), "KILN_CONFIG="+cfgFile)
	second, err := tok.Output()
	if err != nil {
		fail(fmt.Errorf("kiln token join: %w", err))
	}
	m2 := join.FindStringSubmatch(string(second))
	if m2 == nil {
		fail(fmt.Errorf("kiln token join printed no join command: %s", second))
	}
	fmt.Printf("%-44s %12s %12s %10s\n", "agent, 8 recorded GPUs, 1 sample/s", "kiln-agent", "kiln", "goal")
	a := measure(ctx, slim, m, filepath.Join(dir, "slim"), "hgx-slim", *dur, *scrapes)
	b := measure(ctx, full, m2, filepath.Join(dir, "full"), "hgx-full", *dur, *scrapes)
	row := func(name, format string, x, y float64, goal string) {
		fmt.Printf("%-44s %12s %12s %10s\n", name, fmt.Sprintf(format, x), fmt.Sprintf(format, y), goal)
	}
	row("binary size (MB)", "%.1f", a.binMB, b.binMB, "")
	row("resident memory, peak (MB)", "%.1f", a.peakMB, b.peakMB, "< 30")
	row("  of it the heap and stacks (RssAnon, MB)", "%.1f", a.anonMB, b.anonMB, "")
	row("  of it the binary's pages (RssFile, MB)", "%.1f", a.fileMB, b.fileMB, "")
	row(fmt.Sprintf("CPU, %% of one core over %s", *dur), "%.2f", a.cpuPct, b.cpuPct, "< 1")
	row(fmt.Sprintf("scrape p50 (ms, %d scrapes)", *scrapes), "%.2f", a.p50, b.p50, "< 5")
	row("scrape p99 (ms)", "%.2f", a.p99, b.p99, "")
	row("scrape size (bytes)", "%.0f", a.size, b.size, "")
}

type result struct {
	binMB, peakMB, anonMB, fileMB, cpuPct, p50, p99, size float64
}

// measure joins bin as an agent with join's URL, token and CA
// fingerprint, replaying the HGX fixture, and watches it.
func measure(ctx context.Context, bin string, join []string, state, node string, dur time.Duration, scrapes int) result {
	metricsAddr := freeAddr()
	agent := exec.CommandContext(ctx, bin, "join", join[1], "--token", join[2], "--ca-sha256", join[3], "--node", node,
		"--state", state, "--job-dir", state+"-jobs",
		"--from", "testdata/fixtures/h100-hgx8-sysfs", "--metrics-addr", metricsAddr, "--metrics-interval", "1s")
	agent.Stdout, agent.Stderr = io.Discard, io.Discard
	agent.Env = append(os.Environ(), os.Getenv("KILN_BENCH_AGENT_ENV"))
	if err := agent.Start(); err != nil {
		fail(err)
	}
	defer func() { _ = agent.Process.Kill(); _ = agent.Wait() }()
	url := "http://" + metricsAddr + "/metrics"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			fail(fmt.Errorf("%s: the agent's /metrics did not answer within 30 s", bin))
		}
	}
	time.Sleep(3 * time.Second) // past start-up
	pid := agent.Process.Pid
	cpu0, t0 := cpuTime(pid), time.Now()
	var r result
	var parts map[string]int64
	for end := time.Now().Add(dur); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		parts = status(pid)
		r.peakMB = max(r.peakMB, float64(parts["VmRSS"])/1e6)
	}
	r.anonMB, r.fileMB = float64(parts["RssAnon"])/1e6, float64(parts["RssFile"])/1e6
	r.cpuPct = (cpuTime(pid) - cpu0).Seconds() / time.Since(t0).Seconds() * 100
	if st, err := os.Stat(bin); err == nil {
		r.binMB = float64(st.Size()) / 1e6
	}
	var lat []float64
	for i := 0; i < scrapes; i++ {
		t := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			fail(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lat = append(lat, float64(time.Since(t).Microseconds())/1000)
		r.size = float64(len(b))
	}
	sort.Float64s(lat)
	r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	return r
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// status is a process's memory figures (VmRSS, RssAnon, RssFile) in bytes.
func status(pid int) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			kb, _ := strconv.ParseInt(f[0], 10, 64)
			out[k] = kb * 1024
		}
	}
	return out
}

// cpuTime is a process's user and system time.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / 100 // USER_HZ
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/agent:", err)
	os.Exit(1)
}
