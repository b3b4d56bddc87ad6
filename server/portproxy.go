package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
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
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.dialJobPort(ctx, node, job, port)
			},
			DisableKeepAlives:      true, // a tunnel a request: the job's end closes them
			ResponseHeaderTimeout:  5 * time.Minute,
			MaxResponseHeaderBytes: 1 << 20,
		},
		FlushInterval: -1, // streamed answers go out as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeErr(w, http.StatusBadGateway, fmt.Errorf("port %d of job %s on node %s: %w", port, job, node, err))
		},
	}
	rp.ServeHTTP(w, r)
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
