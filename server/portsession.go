package server

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/api"
)

// A browser cannot send kiln's bearer token, so the HTTP path to a job's
// port also takes a session cookie: the owner asks for a link (POST
// /v1/leases/{id}/ports/{port}/browser) that holds a one-time code; the
// first visit trades the code for a cookie scoped to that lease's port
// path (HttpOnly, Secure, SameSite=Strict) and is sent on without the
// code. The cookie is checked on every request as a token is (the token
// that asked for it still lives, its user owns the lease or is an admin,
// the job runs), and never reaches the job.

// Browser sessions' lifetimes.
const (
	portCodeTTL     = 2 * time.Minute
	portSessionTTL  = 8 * time.Hour
	portCookie      = "kiln_port_session"
	portCodeParam   = "kiln_code"
	maxPortSessions = 10000
)

// portSession lives as long as the token that asked for it: revoking the
// token, or its expiry, ends the browser's session too.
type portSession struct {
	token   string
	lease   string
	port    int
	expires time.Time
}

type portSessions struct {
	mu    sync.Mutex
	codes map[string]*portSession
	live  map[string]*portSession
}

func newPortSessions() *portSessions {
	return &portSessions{codes: map[string]*portSession{}, live: map[string]*portSession{}}
}

// sweep drops what expired; mu is held.
func (p *portSessions) sweep(now time.Time) {
	for k, s := range p.codes {
		if now.After(s.expires) {
			delete(p.codes, k)
		}
	}
	for k, s := range p.live {
		if now.After(s.expires) {
			delete(p.live, k)
		}
	}
}

func (p *portSessions) newCode(s *portSession) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep(time.Now())
	if len(p.codes)+len(p.live) >= maxPortSessions {
		return "", errStatus(http.StatusTooManyRequests, "too many browser sessions: try again later")
	}
	code := randHex(16)
	p.codes[code] = s
	return code, nil
}

// trade turns a code into a session, once.
func (p *portSessions) trade(code, lease string, port int) (string, *portSession) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.codes[code]
	delete(p.codes, code)
	if s == nil || time.Now().After(s.expires) || s.lease != lease || s.port != port {
		return "", nil
	}
	sess := &portSession{token: s.token, lease: lease, port: port, expires: time.Now().Add(portSessionTTL)}
	id := randHex(24)
	p.live[id] = sess
	return id, sess
}

func (p *portSessions) get(id, lease string, port int) *portSession {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.live[id]
	if s == nil || time.Now().After(s.expires) || s.lease != lease || s.port != port {
		return nil
	}
	return s
}

// portPath reads the lease and port of an HTTP-path URL.
func portPath(path string) (lease string, port int, ok bool) {
	rest, ok := strings.CutPrefix(path, "/v1/leases/")
	if !ok {
		return "", 0, false
	}
	parts := strings.SplitN(rest, "/", 5)
	if len(parts) < 4 || parts[1] != "ports" || parts[3] != "http" {
		return "", 0, false
	}
	p, err := strconv.Atoi(parts[2])
	if err != nil || p < 1 || p > 65535 {
		return "", 0, false
	}
	return parts[0], p, true
}

// browserCaller authenticates an HTTP-path request by its session cookie.
func (s *Server) browserCaller(r *http.Request) *caller {
	lease, port, ok := portPath(r.URL.Path)
	if !ok {
		return nil
	}
	ck, err := r.Cookie(portCookie)
	if err != nil {
		return nil
	}
	sess := s.portSessions.get(ck.Value, lease, port)
	if sess == nil {
		return nil
	}
	s.amu.RLock()
	defer s.amu.RUnlock()
	if u := s.tokenUser(sess.token, time.Now()); u != nil {
		return &caller{user: u, token: sess.token}
	}
	return nil
}

// tradePortCode answers a visit that brings a code: the cookie, and the
// same URL without the code.
func (s *Server) tradePortCode(w http.ResponseWriter, r *http.Request, code string) {
	lease, port, _ := portPath(r.URL.Path)
	id, sess := s.portSessions.trade(code, lease, port)
	if sess == nil {
		writeErr(w, http.StatusUnauthorized, fmt.Errorf("this link was used or is too old: ask for another with 'kiln forward --browser %s %d'", lease, port))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: portCookie, Value: id, Path: fmt.Sprintf("/v1/leases/%s/ports/%d/http/", lease, port),
		MaxAge: int(portSessionTTL / time.Second), HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	u := *r.URL
	q := u.Query()
	q.Del(portCodeParam)
	u.RawQuery = q.Encode()
	u.Scheme, u.Host = "", ""
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
}

// browserLink is POST /v1/leases/{id}/ports/{port}/browser: a link that
// opens the HTTP path in a browser.
func (s *Server) browserLink(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("port: want a TCP port, 1 to 65535"))
		return
	}
	s.mu.Lock()
	_, _, err = s.portTarget(r, c, r.PathValue("id"), "", port, 0)
	s.mu.Unlock()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	lease := r.PathValue("id")
	code, err := s.portSessions.newCode(&portSession{token: c.token, lease: lease, port: port, expires: time.Now().Add(portCodeTTL)})
	if err != nil {
		writeErr(w, 0, err)
		return
	}
	link := fmt.Sprintf("%s/v1/leases/%s/ports/%d/http/?%s=%s", strings.TrimRight(s.cfg.URL, "/"), url.PathEscape(lease), port, portCodeParam, code)
	writeJSON(w, http.StatusCreated, api.BrowserLink{URL: link, Expires: time.Now().Add(portCodeTTL).UTC()})
}
