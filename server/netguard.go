package server

import (
	"container/list"
	"context"
	"crypto/tls"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Network limits. A connection is "unproven" until a request on it
// authenticates (a valid token or agent certificate); unproven connections
// are few and cheap to drop: each source address keeps at most
// maxPerSource of them and the server at most maxUnproven; to make room for
// a new one the oldest of its source, or of the source holding the most, is
// closed. So connections that are held open
// without credentials (a slow handshake, a header or a body that never
// ends) cannot use up the descriptors that /healthz and authenticated
// users need, and one address cannot push out the others'.

// connGuard tracks the unproven connections of a listener.
type connGuard struct {
	maxUnproven  int
	maxPerSource int

	mu       sync.Mutex
	unproven *list.List // *guardedConn, oldest first
	bySource map[string]*list.List
}

// guardedConn is an accepted connection.
type guardedConn struct {
	net.Conn
	g      *connGuard
	source string
	proven atomic.Bool
	// elem and srcElem are its places in the unproven lists (nil once
	// proven or closed); guarded by g.mu.
	elem, srcElem *list.Element
	closed        atomic.Bool
}

// connLimits says how many unproven connections a server keeps: a quarter
// of its descriptor limit at most, so the rest stays for the store, the
// logs and authenticated callers.
func connLimits(maxUnproven, maxPerSource int) (int, int) {
	var rl syscall.Rlimit
	budget := 1 << 20
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < math.MaxInt32 {
		budget = int(rl.Cur) / 4
	}
	if maxUnproven <= 0 {
		maxUnproven = 1024
	}
	maxUnproven = max(min(maxUnproven, budget), 8)
	if maxPerSource <= 0 {
		maxPerSource = 64
	}
	maxPerSource = max(min(maxPerSource, maxUnproven/2), 1)
	return maxUnproven, maxPerSource
}

type guardListener struct {
	net.Listener
	g *connGuard
}

func newGuardListener(ln net.Listener, maxUnproven, maxPerSource int) *guardListener {
	maxUnproven, maxPerSource = connLimits(maxUnproven, maxPerSource)
	return &guardListener{Listener: ln, g: &connGuard{maxUnproven: maxUnproven, maxPerSource: maxPerSource,
		unproven: list.New(), bySource: map[string]*list.List{}}}
}

// Accept admits a connection, closing the oldest unproven one of its
// source when the source has too many, or of the source holding the most
// when the server has too many.
func (l *guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &guardedConn{Conn: c, g: l.g, source: sourceOf(c.RemoteAddr())}
	var evict []*guardedConn
	g := l.g
	g.mu.Lock()
	src := g.bySource[gc.source]
	if src == nil {
		src = list.New()
		g.bySource[gc.source] = src
	}
	if src.Len() >= g.maxPerSource {
		evict = append(evict, g.removeLocked(src.Front().Value.(*guardedConn)))
	} else if g.unproven.Len() >= g.maxUnproven {
		evict = append(evict, g.removeLocked(g.victimLocked()))
	}
	gc.elem = g.unproven.PushBack(gc)
	gc.srcElem = src.PushBack(gc)
	g.mu.Unlock()
	for _, o := range evict {
		o.Conn.Close()
	}
	return gc, nil
}

// victimLocked is the connection to close when the server holds as many
// unproven connections as it keeps: the oldest of the source that holds the
// most, so that sources holding many (a flood) lose theirs before a caller
// with one connection in its handshake loses it. g.mu is held.
func (g *connGuard) victimLocked() *guardedConn {
	var best *list.List
	for _, l := range g.bySource {
		if best == nil || l.Len() > best.Len() {
			best = l
		}
	}
	if best == nil || best.Len() == 0 {
		return g.unproven.Front().Value.(*guardedConn)
	}
	return best.Front().Value.(*guardedConn)
}

// removeLocked takes c off the unproven lists; g.mu is held.
func (g *connGuard) removeLocked(c *guardedConn) *guardedConn {
	if c.elem != nil {
		g.unproven.Remove(c.elem)
		c.elem = nil
	}
	if c.srcElem != nil {
		if src := g.bySource[c.source]; src != nil {
			src.Remove(c.srcElem)
			if src.Len() == 0 {
				delete(g.bySource, c.source)
			}
		}
		c.srcElem = nil
	}
	return c
}

// prove marks the connection as carrying an authenticated caller: it is no
// longer counted or dropped.
func (c *guardedConn) prove() {
	if c.proven.Swap(true) {
		return
	}
	c.g.mu.Lock()
	c.g.removeLocked(c)
	c.g.mu.Unlock()
}

func (c *guardedConn) Close() error {
	if !c.closed.Swap(true) {
		c.g.mu.Lock()
		c.g.removeLocked(c)
		c.g.mu.Unlock()
	}
	return c.Conn.Close()
}

func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

type connKey struct{}

// connContext keeps the guarded connection in each request's context.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if gc, ok := c.(*guardedConn); ok {
		return context.WithValue(ctx, connKey{}, gc)
	}
	return ctx
}

// proveConn marks the request's connection as authenticated.
func proveConn(r *http.Request) {
	if gc, ok := r.Context().Value(connKey{}).(*guardedConn); ok {
		gc.prove()
	}
}

// rateLimiter is a token bucket per source address, for the requests that
// carry no credentials (/healthz, join) and those whose credentials fail.
type rateLimiter struct {
	rate  float64 // tokens per second
	burst float64

	mu      sync.Mutex
	buckets map[string]*bucket
	swept   time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newRateLimiter(rate float64, burst int) *rateLimiter {
	if rate <= 0 {
		rate = 10
	}
	if burst <= 0 {
		burst = 40
	}
	return &rateLimiter{rate: rate, burst: float64(burst), buckets: map[string]*bucket{}}
}

// allow takes a token of source's bucket; when there is none it returns
// how long until there is one.
func (l *rateLimiter) allow(source string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > time.Minute || len(l.buckets) > 100000 {
		// Buckets that refilled are the same as none.
		for k, b := range l.buckets {
			if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
				delete(l.buckets, k)
			}
		}
		l.swept = now
	}
	b := l.buckets[source]
	if b == nil {
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[source] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// limited answers 429 when the request's source has used up its bucket.
func (s *Server) limited(w http.ResponseWriter, r *http.Request) bool {
	ok, wait := s.unauth.allow(requestSource(r), time.Now())
	if ok {
		return false
	}
	secs := int(math.Ceil(wait.Seconds()))
	w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	writeErr(w, http.StatusTooManyRequests, errStatus(http.StatusTooManyRequests,
		"too many requests without valid credentials from %s: at most %g a second (bursts of %g); retry in %ds", requestSource(r), s.unauth.rate, s.unauth.burst, max(secs, 1)))
	return true
}

func requestSource(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
