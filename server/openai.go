package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"sort"
	"strconv"
	"strings"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/serving"
	"kiln.dev/kiln/textsafe"
)

// The OpenAI-compatible endpoint: one base URL (/openai/v1) for every
// deployment, routed by the request's model field to a ready replica the
// caller's projects serve, with kiln's token as the API key.

// maxOpenAIBody bounds a request to the endpoint: long prompts, not files.
const maxOpenAIBody = 16 << 20

// maxUsageScan is how much of a non-streamed answer is kept to read its
// usage; the answer itself passes whole.
const maxUsageScan = 4 << 20

// openAIError answers in the OpenAI API's error shape, which its clients
// read.
func openAIError(w http.ResponseWriter, status int, typ, code, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	e := map[string]any{"message": fmt.Sprintf(format, args...), "type": typ, "param": nil, "code": nil}
	if code != "" {
		e["code"] = code
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	w.Write(append(b, '\n'))
}

// openAIModels lists the models the caller can ask for: those a ready
// deployment of one of the caller's projects serves.
func (s *Server) openAIModels(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	s.mu.Lock()
	_, open := s.serveTargets(func(l *api.Lease) bool { return c.canSee(l.Project) })
	s.mu.Unlock()
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	seen := map[string]bool{}
	for _, t := range sortedModels(open) {
		st := s.deploys.status(t.lease)
		if seen[t.project+"\x00"+t.model] || st == nil || st.State != api.DeployReady {
			continue
		}
		seen[t.project+"\x00"+t.model] = true
		out.Data = append(out.Data, model{ID: t.model, Object: "model", Created: st.Since.Unix(), OwnedBy: t.project})
	}
	writeJSON(w, http.StatusOK, out)
}

// openAIProxy routes a completion, chat completion or embeddings request
// to a ready replica of the model it names.
func (s *Server) openAIProxy(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	body, err := readBody(r, maxOpenAIBody)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, errTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		openAIError(w, status, "invalid_request_error", "", "%v", err)
		return
	}
	var head struct {
		Model         string          `json:"model"`
		Stream        bool            `json:"stream"`
		StreamOptions json.RawMessage `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "", "the request is not a JSON object: %v", err)
		return
	}
	if head.Model == "" {
		openAIError(w, http.StatusBadRequest, "invalid_request_error", "", "the request names no model (GET /openai/v1/models lists them)")
		return
	}
	if serving.CheckName(head.Model) != nil {
		openAIError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "the model %q does not exist", textsafe.Printable(trunc(head.Model)))
		return
	}
	if head.Stream && len(head.StreamOptions) == 0 {
		// Ask the engine for the usage in the stream's last event, so
		// that its tokens are counted; OpenAI's clients ignore it unless
		// they asked.
		if b, err := withStreamUsage(body); err == nil {
			body = b
		}
	}
	// A name routes inside one project: the one the request names
	// (OpenAI's OpenAI-Project header), else the only one of the caller's
	// that serves it. Across projects the same name is someone else's
	// engine, which would get the caller's prompts.
	project := r.Header.Get("OpenAI-Project")
	if project != "" && !c.canSee(project) {
		openAIError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "the model %s does not exist, or no project of yours serves it", head.Model)
		return
	}
	s.mu.Lock()
	serving := map[string]bool{}
	live := s.core.Leases(time.Now(), func(l *api.Lease) bool {
		return l.Request.Serve != nil && l.Request.Serve.Model == head.Model && c.canSee(l.Project) && !api.LeaseFinal(l.State) &&
			(project == "" || l.Project == project)
	})
	for _, l := range live {
		serving[l.Project] = true
	}
	if len(serving) > 1 {
		s.mu.Unlock()
		var ps []string
		for p := range serving {
			ps = append(ps, p)
		}
		sort.Strings(ps)
		openAIError(w, http.StatusConflict, "invalid_request_error", "model_ambiguous",
			"the model %s is served in several of your projects (%s): name one in the OpenAI-Project header", head.Model, strings.Join(ps, ", "))
		return
	}
	_, open := s.serveTargets(func(l *api.Lease) bool { return serving[l.Project] && l.Request.Serve.Model == head.Model })
	starting := len(open) == 0 && len(live) > 0
	s.mu.Unlock()
	var ready []serveTarget
	for _, t := range sortedModels(open) {
		if s.deploys.ready(t.lease) {
			ready = append(ready, t)
		}
	}
	if len(ready) == 0 {
		if starting || len(open) > 0 {
			w.Header().Set("Retry-After", "5")
			openAIError(w, http.StatusServiceUnavailable, "server_error", "model_not_ready", "the model %s is deployed but its engine is not ready yet (kiln serve ls shows why)", head.Model)
			return
		}
		openAIError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "the model %s does not exist, or no project of yours serves it", head.Model)
		return
	}
	t := ready[s.deploys.next(len(ready))]
	path := strings.TrimPrefix(r.URL.Path, "/openai")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(t.port))
			pr.Out.URL.Path, pr.Out.URL.RawPath = path, ""
			pr.Out.URL.RawQuery = ""
			pr.Out.Host = pr.Out.URL.Host
			pr.Out.Header.Del("Authorization") // kiln's token is the user's, not the engine's
			stripKilnCookies(pr.Out.Header)
			pr.Out.Body = io.NopCloser(bytes.NewReader(body))
			pr.Out.ContentLength = int64(len(body))
			pr.Out.Header.Set("Content-Length", strconv.Itoa(len(body)))
			pr.SetXForwarded()
		},
		Transport:     s.proxies.transport(s, proxyKey{user: c.user.ID, node: t.node, job: t.job, port: t.port}),
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			// The engine is a tenant's process: it sets no cookie on the
			// server's origin, where kiln's own session cookies live.
			// Of its headers, only those that describe the answer pass: no
			// cookie, redirect, CORS or transport policy of an engine lands
			// on the server's origin.
			keepAnswerHeaders(resp.Header)
			if resp.StatusCode/100 == 3 {
				resp.Body.Close()
				return fmt.Errorf("it answered %s, a redirect, which the endpoint does not follow", resp.Status)
			}
			// An API's answer is data: a browser led to it runs nothing of
			// it on the server's origin.
			resp.Header.Set("Content-Security-Policy", "sandbox; default-src 'none'")
			resp.Header.Set("X-Content-Type-Options", "nosniff")
			resp.Body = &usageReader{rc: resp.Body, stream: strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"),
				done: func(prompt, compl int64) { s.deploys.count(t, resp.StatusCode >= 400, prompt, compl, time.Now()) }}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.deploys.count(t, true, 0, 0, time.Now())
			openAIError(w, http.StatusBadGateway, "server_error", "engine_unreachable", "the engine of %s (lease %s on node %s) did not answer: %v", t.model, t.lease, t.node, err)
		},
	}
	rp.ServeHTTP(w, r)
}

// keepAnswerHeaders drops every header of an engine's answer but those
// that describe it: its type and caching, and the request id and rate
// limits OpenAI's API reports.
func keepAnswerHeaders(h http.Header) {
	for k := range h {
		switch lk := strings.ToLower(k); {
		case lk == "content-type", lk == "content-length", lk == "cache-control", lk == "x-request-id",
			strings.HasPrefix(lk, "openai-"), strings.HasPrefix(lk, "x-ratelimit-"):
		default:
			h.Del(k)
		}
	}
}

// withStreamUsage adds stream_options.include_usage to a request.
func withStreamUsage(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	m["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	return json.Marshal(m)
}

// usageReader passes an engine's answer through and reads the usage it
// reports: the "usage" object of a JSON answer, or of the stream's events.
// It counts once, when the answer ends or is closed.
type usageReader struct {
	rc     io.ReadCloser
	stream bool
	buf    bytes.Buffer
	line   []byte
	prompt int64
	compl  int64
	done   func(prompt, completion int64)
	over   bool
	ended  bool
}

type usageOf struct {
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

func (u *usageReader) Read(p []byte) (int, error) {
	n, err := u.rc.Read(p)
	u.scan(p[:n])
	if err == io.EOF {
		u.finish()
	}
	return n, err
}

func (u *usageReader) scan(b []byte) {
	if !u.stream {
		if !u.over {
			if u.buf.Len()+len(b) > maxUsageScan {
				u.over, u.buf = true, bytes.Buffer{}
			} else {
				u.buf.Write(b)
			}
		}
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(u.line)+len(b) <= maxUsageScan {
				u.line = append(u.line, b...)
			}
			return
		}
		if len(u.line)+i <= maxUsageScan {
			u.line = append(u.line, b[:i]...)
			u.event(u.line)
		}
		u.line, b = u.line[:0], b[i+1:]
	}
}

// event reads one line of a server-sent events stream.
func (u *usageReader) event(line []byte) {
	data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return
	}
	var v usageOf
	if json.Unmarshal(data, &v) == nil && v.Usage != nil {
		u.prompt, u.compl = clampTokens(v.Usage.PromptTokens), clampTokens(v.Usage.CompletionTokens)
	}
}

func (u *usageReader) finish() {
	if u.ended {
		return
	}
	u.ended = true
	if !u.stream && !u.over {
		var v usageOf
		if json.Unmarshal(u.buf.Bytes(), &v) == nil && v.Usage != nil {
			u.prompt, u.compl = clampTokens(v.Usage.PromptTokens), clampTokens(v.Usage.CompletionTokens)
		}
	}
	u.done(u.prompt, u.compl)
}

func (u *usageReader) Close() error {
	u.finish()
	return u.rc.Close()
}

// clampTokens keeps an engine's count sane: it is data from the job.
func clampTokens(n int64) int64 { return min(max(n, 0), 1<<32) }
