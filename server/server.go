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
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"kiln.dev/kiln/placement"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"kiln.dev/kiln/api"
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
	// BodyTimeout bounds the time a request's body may take to arrive
	// (default 30s); headers have 10s.
	BodyTimeout time.Duration
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
	KB     *kb.KB
	Logger *slog.Logger
}

// ImageChecker is what kiln compat answers: does this image run on this
// node, and if not, why.
type ImageChecker interface {
	Runs(ctx context.Context, image string, node *snapshot.Snapshot) (ok bool, reason string, err error)
}

// check refuses a configuration that contradicts itself; zero values
// take the defaults.
func (c *Config) check() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"heartbeat timeout", c.HeartbeatTimeout}, {"default time limit", c.DefaultTimeLimit}, {"maximum time limit", c.MaxTimeLimit},
		{"preemption grace", c.PreemptGrace}, {"fair-share window", c.FairShareWindow}} {
		if d.v < 0 {
			return fmt.Errorf("server configuration: the %s is negative (%s)", d.name, d.v)
		}
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

func (c *Config) defaults() {
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 30 * time.Second
	}
	if c.DefaultTimeLimit <= 0 {
		c.DefaultTimeLimit = 24 * time.Hour
	}
	if c.MaxTimeLimit <= 0 {
		c.MaxTimeLimit = 7 * 24 * time.Hour
	}
	if c.PreemptGrace <= 0 {
		c.PreemptGrace = 30 * time.Second
	}
	if c.FairShareWindow <= 0 {
		c.FairShareWindow = time.Hour
	}
	if c.BodyTimeout <= 0 {
		c.BodyTimeout = 30 * time.Second
	}
	l := &c.Limits
	l.MaxQueued = cmp.Or(l.MaxQueued, 1000)
	l.MaxQueuedPerUser = cmp.Or(l.MaxQueuedPerUser, 100)
	l.MaxJobsPerLease = cmp.Or(l.MaxJobsPerLease, 1000)
	l.MaxEnvBytes = cmp.Or(l.MaxEnvBytes, 256<<10)
	l.MaxLogBytesPerJob = cmp.Or(l.MaxLogBytesPerJob, 1<<30)
	l.MaxLogBytes = cmp.Or(l.MaxLogBytes, 50<<30)
	if c.KB == nil {
		c.KB = kb.Default()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Placer == nil {
		c.Placer = &placement.SchedPlacer{KB: c.KB, Logger: c.Logger}
	}
}

// Server is a running lease server.
type Server struct {
	cfg    Config
	unauth *rateLimiter
	st     *store.Store
	cm     *committer
	ca     *authority
	cert   tls.Certificate
	log    *slog.Logger
	logs   *logHub

	mu     sync.Mutex
	broken error
	// amu guards users, byName, tokens, agents and each node's certFP:
	// writers hold mu and amu, authentication only amu (read), so checking
	// a caller never waits behind the queue.
	amu       sync.RWMutex
	users     map[string]*userInfo // by id
	byName    map[string]*userInfo
	tokens    map[string]*tokenInfo // by token id
	agents    map[string]*nodeState // every node, by id
	projects  map[string]*projState
	nodes     map[string]*nodeState
	nodeCache []*nodeState
	// viewList is the views of the ready nodes, by node id (viewPos: a
	// node's place in it); redrawn are the nodes whose view is out of date.
	// Callers must not change the list.
	viewList []*placement.NodeView
	viewPos  map[*nodeState]int
	redrawn  []*nodeState
	leases   map[string]*leaseState // live leases and lost ones still holding devices
	holding  map[string]*leaseState // lost leases still holding devices
	empty    []*placement.NodeView  // every node as if idle, for refusals
	refusals map[string]string      // the refusal of each request shape while empty stays
	jobs     map[string]*jobState   // live jobs
	seq      int64
	// started anchors the fair-share sums; length is the typical lease
	// length in seconds, learnt from lengthN ended leases (fairshare.go).
	started  time.Time
	length   float64
	lengthN  int
	wseq     uint64                 // sequence number of the last changes handed to cm
	heads    []string               // leases holding backfill reservations, one per project at most
	reserved []unitRef              // devices reserved for heads
	claiming map[string]*leaseState // leases that claimed devices of preempted ones
	order    []string               // queued leases in grant order, from the last pass
	est      map[string]time.Time
	estAt    time.Time
	changed  chan struct{} // closed and replaced on every change (lease watchers)

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

type projState struct {
	p        api.Project
	held     float64 // GPU equivalents held now
	startSum float64 // sum of need x grant time (Server.rel) of the leases held
	recent   float64 // decayed GPU-seconds of ended leases
	recentAt time.Time
	period   time.Time // start of the quota period
	used     float64   // GPU-seconds of leases ended in the period
}

type unitState struct {
	dev         api.Device
	holders     map[string]int // lease id -> milli GPU
	mem         map[string]uint64
	usedMilli   int
	usedMem     uint64
	reservedFor string
	reservedTil time.Time
	claimedBy   string
}

type nodeState struct {
	rec   store.NodeRecord
	units []*unitState
	byID  map[string]*unitState
	// seen is when the agent last called (unix nanoseconds); idle is true
	// while the server has nothing for the node (no task, no stop order, no
	// lost lease holding its devices), so a heartbeat that runs nothing
	// needs no lock. poke clears it.
	seen   atomic.Int64
	idle   atomic.Bool
	certFP string // guarded by Server.amu
	wake   chan struct{}
	stops  map[string]api.StopOrder // job id -> order, resent until the task ends
	tasks  map[string]*jobState     // live jobs with a task here
	view   *placement.NodeView
	dirty  bool
}

type leaseState struct {
	l      *api.Lease
	seq    int64
	need   float64
	req    placement.Request
	jobs   []*jobState
	claims []unitRef
	// final is the state the lease takes when its jobs have stopped.
	final string
	// heldNodes are the nodes where a lost lease still holds devices.
	heldNodes map[string]bool
	// checkFit is set on a new lease until it is known whether it could
	// ever fit (asked the first time it cannot be placed at once).
	checkFit bool
}

type unitRef struct{ node, unit string }

type jobState struct {
	j     *api.Job
	lease *leaseState
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
	s := &Server{cfg: cfg, st: st, ca: ca, cert: cert, log: cfg.Logger, started: time.Now(),
		unauth:   newRateLimiter(cfg.UnauthRate, cfg.UnauthBurst),
		logs:     newLogHub(filepath.Join(cfg.DataDir, "logs")),
		agents:   map[string]*nodeState{},
		users:    map[string]*userInfo{},
		byName:   map[string]*userInfo{},
		tokens:   map[string]*tokenInfo{},
		changed:  make(chan struct{}),
		claiming: map[string]*leaseState{},
	}
	if err := s.load(ctx); err != nil {
		st.Close()
		return nil, err
	}
	if err := s.bootstrap(ctx); err != nil {
		st.Close()
		return nil, err
	}
	s.cm = newCommitter(st, s.log)
	lctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	s.loopWG.Add(1)
	go s.ticker(lctx)
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
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
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

// load reads the store into memory.
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
		projs, err := tx.Projects()
		if err != nil {
			return err
		}
		s.projects = map[string]*projState{}
		for _, p := range projs {
			ps := &projState{p: p, recentAt: now}
			ps.period = periodStart(now, p.PeriodSeconds)
			if ps.used, err = tx.Usage(p.Name, ps.period); err != nil {
				return err
			}
			s.projects[p.Name] = ps
		}
		s.nodes = map[string]*nodeState{}
		recs, err := tx.Nodes()
		if err != nil {
			return err
		}
		for _, r := range recs {
			drains, err := tx.Devices(r.Node.ID)
			if err != nil {
				return err
			}
			n := s.newNode(r, drains)
			// A restarted server gives every node a full timeout to
			// come back before calling it lost.
			n.touch(now)
			s.nodes[r.Node.ID] = n
			s.addAgent(n)
		}
		s.leases = map[string]*leaseState{}
		s.holding = map[string]*leaseState{}
		s.jobs = map[string]*jobState{}
		live, err := tx.Leases(store.LeaseFilter{States: []string{api.LeaseQueued, api.LeaseGranted, api.LeaseStopping, api.LeaseLost}, Limit: 1 << 30})
		if err != nil {
			return err
		}
		sort.Slice(live, func(i, j int) bool {
			if !live[i].CreatedAt.Equal(live[j].CreatedAt) {
				return live[i].CreatedAt.Before(live[j].CreatedAt)
			}
			return live[i].ID < live[j].ID
		})
		for _, l := range live {
			if l.State == api.LeaseLost && !l.Holding {
				continue
			}
			ls := s.newLeaseState(l)
			s.leases[l.ID] = ls
			for _, a := range l.Allocations {
				if l.State == api.LeaseQueued {
					break
				}
				n := s.nodes[a.Node]
				if n == nil {
					continue
				}
				for _, g := range a.Devices {
					if u := n.byID[g.ID]; u != nil {
						u.hold(l.ID, g.MilliGPU, g.MemoryBytes)
					}
				}
				s.redraw(n)
			}
			if l.State == api.LeaseGranted || l.State == api.LeaseStopping {
				if ps := s.projects[l.Project]; ps != nil && l.GrantedAt != nil {
					s.heldSince(ps, ls, *l.GrantedAt)
				}
			}
			if l.State == api.LeaseStopping {
				ls.final = finalFromReason(l)
			}
			if l.State == api.LeaseLost {
				ls.heldNodes = map[string]bool{}
				for _, a := range l.Allocations {
					ls.heldNodes[a.Node] = true
				}
				s.holding[l.ID] = ls
			}
		}
		jp, err := tx.JobProjects()
		if err != nil {
			return err
		}
		s.logs.count(jp)
		jobs, err := tx.Jobs(api.JobPending, api.JobAssigned, api.JobRunning)
		if err != nil {
			return err
		}
		for _, j := range jobs {
			ls := s.leases[j.LeaseID]
			if ls == nil {
				continue
			}
			js := &jobState{j: j, lease: ls}
			ls.jobs = append(ls.jobs, js)
			s.jobs[j.ID] = js
			for _, t := range j.Tasks {
				if n := s.nodes[t.Node]; n != nil && !api.JobFinal(t.State) {
					n.tasks[j.ID] = js
				}
			}
			if ls.l.State == api.LeaseStopping {
				s.orderStop(js, time.Until(*ls.l.StopDeadline), ls.l.Reason)
			}
		}
		return nil
	})
}

