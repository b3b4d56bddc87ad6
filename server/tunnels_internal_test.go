package server

import (
	"net"
	"testing"
	"time"
)

// A job's end closes its tunnels even while both sides keep them open
// (flush calls endJob for each job that ended).
func TestEndJobClosesItsTunnels(t *testing.T) {
	h := newTunnelHub()
	half := func() (*tunnelHalf, net.Conn) {
		mine, theirs := net.Pipe()
		return &tunnelHalf{body: mine, w: mine, flush: func() error { return nil }, cut: func() { mine.Close() }}, theirs
	}
	user, uFar := half()
	agent, aFar := half()
	defer uFar.Close()
	defer aFar.Close()
	mk := func(job string) *tunnel {
		t := &tunnel{id: "t-" + job, job: job, user: user, agent: agent, done: make(chan struct{})}
		h.add(t)
		return t
	}
	mine, other := mk("j-1"), mk("j-2")
	h.endJob("j-1")
	select {
	case <-mine.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the ended job's tunnel stayed open")
	}
	if why := *mine.why.Load(); why != "the job ended" {
		t.Errorf("closed because %q", why)
	}
	select {
	case <-other.done:
		t.Error("another job's tunnel was closed")
	case <-time.After(50 * time.Millisecond):
	}
}

// TestProxyPoolEndJob: a job's end drops every transport kept for it,
// whoever used it, and keeps the others'; a key is one user's.
func TestProxyPoolEndJob(t *testing.T) {
	var p proxyPool
	s := &Server{}
	a1 := p.transport(s, proxyKey{user: "u-a", node: "n1", job: "j-1", port: 80})
	if again := p.transport(s, proxyKey{user: "u-a", node: "n1", job: "j-1", port: 80}); again != a1 {
		t.Error("one key got two transports")
	}
	if b1 := p.transport(s, proxyKey{user: "u-b", node: "n1", job: "j-1", port: 80}); b1 == a1 {
		t.Error("two users share a transport")
	}
	p.transport(s, proxyKey{user: "u-a", node: "n1", job: "j-2", port: 80})
	p.endJob("j-1")
	if len(p.m) != 1 {
		t.Fatalf("%d transports kept after j-1 ended, want 1 (j-2's)", len(p.m))
	}
	for k := range p.m {
		if k.job != "j-2" {
			t.Errorf("kept %+v", k)
		}
	}
}
