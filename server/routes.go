package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/lease"
)

// Authentication a route needs.
const (
	authNone  = "none"  // /healthz only
	authJoin  = "join"  // a join token in the body
	authUser  = "user"  // a bearer token
	authAdmin = "admin" // a bearer token of an admin
	authAgent = "agent" // an agent certificate for the node in the path
	authAny   = "any"   // a user or an agent
)

type route struct {
	method, path, auth string
	h                  func(w http.ResponseWriter, r *http.Request)
}

// streamRoutes read their body as it comes (a tunnel's bytes), for as long
// as the handler runs: the guard does not read it first.
var streamRoutes = map[string]bool{
	"/v1/leases/{id}/ports/{port}/connect":        true,
	"/v1/leases/{id}/sessions":                    true,
	"/v1/agent/nodes/{node}/tunnels/{tid}":        true,
	"/v1/leases/{id}/ports/{port}/http/{path...}": true,
}

// routes is the whole API; api/openapi.yaml must describe the same
// set (a test checks it).
func (s *Server) routes() []route {
	return []route{
		{"GET", "/healthz", authNone, s.healthz},
		{"GET", "/metrics", authAdmin, s.serveMetrics},
		{"GET", "/v1/whoami", authAny, s.whoami},
		{"POST", "/v1/leases", authUser, s.createLease},
		{"GET", "/v1/leases", authUser, s.listLeases},
		{"GET", "/v1/leases/{id}", authUser, s.getLease},
		{"DELETE", "/v1/leases/{id}", authUser, s.cancelLease},
		{"POST", "/v1/leases/{id}/jobs", authUser, s.addJob},
		{"GET", "/v1/jobs/{id}", authUser, s.getJob},
		{"GET", "/v1/jobs/{id}/logs", authUser, s.jobLogs},
		{"GET", "/v1/nodes", authUser, s.listNodes},
		{"GET", "/v1/nodes/{id}", authUser, s.getNode},
		{"POST", "/v1/nodes/{id}/drain", authAdmin, s.drainNode},
		{"GET", "/v1/projects", authUser, s.listProjects},
		{"PUT", "/v1/projects/{name}", authAdmin, s.putProject},
		{"GET", "/v1/users", authAdmin, s.listUsers},
		{"DELETE", "/v1/users/{name}", authAdmin, s.deleteUser},
		{"GET", "/v1/tokens", authUser, s.listTokens},
		{"POST", "/v1/tokens", authUser, s.createToken},
		{"DELETE", "/v1/tokens/{id}", authUser, s.deleteToken},
		{"POST", "/v1/join-tokens", authAdmin, s.createJoinToken},
		{"GET", "/v1/join-tokens", authAdmin, s.listJoinTokens},
		{"DELETE", "/v1/join-tokens/{id}", authAdmin, s.revokeJoinToken},
		{"DELETE", "/v1/nodes/{id}", authAdmin, s.forgetNode},
		{"POST", "/v1/nodes/{id}/replace", authAdmin, s.replaceNode},
		{"GET", "/v1/events", authUser, s.listEvents},
		{"POST", "/v1/join", authJoin, s.join},
		{"PUT", "/v1/agent/nodes/{node}", authAgent, s.register},
		{"POST", "/v1/agent/nodes/{node}/heartbeat", authAgent, s.heartbeat},
		{"POST", "/v1/agent/nodes/{node}/jobs/{job}/exit", authAgent, s.jobExit},
		{"POST", "/v1/agent/nodes/{node}/jobs/{job}/logs", authAgent, s.jobLogChunk},
		{"POST", "/v1/leases/{id}/ports/{port}/connect", authUser, s.connectPort},
		{"POST", "/v1/leases/{id}/sessions", authUser, s.openSession},
		{"GET", "/v1/leases/{id}/ports/{port}/http/{path...}", authUser, s.proxyPort},
		{"POST", "/v1/leases/{id}/ports/{port}/http/{path...}", authUser, s.proxyPort},
		{"PUT", "/v1/leases/{id}/ports/{port}/http/{path...}", authUser, s.proxyPort},
		{"PATCH", "/v1/leases/{id}/ports/{port}/http/{path...}", authUser, s.proxyPort},
		{"DELETE", "/v1/leases/{id}/ports/{port}/http/{path...}", authUser, s.proxyPort},
		{"POST", "/v1/leases/{id}/ports/{port}/browser", authUser, s.browserLink},
		{"POST", "/v1/ui/link", authUser, s.uiLink},
		{"POST", "/v1/serve/choose", authUser, s.serveChoose},
		{"POST", "/v1/leases/{id}/serve-tests", authUser, s.addServeTest},
		{"GET", "/v1/serve-tests", authUser, s.listServeTests},
		{"GET", "/v1/serve/usage", authUser, s.serveUsage},
		{"GET", "/openai/v1/models", authUser, s.openAIModels},
		{"POST", "/openai/v1/chat/completions", authUser, s.openAIProxy},
		{"POST", "/openai/v1/completions", authUser, s.openAIProxy},
		{"POST", "/openai/v1/embeddings", authUser, s.openAIProxy},
		{"GET", "/v1/agent/nodes/{node}/tunnels", authAgent, s.tunnelOrders},
		{"POST", "/v1/agent/nodes/{node}/tunnels/{tid}", authAgent, s.tunnelAccept},
	}
}

