package containerd

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/containerd/containerdtest"
)

// TestReapStopsLeftoverContainers: jobs of two nodes run on one host; the
// agent of node a crashes. Its next run reaps node a's job (it ignores
// SIGTERM: killed after the grace period, container removed) and leaves
// node b's running.
func TestReapStopsLeftoverContainers(t *testing.T) {
	d := containerdtest.Start(t)
	reg := containerdtest.StartRegistry(t)
	ref := reg.Push(t, containerdtest.Image(t, containerdtest.BuildStatic(t, "testdata/jobprog")), "kiln/jobprog:reap")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	open := func(node string) *Executor {
		ex, err := New(ctx, Config{Address: d.Address, Snapshotter: d.Snapshotter, PlainHTTP: []string{reg.Host},
			LogDir: filepath.Join(tmp, "logs"), CDIDirs: []string{filepath.Join(tmp, "cdi")}, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ex.Close() })
		return ex
	}
	a, b := open("node-a"), open("node-b")
	ha, err := a.Start(ctx, executor.Job{ID: "job-a", LeaseID: "lease-a", Image: ref, Command: []string{"/jobprog", "wait"}})
	if err != nil {
		t.Fatal(err)
	}
	hb, err := b.Start(ctx, executor.Job{ID: "job-b", LeaseID: "lease-b", Image: ref, Command: []string{"/jobprog", "trap"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []executor.Handle{ha, hb} {
		logs := h.Logs()
		readUntil(t, logs, "ready")
		logs.Close()
	}

	// Node a's agent starts again: a new executor over the same containerd.
	again := open("node-a")
	t0 := time.Now()
	left, err := again.Reap(ctx, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Job != "job-a" || left[0].Lease != "lease-a" || !left[0].Stopped {
		t.Fatalf("leftovers %+v, want job-a of lease-a stopped", left)
	}
	if time.Since(t0) < 500*time.Millisecond {
		t.Error("job-a ignores SIGTERM: Reap should have waited the grace period before SIGKILL")
	}
	running, err := again.Running(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != 1 || running[0] != "job-b" {
		t.Errorf("containers after the reap %v, want only job-b (node b's)", running)
	}
	if err := hb.Stop(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := hb.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
