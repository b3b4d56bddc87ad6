package server

import (
	"net"
	"testing"
)

// TestGuardEvictsFromTheFlood: when the server holds as many unproven
// connections as it keeps, a new one pushes out the oldest of the source
// that holds the most, never the one connection of a caller still in its
// handshake (with "the oldest of all", that caller's connection was closed
// whenever the flood was fast enough to outpace its handshake).
func TestGuardEvictsFromTheFlood(t *testing.T) {
	ln := &fakeListener{}
	gl := newGuardListener(ln, 8, 4)
	var closed []string
	accept := func(src string) *guardedConn {
		ln.next = &fakeConn{src: src, onClose: func() { closed = append(closed, src) }}
		c, err := gl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*guardedConn)
	}
	accept("10.0.0.1:1") // the caller, mid-handshake
	for i := 0; i < 4; i++ {
		accept("10.0.0.9:1")
	}
	for i := 0; i < 3; i++ {
		accept("10.0.0.8:1")
	}
	accept("10.0.0.5:1") // the server is full: the flood pays
	if len(closed) != 1 || closed[0] != "10.0.0.9:1" {
		t.Fatalf("closed %v, want one of 10.0.0.9's", closed)
	}
}

type fakeListener struct{ next net.Conn }

func (l *fakeListener) Accept() (net.Conn, error) { return l.next, nil }
func (l *fakeListener) Close() error              { return nil }
func (l *fakeListener) Addr() net.Addr            { return &net.TCPAddr{} }

type fakeConn struct {
	net.Conn
	src     string
	onClose func()
}

func (c *fakeConn) RemoteAddr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", c.src)
	return a
}
func (c *fakeConn) Close() error { c.onClose(); return nil }
