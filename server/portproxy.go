package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/textsafe"
)

// proxyPort is the HTTP path to a job's port:
// /v1/leases/{id}/ports/{port}/http/{path...} is answered by the job's
// server at /{path...}, through a tunnel, with kiln's credentials taken
// off the request. HTTP/1.1 and HTTP/2 from the caller, WebSockets (over
// HTTP/1.1) and streamed answers (server-sent events) pass. The job sees
// the prefix it is served under in X-Forwarded-Prefix, for apps that build
// links (Jupyter's base_url, TensorBoard's --path_prefix, Gradio's
// root_path).
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("port %q: want a TCP port, 1 to 65535", textsafe.Printable(trunc(r.PathValue("port")))))
		return
	}
	s.mu.Lock()
	job, node, err := s.portTarget(r, c, r.PathValue("id"), "", port, 0)
	s.mu.Unlock()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err)
		return
	}
	prefix := "/v1/leases/" + r.PathValue("id") + "/ports/" + strconv.Itoa(port) + "/http"
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.Out.URL.Path = "/" + pr.In.PathValue("path")
			pr.Out.URL.RawPath = ""
			pr.Out.Host = pr.Out.URL.Host
			pr.SetXForwarded()
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
			// kiln's credentials are the user's, not the job's.
			pr.Out.Header.Del("Authorization")
			stripKilnCookies(pr.Out.Header)
		},
		Transport:     s.proxies.transport(s, proxyKey{user: c.user.ID, node: node, job: job, port: port}),
		FlushInterval: -1, // streamed answers go out as they come
		ModifyResponse: func(resp *http.Response) error {
			// The job's page may keep cookies of its own, never one of
			// kiln's names: those are the viewer's sessions.
			dropKilnSetCookies(resp.Header)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeErr(w, http.StatusBadGateway, fmt.Errorf("port %d of job %s on node %s: %w", port, job, node, err))
		},
	}
	rp.ServeHTTP(w, r)
}

// proxyKey is what a kept-alive connection to a job's port is kept for:
// one user's requests to one port of one job. Users never share one.
type proxyKey struct {
	user, node, job string
	port            int
}

// proxyPool keeps a transport per proxyKey, so that the HTTP path's
// requests reuse their tunnels (each new one costs an order to the agent
// and a dial on the node). Every request is still authorised on its own
// before it is given a connection. A job's end drops its transports;
// its tunnels are closed by the tunnel hub.
type proxyPool struct {
	mu sync.Mutex
	m  map[proxyKey]*http.Transport
}

// Pooled connections to jobs' ports.
const (
	proxyIdleConns   = 128              // kept-alive tunnels per key (of maxTunnelsPerJob)
	proxyIdleTimeout = 90 * time.Second // an idle one is closed after
)

func (p *proxyPool) transport(s *Server, k proxyKey) *http.Transport {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.m[k]; t != nil {
		return t
	}
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return s.dialJobPort(ctx, k.node, k.job, k.port)
		},
		MaxIdleConnsPerHost:    proxyIdleConns,
		IdleConnTimeout:        proxyIdleTimeout,
		ResponseHeaderTimeout:  5 * time.Minute,
		MaxResponseHeaderBytes: 1 << 20,
	}
	if p.m == nil {
		p.m = map[proxyKey]*http.Transport{}
	}
	p.m[k] = t
	return t
}

// endJob drops the transports of a job that ended and closes their idle
// connections.
func (p *proxyPool) endJob(job string) {
	p.mu.Lock()
	var ended []*http.Transport
	for k, t := range p.m {
		if k.job == job {
			ended = append(ended, t)
			delete(p.m, k)
		}
	}
	p.mu.Unlock()
	for _, t := range ended {
		go t.CloseIdleConnections()
	}
}

// dropKilnSetCookies removes the Set-Cookie lines of an answer that name
// one of kiln's cookies (kiln_...).
func dropKilnSetCookies(h http.Header) {
	lines := h.Values("Set-Cookie")
	h.Del("Set-Cookie")
	for _, line := range lines {
		name, _, _ := strings.Cut(strings.TrimSpace(line), "=")
		if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(name)), "kiln_") {
			h.Add("Set-Cookie", line)
		}
	}
}

// stripKilnCookies removes kiln's own cookies from a request the job gets.
func stripKilnCookies(h http.Header) {
	cookies := h.Values("Cookie")
	h.Del("Cookie")
	for _, line := range cookies {
		var keep []string
		for _, part := range strings.Split(line, ";") {
			name, _, _ := strings.Cut(strings.TrimSpace(part), "=")
			if !strings.HasPrefix(name, "kiln_") && strings.TrimSpace(part) != "" {
				keep = append(keep, strings.TrimSpace(part))
			}
		}
		if len(keep) > 0 {
			h.Add("Cookie", strings.Join(keep, "; "))
		}
	}
}
