// Command agent measures kiln's agent on a recorded 8-GPU machine (the HGX
// H100 fixture) sampling its metrics once a second: resident memory, CPU
// share of one core, and the time a scrape of /metrics takes, as a table.
// The goals are under 30 MB resident, under 1% of one core and under 5 ms a
// scrape.
//
//	go run ./bench/agent [-for 30s] [-scrapes 200]
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
	dur := flag.Duration("for", 30*time.Second, "how long the agent's memory and CPU are watched")
	scrapes := flag.Int("scrapes", 200, "scrapes timed")
	flag.Parse()
	dir, err := os.MkdirTemp("", "kiln-bench-agent")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	bin, err := kilnbin.Build(dir)
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srvAddr, metricsAddr := freeAddr(), freeAddr()
	srv := exec.CommandContext(ctx, bin, "server", "--data", filepath.Join(dir, "server"), "--listen", srvAddr)
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
	agent := exec.CommandContext(ctx, bin, "join", m[1], "--token", m[2], "--ca-sha256", m[3], "--node", "hgx",
		"--state", filepath.Join(dir, "agent"), "--job-dir", filepath.Join(dir, "jobs"),
		"--from", "testdata/fixtures/h100-hgx8-sysfs", "--metrics-addr", metricsAddr, "--metrics-interval", "1s")
	agent.Stdout, agent.Stderr = io.Discard, io.Discard
	if err := agent.Start(); err != nil {
		fail(err)
	}
	defer func() { cancel(); _ = agent.Wait() }()
	url := "http://" + metricsAddr + "/metrics"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			fail(fmt.Errorf("the agent's /metrics did not answer within 30 s"))
		}
	}
	time.Sleep(3 * time.Second) // past start-up
	pid := agent.Process.Pid
	cpu0, t0 := cpuTime(pid), time.Now()
	var peak, last int64
	var parts map[string]int64
	for end := time.Now().Add(*dur); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		parts = status(pid)
		last = parts["VmRSS"]
		peak = max(peak, last)
	}
	share := (cpuTime(pid) - cpu0).Seconds() / time.Since(t0).Seconds() * 100
	var lat []float64
	size := 0
	for i := 0; i < *scrapes; i++ {
		t := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			fail(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lat = append(lat, float64(time.Since(t).Microseconds())/1000)
		size = len(b)
	}
	sort.Float64s(lat)
	fmt.Printf("%-44s %10s %10s\n", "agent, 8 recorded GPUs, 1 sample/s", "measured", "goal")
	fmt.Printf("%-44s %10.1f %10s\n", "resident memory, peak (MB)", float64(peak)/1e6, "< 30")
	fmt.Printf("%-44s %10.1f %10s\n", "resident memory, last (MB)", float64(last)/1e6, "")
	fmt.Printf("%-44s %10.1f %10s\n", "  of it the heap and stacks (RssAnon, MB)", float64(parts["RssAnon"])/1e6, "")
	fmt.Printf("%-44s %10.1f %10s\n", "  of it the binary's pages (RssFile, MB)", float64(parts["RssFile"])/1e6, "")
	fmt.Printf("%-44s %10.2f %10s\n", fmt.Sprintf("CPU, %% of one core over %s", *dur), share, "< 1")
	fmt.Printf("%-44s %10.2f %10s\n", fmt.Sprintf("scrape p50 (ms, %d scrapes, %d bytes)", *scrapes, size), lat[len(lat)/2], "< 5")
	fmt.Printf("%-44s %10.2f %10s\n", "scrape p99 (ms)", lat[len(lat)*99/100], "")
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
