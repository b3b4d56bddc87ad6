// Package server is kiln's lease server: a versioned HTTP/JSON API under
// /v1 (described by openapi.yaml), users and projects with hashed tokens,
// nodes whose agents authenticate with certificates from the server's own
// CA, and a queue that grants leases of whole GPUs, MIG instances or
// fractions with priorities, weighted fair share between projects,
// backfill, preemption and expiry. Working state lives in memory; the
// changes of concurrent requests are written to the store together (group
// commit) and a request is answered only once its changes are durable.
package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"kiln.dev/kiln/lease"
	"kiln.dev/kiln/placement"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/store"
)

// Config sets up a server.
type Config struct {
	// DataDir holds the database, the CA, the logs of jobs.
	DataDir string
	// URL is the address agents and users reach the server at
	// ("https://gpu-head:7443"); it goes into the join command.
	URL string
	// Hosts are extra names and addresses for the server certificate.
	Hosts []string
	// HeartbeatTimeout marks a silent node lost (default 30s).
	HeartbeatTimeout time.Duration
	// DefaultTimeLimit applies to leases that ask for none (default 24h);
	// MaxTimeLimit caps what a lease may ask (default 7 days).
	DefaultTimeLimit time.Duration
	MaxTimeLimit     time.Duration
	// PreemptGrace is the time a preempted or expired job has between the
	// notice (SIGTERM) and the kill (default 30s).
	PreemptGrace time.Duration
	// FairShareWindow is the half-life of past usage in the fair-share
	// order (default 1h).
	FairShareWindow time.Duration
	// Placer picks devices; a placement.SchedPlacer when nil (placement.FirstFit is the
	// simple alternative).
	Placer placement.Placer
	// CommitGap is the least time between the starts of two of the
	// store's transactions (default 1ms): while requests keep coming, the
	// changes of those that arrive meanwhile are written together, one
	// transaction a millisecond instead of one a request, and none waits
	// more than the gap for it; a lone request is written at once.
	CommitGap time.Duration
	// BodyTimeout bounds the time a request's body may take to arrive
	// (default 30s); headers have 10s.
	BodyTimeout time.Duration
	// TunnelIdle closes a connection to a job's port that carried nothing
	// for this long (default 30 minutes).
	TunnelIdle time.Duration
	// UnauthRate and UnauthBurst rate-limit, per source address, the
	// requests without valid credentials (/healthz, join, failed tokens):
	// UnauthRate a second, bursts of UnauthBurst (defaults 10 and 40).
	UnauthRate  float64
	UnauthBurst int
	// MaxUnprovenConns and MaxConnsPerSource bound the connections that
	// no authenticated request has used yet, in all and per source address
	// (defaults 1024 and 64, and a quarter of the descriptor limit at
	// most); the oldest is closed to make room.
	MaxUnprovenConns  int
	MaxConnsPerSource int
	// Limits are the defaults of the per-project limits (api.Limits), for
	// the projects that set none: 1000 queued leases, 100 per member, 1000
	// jobs per lease, 256 KiB of environment, 1 GiB of log per job and
	// 50 GiB per project.
	Limits api.Limits
	// Images says whether an image runs on a node; nil: not checked.
	Images ImageChecker
	// CheckedImages lists the images kiln compat read before (its cache),
	// for the fleet's image findings on the web page; nil: none.
	CheckedImages ImageCatalog
	KB            *kb.KB
	Logger        *slog.Logger
}

// ImageChecker is what kiln compat answers: does this image run on this
// node, and if not, why.
type ImageChecker interface {
	Runs(ctx context.Context, image string, node *snapshot.Snapshot) (ok bool, reason string, err error)
}

// ImageCatalog lists the images kiln compat read before, with what each
// needs, their requirements resolved (safe to share between goroutines).
type ImageCatalog interface {
	CheckedImages(ctx context.Context) ([]compat.Checked, error)
}

// maxCommitGap bounds Config.CommitGap.
const maxCommitGap = 100 * time.Millisecond