// bodyLimit is the most a route's request body may hold.
func bodyLimit(rt route) int64 {
	switch rt.path {
	case "/v1/agent/nodes/{node}":
		return maxSnapshotBody
	case "/v1/agent/nodes/{node}/jobs/{job}/logs":
		return maxLogChunk
	case "/healthz", "/v1/join":
		return maxUnauthBody
	case "/openai/v1/chat/completions", "/openai/v1/completions", "/openai/v1/embeddings":
		return maxOpenAIBody
	}
	return maxBody
}

// Handler is the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.HandleFunc(rt.method+" "+rt.path, s.metrics.timed(rt, s.guard(rt)))
	}
	ui := s.uiHandler()
	mux.Handle("/ui/", ui)
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if s.authenticate(r) == nil {
			if s.limited(w, r) {
				return
			}
			writeErr(w, http.StatusUnauthorized, errors.New("a bearer token or an agent certificate is required"))
			return
		}
		proveConn(r)
		writeErr(w, http.StatusNotFound, fmt.Errorf("%s %s: no such endpoint (see api/openapi.yaml)", r.Method, r.URL.Path))
	})
	return mux
}

// guard checks who calls before the handler runs, then reads the body
// (bounded in size and in time). Requests without credentials, and those
// whose credentials fail, are rate-limited per source address.
func (s *Server) guard(rt route) http.HandlerFunc {
	limit := bodyLimit(rt)
	stream := streamRoutes[rt.path]
	proxied := rt.h != nil && strings.Contains(rt.path, "/http/{path...}")
	return func(w http.ResponseWriter, r *http.Request) {
		if proxied && r.Header.Get("Authorization") == "" {
			// A browser: a one-time code to trade, or a session cookie.
			if code := r.URL.Query().Get(portCodeParam); code != "" && r.Method == http.MethodGet {
				if s.limited(w, r) {
					return
				}
				s.tradePortCode(w, r, code)
				return
			}
			if c := s.browserCaller(r); c != nil {
				rt.h(w, r.WithContext(withCaller(r, c)))
				return
			}
		}
		switch rt.auth {
		case authNone, authJoin:
			if s.limited(w, r) || !s.readBodyFirst(w, r, limit) {
				return
			}
			rt.h(w, r)
			return
		}
		c := s.authenticate(r)
		if c == nil {
			if s.limited(w, r) {
				return
			}
			writeErr(w, http.StatusUnauthorized, errors.New("a valid bearer token or agent certificate is required"))
			return
		}
		proveConn(r)
		switch rt.auth {
		case authUser, authAdmin:
			if c.user == nil {
				writeErr(w, http.StatusForbidden, errors.New("agents may not call user endpoints"))
				return
			}
			if rt.auth == authAdmin && !c.admin() {
				writeErr(w, http.StatusForbidden, errors.New("only an admin may do this"))
				return
			}
		case authAgent:
			if c.node == "" {
				writeErr(w, http.StatusForbidden, errors.New("only an agent with its node certificate may do this"))
				return
			}
			if c.node != r.PathValue("node") {
				writeErr(w, http.StatusForbidden, fmt.Errorf("agent of node %s may not act for node %s", c.node, r.PathValue("node")))
				return
			}
		}
		if !stream && !s.readBodyFirst(w, r, limit) {
			return
		}
		rt.h(w, r.WithContext(withCaller(r, c)))
	}
}

