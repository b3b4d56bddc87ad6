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