// finalFromReason recovers what a stopping lease will become.
func finalFromReason(l *api.Lease) string {
	switch {
	case len(l.Reason) >= 9 && l.Reason[:9] == "preempted":
		return api.LeasePreempted
	case len(l.Reason) >= 7 && l.Reason[:7] == "expired":
		return api.LeaseExpired
	}
	return api.LeaseDone
}

func periodStart(now time.Time, seconds int) time.Time {
	if seconds <= 0 {
		seconds = 30 * 24 * 3600
	}
	p := int64(seconds)
	return time.Unix(now.Unix()/p*p, 0).UTC()
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

func (s *Server) newNode(r store.NodeRecord, drains map[string]store.DeviceState) *nodeState {
	n := &nodeState{rec: r, byID: map[string]*unitState{}, wake: make(chan struct{}, 1), stops: map[string]api.StopOrder{}, tasks: map[string]*jobState{}, dirty: true}
	devs := placement.Devices(r.Snapshot, s.cfg.KB)
	for _, d := range devs {
		if st, ok := drains[d.ID]; ok && st.Drained {
			d.Drained, d.DrainReason = true, st.Reason
		}
		u := &unitState{dev: d, holders: map[string]int{}, mem: map[string]uint64{}}
		n.units = append(n.units, u)
		n.byID[d.ID] = u
	}
	return n
}

func (s *Server) newLeaseState(l *api.Lease) *leaseState {
	s.seq++
	ls := &leaseState{l: l, seq: s.seq, req: requestOf(l.Request)}
	ls.need = needOf(l.Request)
	return ls
}

// requestOf turns a lease request into what placement needs.
func requestOf(r api.LeaseRequest) placement.Request {
	req := placement.Request{GPUs: r.GPUs, MIG: r.MIG, MemoryBytes: r.MemoryBytes, Constraints: r.Constraints}
	if r.Fraction > 0 {
		m := int(r.Fraction*1000 + 0.5)
		req.MilliGPU = min(max(m, 1), 999)
	}
	return req
}

// needOf is a request's size in GPU equivalents.
func needOf(r api.LeaseRequest) float64 {
	switch {
	case r.GPUs > 0:
		return float64(r.GPUs)
	case r.Fraction > 0:
		return float64(requestOf(r).MilliGPU) / 1000
	case r.MIG != "":
		return float64(placement.MIGMilli(r.MIG)) / 1000
	}
	return 0
}

func (u *unitState) hold(lease string, milli int, mem uint64) {
	if _, ok := u.holders[lease]; ok {
		return
	}
	u.holders[lease] = milli
	u.mem[lease] = mem
	u.usedMilli += milli
	u.usedMem += mem
}

func (u *unitState) free(lease string) bool {
	m, ok := u.holders[lease]
	if !ok {
		return false
	}
	u.usedMilli -= m
	u.usedMem -= u.mem[lease]
	delete(u.holders, lease)
	delete(u.mem, lease)
	return true
}

// notify wakes whoever waits for a change (lease watchers).
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// addAgent makes a node known to authentication with its certificate;
// s.mu is held.
func (s *Server) addAgent(n *nodeState) {
	s.amu.Lock()
	defer s.amu.Unlock()
	s.agents[n.rec.Node.ID] = n
	n.certFP = n.rec.CertSHA256
}

// touch records a call of the node's agent.
func (n *nodeState) touch(t time.Time) { n.seen.Store(t.UnixNano()) }

// lastSeen is when the node's agent last called.
func (n *nodeState) lastSeen() time.Time { return time.Unix(0, n.seen.Load()) }

// poke wakes the node's heartbeat: the server has something for it.
func (n *nodeState) poke() {
	n.idle.Store(false)
	select {
	case n.wake <- struct{}{}:
	default:
	}
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