// readBodyFirst reads the whole request body before the handler runs, at
// most limit bytes within the body timeout, so that no handler waits on a
// client that sends slowly; the handler reads it from memory. It answers
// 408 or 413 and returns false when the body is late or too large.
func (s *Server) readBodyFirst(w http.ResponseWriter, r *http.Request, limit int64) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	rc := http.NewResponseController(w)
	if r.ContentLength > limit {
		_ = rc.SetReadDeadline(time.Now())
		w.Header().Set("Connection", "close")
		writeErr(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%w: at most %d bytes here", errTooLarge, limit))
		return false
	}
	// Most bodies are there at once: the read deadline is set (which
	// costs the connection's loop a message each time) only once the body
	// is late, to cut the read short.
	var mu sync.Mutex
	read, expired := false, false
	late := time.AfterFunc(s.cfg.BodyTimeout, func() {
		mu.Lock()
		defer mu.Unlock()
		if !read {
			expired = true
			_ = rc.SetReadDeadline(time.Now())
		}
	})
	b, err := readAllSized(r.Body, r.ContentLength, limit)
	mu.Lock()
	read = true
	mu.Unlock()
	late.Stop()
	if err == nil && int64(len(b)) <= limit {
		if expired {
			_ = rc.SetReadDeadline(time.Time{}) // long polls may follow
		}
		r.Body.Close()
		r.Body = &readBodyAhead{Reader: bytes.NewReader(b), b: b}
		return true
	}
	// The connection is dropped after the answer; the read deadline stays
	// (expired, or soon), so that nothing waits for the rest of the body.
	_ = rc.SetReadDeadline(time.Now())
	w.Header().Set("Connection", "close")
	var ne net.Error
	switch {
	case err == nil:
		writeErr(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%w: at most %d bytes here", errTooLarge, limit))
	case errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded):
		writeErr(w, http.StatusRequestTimeout, fmt.Errorf("the request body did not arrive within %s", s.cfg.BodyTimeout))
	default:
		writeErr(w, http.StatusBadRequest, fmt.Errorf("reading the request: %w", err))
	}
	return false
}

type httpError struct {
	status int
	err    error
}

func (e *httpError) Error() string { return e.err.Error() }

func errStatus(status int, format string, args ...any) error {
	return &httpError{status, fmt.Errorf(format, args...)}
}

// withStatus gives err an HTTP status (kept when err already has one).
func withStatus(status int, err error) error {
	var he *httpError
	if errors.As(err, &he) {
		return err
	}
	return &httpError{status, err}
}

// answer runs fn with the server's lock held. fn returns the value to
// answer, marshalled before the lock is let go, and the sequence number of
// the changes it made (or whose effects it reports); the answer goes out
// only once they are durable, so nothing acknowledged can be lost by a
// crash, and nobody waits for the store while holding the lock. An error
// from fn is answered with its status (500 when it has none).
func (s *Server) answer(w http.ResponseWriter, status int, fn func() (any, uint64, error)) {
	s.mu.Lock()
	v, seq, err := fn()
	var body []byte
	if err == nil {
		body, err = json.Marshal(v)
	}
	s.mu.Unlock()
	if err == nil {
		if derr := s.durable(seq); derr != nil {
			err = withStatus(http.StatusServiceUnavailable, derr)
		}
	}

	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	writeRaw(w, status, body)
}

func writeErr(w http.ResponseWriter, status int, err error) {
	var he *httpError
	if errors.As(err, &he) {
		status = he.status
	} else if k := lease.KindOf(err); k != 0 {
		status = kindStatus[k]
	}
	if errors.Is(err, errTooLarge) {
		status = http.StatusRequestEntityTooLarge
	}
	msg := err.Error()
	if msg == "" {
		msg = http.StatusText(status)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]string{"error": msg})
	w.Write(append(b, '\n'))
}

// kindStatus is the HTTP status of each kind of the lease core's refusals.
var kindStatus = map[lease.Kind]int{
	lease.Invalid:   http.StatusBadRequest,
	lease.Forbidden: http.StatusForbidden,
	lease.NotFound:  http.StatusNotFound,
	lease.Conflict:  http.StatusConflict,
	lease.Busy:      http.StatusTooManyRequests,
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	broken := s.down()
	s.mu.Unlock()
	if broken != nil {
		writeErr(w, http.StatusServiceUnavailable, broken)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte("ok\n"))
}

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	out := api.WhoAmI{Node: c.node}
	if c.user != nil {
		s.mu.Lock()
		out.User, out.Role, out.Projects = c.user.Name, c.user.Role, append([]string(nil), c.user.Projects...)
		s.mu.Unlock()
	}
	writeJSON(w, http.StatusOK, out)
}

// badRequest wraps a decoding error as 400 (413 when too large).
func badRequest(err error) error {
	if errors.Is(err, errTooLarge) {
		return &httpError{http.StatusRequestEntityTooLarge, err}
	}
	return &httpError{http.StatusBadRequest, err}
}

func isTrue(v string) bool {
	v = strings.ToLower(v)
	return v == "1" || v == "true" || v == "yes"
}
