package process

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln.dev/kiln/executor"
)

func alive(pid int) bool {
	s := procState(pid)
	return s != "" && s != "Z"
}

// TestReapStopsJobsOfACrashedRun starts jobs with a state directory, then
// acts as the next run of an agent whose previous run died: Reap finds
// both jobs from their records and stops them, the one that ignores
// SIGTERM after the grace period, and what they started in their group
// with them.
func TestReapStopsJobsOfACrashedRun(t *testing.T) {
	state := t.TempDir()
	pids := filepath.Join(t.TempDir(), "pids")
	os.MkdirAll(pids, 0o755)
	first := &Executor{StateDir: state}
	ctx := context.Background()
	jobs := map[string]string{
		"j-polite":   `sleep 30 & echo $! > ` + pids + `/polite-child; wait`,
		"j-stubborn": `trap "" TERM; sleep 30 & echo $! > ` + pids + `/stubborn-child; while :; do sleep 0.05; done`,
	}
	for id, script := range jobs {
		if _, err := first.Start(ctx, executor.Job{ID: id, LeaseID: "l-" + id, Command: []string{"/bin/sh", "-c", script}}); err != nil {
			t.Fatal(err)
		}
	}
	var children []int
	deadline := time.Now().Add(5 * time.Second)
	for _, name := range []string{"polite-child", "stubborn-child"} {
		for {
			b, err := os.ReadFile(filepath.Join(pids, name))
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
				children = append(children, pid)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job did not write %s", name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ents, _ := os.ReadDir(state)
	if len(ents) != 2 {
		t.Fatalf("%d records in the state directory, want 2", len(ents))
	}
	var recs []record
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(state, e.Name()))
		var r record
		if err := json.Unmarshal(b, &r); err != nil || r.PID <= 0 || r.Start == 0 {
			t.Fatalf("record %s: %s (%v)", e.Name(), b, err)
		}
		recs = append(recs, r)
	}

	// The next run: a new executor over the same directory.
	next := &Executor{StateDir: state}
	t0 := time.Now()
	left, err := next.Reap(ctx, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || !left[0].Stopped || !left[1].Stopped || left[0].Job != "j-polite" || left[1].Job != "j-stubborn" || left[0].Lease != "l-j-polite" {
		t.Fatalf("leftovers %+v, want both jobs stopped", left)
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Errorf("Reap returned after %s: the stubborn job ignores SIGTERM and should have had the grace period", d)
	}
	for _, r := range recs {
		if alive(r.PID) {
			t.Errorf("job process %d still runs after Reap", r.PID)
		}
	}
	for _, pid := range children {
		if alive(pid) {
			t.Errorf("child %d of a job still runs after Reap", pid)
		}
	}
	if ents, _ := os.ReadDir(state); len(ents) != 0 {
		t.Errorf("%d records left after Reap", len(ents))
	}
	if again, err := next.Reap(ctx, time.Second); err != nil || len(again) != 0 {
		t.Errorf("a second Reap found %+v (%v)", again, err)
	}
}

// TestReapLeavesReusedPIDs: a record whose PID now belongs to another
// process (another start time) stops nothing.
func TestReapLeavesReusedPIDs(t *testing.T) {
	other := exec.Command("sleep", "30")
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	start, err := procStart(other.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	e := &Executor{StateDir: t.TempDir()}
	if err := e.writeRecord(record{Job: "j-old", PID: other.Process.Pid, Start: start + 1}); err != nil {
		t.Fatal(err)
	}
	left, err := e.Reap(context.Background(), 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Stopped {
		t.Errorf("leftovers %+v, want one, not stopped", left)
	}
	if !alive(other.Process.Pid) {
		t.Error("Reap killed a process that only had a recorded job's PID")
	}
}

func TestParseStatStart(t *testing.T) {
	line := "4242 (sh -c (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 8192000 100 18446744073709551615\n"
	got, err := parseStatStart([]byte(line))
	if err != nil || got != 987654 {
		t.Errorf("start %d (%v), want 987654", got, err)
	}
	if _, err := parseStatStart([]byte("4242 (sh) S 1 2")); err == nil {
		t.Error("a short stat line was read")
	}
	if _, err := parseStatStart([]byte("no parenthesis")); err == nil {
		t.Error("a line without a command field was read")
	}
	self, err := procStart(os.Getpid())
	if err != nil || self == 0 {
		t.Errorf("own start time %d (%v)", self, err)
	}
}

func FuzzParseStatStart(f *testing.F) {
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 0"))
	f.Add([]byte("7 ()) R 1 2 3"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseStatStart(b) // must not panic
	})
}