// check refuses a configuration that contradicts itself; zero values
// take the defaults.
func (c *Config) check() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"heartbeat timeout", c.HeartbeatTimeout}, {"default time limit", c.DefaultTimeLimit}, {"maximum time limit", c.MaxTimeLimit},
		{"preemption grace", c.PreemptGrace}, {"fair-share window", c.FairShareWindow}, {"commit gap", c.CommitGap}, {"tunnel idle time", c.TunnelIdle}} {
		if d.v < 0 {
			return fmt.Errorf("server configuration: the %s is negative (%s)", d.name, d.v)
		}
	}
	if c.CommitGap > maxCommitGap {
		return fmt.Errorf("server configuration: the commit gap %s is above %s (changes would wait that long to be written)", c.CommitGap, maxCommitGap)
	}
	if c.MaxTimeLimit > maxTimeLimitS*time.Second {
		return fmt.Errorf("server configuration: the maximum time limit %s is above one year", c.MaxTimeLimit)
	}
	max := c.MaxTimeLimit
	if max == 0 {
		max = 7 * 24 * time.Hour
	}
	if c.DefaultTimeLimit > max {
		return fmt.Errorf("server configuration: the default time limit %s is above the maximum %s", c.DefaultTimeLimit, max)
	}
	return nil
}

// leaseConfig is the part of the configuration the lease core takes.
func (c *Config) leaseConfig() lease.Config {
	return lease.Config{HeartbeatTimeout: c.HeartbeatTimeout, DefaultTimeLimit: c.DefaultTimeLimit, MaxTimeLimit: c.MaxTimeLimit,
		PreemptGrace: c.PreemptGrace, FairShareWindow: c.FairShareWindow, Limits: c.Limits, Placer: c.Placer, KB: c.KB, Logger: c.Logger}
}

// defaults fills the zero values: the lease core's defaults for what it
// takes, the server's own for the rest.
func (c *Config) defaults() {
	lc := c.leaseConfig()
	lc.Defaults()
	c.HeartbeatTimeout, c.DefaultTimeLimit, c.MaxTimeLimit = lc.HeartbeatTimeout, lc.DefaultTimeLimit, lc.MaxTimeLimit
	c.PreemptGrace, c.FairShareWindow, c.Limits = lc.PreemptGrace, lc.FairShareWindow, lc.Limits
	c.Placer, c.KB, c.Logger = lc.Placer, lc.KB, lc.Logger
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = 30 * time.Second
	}
	if c.CommitGap == 0 {
		c.CommitGap = time.Millisecond
	}
	if c.TunnelIdle <= 0 {
		c.TunnelIdle = defaultTunnelIdle
	}
}

// Server is a running lease server.
type Server struct {
	cfg    Config
	unauth *rateLimiter
	st     *store.Store
	cm     *committer
	// metrics are its /metrics series.
	metrics *metrics
	ca      *authority
	cert    tls.Certificate
	log     *slog.Logger
	logs    *logHub
	// tunnels carry users' connections to their jobs' ports; closing is
	// closed when the server stops, which ends them.
	tunnels      *tunnelHub
	proxies      proxyPool // the HTTP path's kept-alive tunnels
	imageFleet   imageFleetMemo
	portSessions *portSessions
	uiSessions   *uiSessions
	history      *history
	deploys      deployments // serving leases' readiness and usage
	closing      chan struct{}
	closeOnce    sync.Once

	mu     sync.Mutex
	broken error
	// amu guards users, byName, tokens, agents and each node's certFP:
	// writers hold mu and amu, authentication only amu (read), so checking
	// a caller never waits behind the queue.
	amu    sync.RWMutex
	users  map[string]*userInfo // by id
	byName map[string]*userInfo
	tokens map[string]*tokenInfo // by token id
	agents map[string]*agentInfo // every node, by id
	// core is the state of projects, nodes, leases and jobs and the queue's
	// policy; every call holds mu.
	core    *lease.Core
	wseq    uint64        // sequence number of the last changes handed to cm
	changed chan struct{} // closed and replaced on every change (lease watchers)

	stop   context.CancelFunc
	loopWG sync.WaitGroup
	lock   *dirLock

	// Bootstrap is filled on first start: the admin token and the join
	// command, to print once.
	Bootstrap *Bootstrap
}

// Bootstrap is what a first start creates.
type Bootstrap struct {
	AdminToken string
	// JoinToken joins one node, until JoinExpires.
	JoinToken   string
	JoinCommand string
	JoinExpires time.Time
}

type userInfo struct {
	api.User
	projects map[string]bool
}

type tokenInfo struct {
	store.TokenRow
}

// agentInfo is a node as authentication knows it: the certificate its
// agent must present.
type agentInfo struct {
	node   *lease.Node
	certFP string
	wake   chan struct{} // signalled when the core has orders for the node
}

