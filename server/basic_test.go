package server_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/placement"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// TestGrantRunRelease runs with the default placer (sched) and with
// FirstFit, which stays available.
func TestGrantRunRelease(t *testing.T) {
	t.Parallel() // a cluster of its own; it mostly waits
	for name, pl := range map[string]placement.Placer{"sched": nil, "first-fit": placement.FirstFit{}} {
		t.Run(name, func(t *testing.T) { grantRunRelease(t, pl) })
	}
}

func grantRunRelease(t *testing.T, pl placement.Placer) {
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second, PreemptGrace: 500 * time.Millisecond, Placer: pl})
	m := machines(t)
	c.addAgent("hgx", m["hgx"], nil, 300*time.Millisecond)
	c.addAgent("mi300x", m["mi300x"], nil, 300*time.Millisecond)
	nodes := c.waitNodes(2)
	for _, n := range nodes {
		if n.ID == "hgx" && (n.Total != 8 || n.Devices[0].Isolation != api.IsolationMPS || n.Devices[0].Island == "") {
			t.Errorf("hgx node: %d GPUs, gpu0 isolation %s island %q", n.Total, n.Devices[0].Isolation, n.Devices[0].Island)
		}
		if n.ID == "mi300x" && (n.Total != 8 || n.Devices[0].Isolation != api.IsolationTimeSlicing) {
			t.Errorf("mi300x node: %d GPUs, gpu0 isolation %s", n.Total, n.Devices[0].Isolation)
		}
	}
	ctx := context.Background()
	var l api.Lease
	err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 2,
		Constraints: api.Constraints{Vendor: "amd"},
		Job:         &api.JobSpec{Command: []string{"/bin/sh", "-c", "echo rocr=$ROCR_VISIBLE_DEVICES hip=$HIP_VISIBLE_DEVICES"}}}, &l)
	if err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseGranted || l.Allocations[0].Node != "mi300x" {
		t.Fatalf("lease %+v, want granted on mi300x", l)
	}
	done := waitLease(t, c.admin, l.ID, 10*time.Second, final)
	if done.State != api.LeaseDone {
		t.Fatalf("lease ended %s: %s", done.State, done.Reason)
	}
	resp, err := c.admin.Raw(ctx, "GET", "/v1/jobs/"+l.Jobs[0]+"/logs", nil)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(out), "rocr=0,1 hip=0,1") {
		t.Errorf("job output %q", out)
	}
	// A fraction on the H100s gets MPS.
	err = c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", Fraction: 0.25, MemoryBytes: 10 << 30,
		Constraints: api.Constraints{Vendor: "nvidia"},
		Job:         &api.JobSpec{Command: []string{"/bin/sh", "-c", "echo pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"}}}, &l)
	if err != nil {
		t.Fatal(err)
	}
	if l.Isolation != api.IsolationMPS {
		t.Errorf("fraction isolation %s, want mps", l.Isolation)
	}
	waitLease(t, c.admin, l.ID, 10*time.Second, final)
	resp, err = c.admin.Raw(ctx, "GET", "/v1/jobs/"+l.Jobs[0]+"/logs?follow=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	out, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(out), "pct=25 mem=0=10240M") {
		t.Errorf("fraction job output %q", out)
	}
}

// TestImageJobRefusedWithoutContainers: nodes whose agents run no
// container executor say why; a lease whose job names an image is refused
// with that reason, and one without an image still runs.
func TestImageJobRefusedWithoutContainers(t *testing.T) {
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second})
	m := machines(t)
	c.addAgent("hgx", m["hgx"], nil, 300*time.Millisecond)
	nodes := c.waitNodes(1)
	if nodes[0].Containers != "" || nodes[0].NoContainers != "the agent runs no container executor" {
		t.Errorf("node hgx: containers %q, no_containers %q", nodes[0].Containers, nodes[0].NoContainers)
	}
	ctx := context.Background()
	var l api.Lease
	err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1,
		Job: &api.JobSpec{Image: "registry.lab:5000/train:1", Command: []string{"python", "train.py"}}}, &l)
	if err != nil {
		t.Fatal(err)
	}
	want := "image registry.lab:5000/train:1: no node runs containers: the agent runs no container executor"
	if l.State != api.LeaseRefused || l.Reason != want {
		t.Errorf("image lease %s: %q, want refused: %q", l.State, l.Reason, want)
	}
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1,
		Job: &api.JobSpec{Command: []string{"/bin/true"}}}, &l); err != nil || l.State != api.LeaseGranted {
		t.Errorf("process lease %s (%v), want granted", l.State, err)
	}
}
