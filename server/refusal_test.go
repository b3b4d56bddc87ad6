package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// TestNeverFitsRefusedBeforePreempting: a lease that could not fit even on
// an idle cluster is refused at once (it is asked only once the lease
// cannot be placed, so this guards that path) and the preemptible lease
// running meanwhile is left alone; a lease of the same priority that can
// fit once the preemptible one goes does preempt it.
func TestNeverFitsRefusedBeforePreempting(t *testing.T) {
	t.Parallel() // a cluster of its own; it mostly waits
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second, PreemptGrace: 200 * time.Millisecond})
	c.addAgent("pcie", machines(t)["pcie"], nil, 200*time.Millisecond)
	nodes := c.waitNodes(1)
	total := nodes[0].Total
	if total < 2 {
		t.Fatalf("pcie machine has %d GPUs, want at least 2", total)
	}
	ctx := context.Background()
	var low api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: total, Preemptible: true}, &low); err != nil {
		t.Fatal(err)
	}
	if low.State != api.LeaseGranted {
		t.Fatalf("preemptible lease of all %d GPUs: %s (%s), want granted", total, low.State, low.Reason)
	}

	var never api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: total + 1, Priority: 10}, &never); err != nil {
		t.Fatal(err)
	}
	if never.State != api.LeaseRefused || !strings.Contains(never.Reason, "could ever") {
		t.Fatalf("lease of %d GPUs on a %d-GPU cluster: %s %q, want refused as never fitting", total+1, total, never.State, never.Reason)
	}
	// More GPUs than any node can hold, without a gang: the reason says
	// so in the user's words (not the engine's validation message).
	var huge api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 99}, &huge); err != nil {
		t.Fatal(err)
	}
	if huge.State != api.LeaseRefused || !strings.Contains(huge.Reason, "99 GPUs on one node") || !strings.Contains(huge.Reason, "gang") || strings.Contains(huge.Reason, "sched") {
		t.Fatalf("lease of 99 GPUs: %s %q, want refused, naming the per-node limit and the gang", huge.State, huge.Reason)
	}
	time.Sleep(500 * time.Millisecond) // longer than the grace: a preemption would show
	var got api.Lease
	if err := c.admin.Do(ctx, "GET", "/v1/leases/"+low.ID, nil, &got); err != nil {
		t.Fatal(err)
	}
	if got.State != api.LeaseGranted {
		t.Fatalf("preemptible lease is %s (%s) after a lease that never fits was refused; want it left granted", got.State, got.Reason)
	}

	var high api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, Priority: 10}, &high); err != nil {
		t.Fatal(err)
	}
	if high.State == api.LeaseRefused {
		t.Fatalf("a lease of 1 GPU was refused: %s", high.Reason)
	}
	ended := waitLease(t, c.admin, low.ID, 10*time.Second, final)
	if ended.State != api.LeasePreempted {
		t.Errorf("preemptible lease ended %s (%s), want preempted for the higher-priority lease", ended.State, ended.Reason)
	}
	granted := waitLease(t, c.admin, high.ID, 10*time.Second, func(l *api.Lease) bool { return l.State == api.LeaseGranted || final(l) })
	if granted.State != api.LeaseGranted {
		t.Errorf("higher-priority lease ended %s (%s), want granted once the preemptible one was gone", granted.State, granted.Reason)
	}
}