// agentRunner is the lease core's Runner for kiln's agents: a node with
// new orders gets its waiting heartbeat answered.
type agentRunner struct{ s *Server }

func (r agentRunner) Wake(node string) {
	r.s.amu.RLock()
	a := r.s.agents[node]
	r.s.amu.RUnlock()
	if a == nil {
		return
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// New opens (or creates) the data directory and loads the state.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cfg.defaults()
	if cfg.DataDir == "" {
		return nil, errors.New("server: no data directory")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", cfg.DataDir, err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	s, err := newServer(ctx, cfg)
	if err != nil {
		lock.release()
		return nil, err
	}
	s.lock = lock
	return s, nil
}

func newServer(ctx context.Context, cfg Config) (*Server, error) {
	st, ca, err := openState(ctx, cfg.DataDir, true)
	if err != nil {
		return nil, err
	}
	hosts := append([]string(nil), cfg.Hosts...)
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	if cfg.URL != "" {
		if h := hostOf(cfg.URL); h != "" {
			hosts = append(hosts, h)
		}
	}
	cert, err := ca.serverCert(hosts)
	if err != nil {
		st.Close()
		return nil, err
	}
	s := &Server{cfg: cfg, st: st, ca: ca, cert: cert, log: cfg.Logger,
		unauth:       newRateLimiter(cfg.UnauthRate, cfg.UnauthBurst),
		logs:         newLogHub(filepath.Join(cfg.DataDir, "logs")),
		tunnels:      newTunnelHub(),
		portSessions: newPortSessions(),
		uiSessions:   newUISessions(),
		history:      newHistory(),
		closing:      make(chan struct{}),
		agents:       map[string]*agentInfo{},
		users:        map[string]*userInfo{},
		byName:       map[string]*userInfo{},
		tokens:       map[string]*tokenInfo{},
		changed:      make(chan struct{}),
	}
	lc := cfg.leaseConfig()
	lc.NewID, lc.Runner = newID, agentRunner{s}
	s.core = lease.New(lc, time.Now())
	if err := s.load(ctx); err != nil {
		st.Close()
		return nil, err
	}
	if err := s.bootstrap(ctx); err != nil {
		st.Close()
		return nil, err
	}
	s.cm = newCommitter(st, cfg.CommitGap, s.log)
	s.metrics = newMetrics(s)
	lctx, cancel := context.WithCancel(context.Background())
	s.stop = func() {
		cancel()
		s.closeOnce.Do(func() { close(s.closing) })
	}
	s.loopWG.Add(2)
	go s.ticker(lctx)
	go s.prober(lctx)
	return s, nil
}

func hostOf(u string) string {
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		return ""
	}
	return req.URL.Hostname()
}

// CAPEM is the server's CA certificate.
func (s *Server) CAPEM() []byte { return s.ca.pem }

// CAFingerprint is the SHA-256 of the CA certificate, which agents pin.
func (s *Server) CAFingerprint() string { return api.Fingerprint(s.ca.cert.Raw) }

// TLSConfig serves the API: the server certificate, and agent client
// certificates checked against the CA when presented.
func (s *Server) TLSConfig() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(s.ca.cert)
	return &tls.Config{
		Certificates: []tls.Certificate{s.cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
	}
}

// Serve answers on ln (TLS is added here) until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:   s.Handler(),
		TLSConfig: s.TLSConfig(),
		// The TLS handshake and the headers have 10s; bodies have
		// BodyTimeout, set per request (readBodyFirst), so that long
		// polls (heartbeats, lease waits, log follows) are not cut.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ConnContext:       connContext,
		// Tunnels carry bulk bytes on HTTP/2 streams: larger frames and
		// windows than the defaults (16 KiB, 1 MiB) keep them from
		// waiting on flow control; a peer can make the server hold at most
		// the connection's window.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 1000, MaxReadFrameSize: 1 << 20,
			MaxReceiveBufferPerStream: 4 << 20, MaxReceiveBufferPerConnection: 8 << 20},
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	gl := newGuardListener(ln, s.cfg.MaxUnprovenConns, s.cfg.MaxConnsPerSource)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(tls.NewListener(gl, hs.TLSConfig)) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// Close stops the background work and closes the store.
func (s *Server) Close() error {
	if s.stop != nil {
		s.stop()
	}
	s.loopWG.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken == nil {
		s.broken = errors.New("server closed")
	}
	if s.cm != nil {
		s.cm.close()
	}
	err := s.st.Close()
	s.lock.release()
	return err
}

// putUser adds or replaces a user; s.mu is held.
func (s *Server) putUser(u api.User) {
	s.amu.Lock()
	defer s.amu.Unlock()
	ui := &userInfo{User: u, projects: map[string]bool{}}
	for _, p := range u.Projects {
		ui.projects[p] = true
	}
	if old := s.users[u.ID]; old != nil {
		delete(s.byName, old.Name)
	}
	s.users[u.ID] = ui
	s.byName[u.Name] = ui
}

// notify wakes whoever waits for a change (lease watchers).
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// addAgent makes a node known to authentication with its certificate;
// s.mu is held.
func (s *Server) addAgent(n *lease.Node) {
	s.amu.Lock()
	defer s.amu.Unlock()
	rec := n.Record()
	wake := make(chan struct{}, 1)
	if old := s.agents[rec.Node.ID]; old != nil {
		wake = old.wake // a heartbeat may wait on it
	}
	s.agents[rec.Node.ID] = &agentInfo{node: n, certFP: rec.CertSHA256, wake: wake}
}

func newID(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixMilli()%1e9, 36) + randHex(5)
}

// GCPercent is the garbage collector's target kiln server runs with when
// GOGC is not set: its heap is mostly long-lived state (nodes, views,
// leases) and each request makes little garbage, so collecting at 400%
// growth instead of Go's 100% spends a quarter of the CPU on it and
// keeps pauses off the tail latency. TuneGC applies it.
const GCPercent = 400

// TuneGC sets the garbage collector for a server process unless the GOGC
// environment variable chose already.
func TuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
}

// load reads the store into memory: users and tokens here, the rest into
// the lease core.
func (s *Server) load(ctx context.Context) error {
	now := time.Now()
	return s.st.View(ctx, func(tx *store.Tx) error {
		users, err := tx.Users()
		if err != nil {
			return err
		}
		for _, u := range users {
			s.putUser(u)
		}
		toks, err := tx.Tokens()
		if err != nil {
			return err
		}
		s.amu.Lock()
		for _, t := range toks {
			s.tokens[t.ID] = &tokenInfo{t}
		}
		s.amu.Unlock()
		if err := s.core.Load(now, storeSource{tx}); err != nil {
			return err
		}
		for _, n := range s.core.NodeList() {
			s.addAgent(n)
		}
		jp, err := tx.JobProjects()
		if err != nil {
			return err
		}
		s.logs.count(jp)
		return nil
	})
}

// storeSource is the store as the lease core loads it, rows mapped to the
// core's types.
type storeSource struct{ tx *store.Tx }

func (t storeSource) Projects() ([]api.Project, error) { return t.tx.Projects() }

func (t storeSource) Usage(project string, since time.Time) (float64, error) {
	return t.tx.Usage(project, since)
}

func (t storeSource) Nodes() ([]lease.NodeRecord, error) {
	recs, err := t.tx.Nodes()
	if err != nil {
		return nil, err
	}
	out := make([]lease.NodeRecord, len(recs))
	for i, r := range recs {
		out[i] = nodeFromStore(r)
	}
	return out, nil
}

func (t storeSource) Devices(node string) (map[string]lease.DeviceState, error) {
	ds, err := t.tx.Devices(node)
	if err != nil {
		return nil, err
	}
	out := make(map[string]lease.DeviceState, len(ds))
	for id, d := range ds {
		out[id] = lease.DeviceState{Drained: d.Drained, Reason: d.Reason}
	}
	return out, nil
}

func (t storeSource) Leases(states ...string) ([]*api.Lease, error) {
	return t.tx.Leases(store.LeaseFilter{States: states, Limit: 1 << 30})
}

func (t storeSource) Jobs(states ...string) ([]*api.Job, error) { return t.tx.Jobs(states...) }

func nodeFromStore(r store.NodeRecord) lease.NodeRecord {
	return lease.NodeRecord{Node: r.Node, Snapshot: r.Snapshot, CertSHA256: r.CertSHA256, KeySHA256: r.KeySHA256, Replacing: r.Replacing}
}

func nodeToStore(r lease.NodeRecord) store.NodeRecord {
	return store.NodeRecord{Node: r.Node, Snapshot: r.Snapshot, CertSHA256: r.CertSHA256, KeySHA256: r.KeySHA256, Replacing: r.Replacing}
}
