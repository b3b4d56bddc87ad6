package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// recorder is a server on loopback with the API's routes as openapi.yaml
// lists them (a server test keeps the file equal to server/routes.go). It
// records what reached each route and answers what the test sets.
type recorder struct {
	t      *testing.T
	client *Client
	routes []string // "GET /v1/leases/{id}"

	mu     sync.Mutex
	got    []request
	status int    // answer's status; 0: 200
	answer string // answer's body
	ctype  string // answer's content type; "": application/json
}

type request struct {
	Method, Pattern string
	Values          map[string]string
	RawQuery        string
	Query           url.Values
	Body            []byte
	ContentType     string
	Auth            string
}

var placeholder = regexp.MustCompile(`\{([a-z]+)\}`)

// specRoutes are the routes of openapi.yaml, "METHOD /path".
func specRoutes(t *testing.T) []string {
	t.Helper()
	js, err := yaml.YAMLToJSON(OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for p, ops := range doc.Paths {
		for m := range ops {
			if m := strings.ToUpper(m); slices.Contains([]string{"GET", "PUT", "POST", "DELETE", "PATCH"}, m) {
				out = append(out, m+" "+p)
			}
		}
	}
	sort.Strings(out)
	if len(out) < 20 {
		t.Fatalf("openapi.yaml lists only %d routes", len(out))
	}
	return out
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	r := &recorder{t: t, routes: specRoutes(t)}
	mux := http.NewServeMux()
	for _, rt := range r.routes {
		names := placeholder.FindAllStringSubmatch(rt, -1)
		mux.HandleFunc(rt, func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			rec := request{Method: req.Method, Pattern: rt, Values: map[string]string{}, RawQuery: req.URL.RawQuery, Query: req.URL.Query(),
				Body: body, ContentType: req.Header.Get("Content-Type"), Auth: req.Header.Get("Authorization")}
			for _, n := range names {
				rec.Values[n[1]] = req.PathValue(n[1])
			}
			r.reply(w, rec)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		r.reply(w, request{Method: req.Method, Pattern: "no route: " + req.URL.EscapedPath()})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	r.client = &Client{Base: srv.URL, Token: "kiln_t_secret", HTTP: srv.Client()}
	return r
}

func (r *recorder) reply(w http.ResponseWriter, rec request) {
	r.mu.Lock()
	r.got = append(r.got, rec)
	status, answer, ctype := r.status, r.answer, r.ctype
	r.mu.Unlock()
	if ctype == "" {
		ctype = "application/json"
	}
	if status == 0 {
		status = http.StatusOK
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(status)
	io.WriteString(w, answer)
}

// set says what the next requests get.
func (r *recorder) set(status int, answer string) {
	r.mu.Lock()
	r.status, r.answer, r.ctype = status, answer, ""
	r.mu.Unlock()
}

func (r *recorder) take() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

// sameJSON compares two JSON texts as values.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		return false
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("want %s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

type callCase struct {
	name   string
	call   func(ctx context.Context, c *Client) (any, error)
	route  string            // the route it must reach
	values map[string]string // its path values
	query  url.Values        // its query, decoded; nil: none
	body   string            // the JSON it sends; "": none
	status int               // the answer's status
	answer string            // the answer's body
	want   any               // what the call returns
}

var (
	t0   = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	zero = 0
)

func callCases() []callCase {
	req := LeaseRequest{Project: "vision", GPUs: 2, Constraints: Constraints{SameNVLinkIsland: true}}
	lease := &Lease{ID: "l-1", Project: "vision", User: "ana", State: LeaseQueued, QueuePosition: 3, Request: req, CreatedAt: t0, GPUs: 2, Jobs: []string{"j-1"}}
	leaseJSON := mustJSON(lease)
	job := &Job{ID: "j-1", LeaseID: "l-1", Project: "vision", State: JobExited, ExitCode: &zero, Created: t0}
	node := &Node{ID: "n1", State: NodeReady, LastSeen: t0, Devices: []Device{{ID: "gpu0", Vendor: "nvidia", Isolation: IsolationMPS, Drained: true, DrainReason: "fan"}}, Joined: t0, Total: 1}
	nodeJSON := mustJSON(node)
	project := &Project{Name: "vision", Weight: 2, MaxGPUs: 8, PeriodSeconds: 3600, Members: []string{"ana"}}
	token := &Token{ID: "t1", User: "ana", Secret: "kiln_t1_s", Created: t0}
	jt := &JoinToken{ID: "jt1", Secret: "s", Created: t0, Expires: t0.Add(time.Hour), Command: "kiln join ...", Uses: 1}
	return []callCase{
		{name: "Health", call: func(ctx context.Context, c *Client) (any, error) { return nil, c.Health(ctx) },
			route: "GET /healthz", answer: "ok\n"},
		{name: "Metrics", call: func(ctx context.Context, c *Client) (any, error) {
			b, err := c.Metrics(ctx)
			return string(b), err
		}, route: "GET /metrics", answer: "kiln_nodes{state=\"ready\"} 1\n", want: "kiln_nodes{state=\"ready\"} 1\n"},
		{name: "WhoAmI", call: func(ctx context.Context, c *Client) (any, error) { return c.WhoAmI(ctx) },
			route: "GET /v1/whoami", answer: `{"user":"ana","role":"member","projects":["vision"]}`,
			want: &WhoAmI{User: "ana", Role: RoleMember, Projects: []string{"vision"}}},
		{name: "CreateLease", call: func(ctx context.Context, c *Client) (any, error) { return c.CreateLease(ctx, req) },
			route: "POST /v1/leases", body: mustJSON(req), status: 201, answer: leaseJSON, want: lease},
		{name: "GetLease", call: func(ctx context.Context, c *Client) (any, error) { return c.GetLease(ctx, "l-1", LeaseWait{}) },
			route: "GET /v1/leases/{id}", values: map[string]string{"id": "l-1"}, answer: leaseJSON, want: lease},
		{name: "GetLease waits", call: func(ctx context.Context, c *Client) (any, error) {
			return c.GetLease(ctx, "l-1", LeaseWait{Since: LeaseVersion(lease), For: 10 * time.Second})
		},
			route: "GET /v1/leases/{id}", values: map[string]string{"id": "l-1"}, query: url.Values{"wait_s": {"10"}, "since": {"queued/3"}},
			answer: leaseJSON, want: lease},
		{name: "GetLease waits a fraction of a second", call: func(ctx context.Context, c *Client) (any, error) {
			return c.GetLease(ctx, "l-1", LeaseWait{Since: "granted/0", For: 1500 * time.Millisecond})
		},
			route: "GET /v1/leases/{id}", values: map[string]string{"id": "l-1"}, query: url.Values{"wait_s": {"1.5"}, "since": {"granted/0"}},
			answer: leaseJSON, want: lease},
		{name: "ListLeases", call: func(ctx context.Context, c *Client) (any, error) { return c.ListLeases(ctx, LeaseFilter{}) },
			route: "GET /v1/leases", answer: `{"leases":[]}`, want: []Lease{}},
		{name: "ListLeases filtered", call: func(ctx context.Context, c *Client) (any, error) {
			return c.ListLeases(ctx, LeaseFilter{All: true, Project: "vision", State: LeaseDone})
		},
			route: "GET /v1/leases", query: url.Values{"all": {"1"}, "project": {"vision"}, "state": {"done"}},
			answer: `{"leases":[` + leaseJSON + `]}`, want: []Lease{*lease}},
		{name: "CancelLease", call: func(ctx context.Context, c *Client) (any, error) { return c.CancelLease(ctx, "l-1") },
			route: "DELETE /v1/leases/{id}", values: map[string]string{"id": "l-1"}, answer: leaseJSON, want: lease},
		{name: "AddJob", call: func(ctx context.Context, c *Client) (any, error) {
			return c.AddJob(ctx, "l-1", JobSpec{Command: []string{"nvidia-smi"}, Env: map[string]string{"A": "1"}})
		},
			route: "POST /v1/leases/{id}/jobs", values: map[string]string{"id": "l-1"}, body: `{"command":["nvidia-smi"],"env":{"A":"1"}}`,
			status: 201, answer: mustJSON(job), want: job},
		{name: "BrowserLink", call: func(ctx context.Context, c *Client) (any, error) { return c.BrowserLink(ctx, "l-1", 8888) },
			route: "POST /v1/leases/{id}/ports/{port}/browser", values: map[string]string{"id": "l-1", "port": "8888"}, status: 201,
			answer: `{"url":"https://s/v1/leases/l-1/ports/8888/http/?kiln_code=c","expires":"2026-01-02T03:04:05Z"}`,
			want:   &BrowserLink{URL: "https://s/v1/leases/l-1/ports/8888/http/?kiln_code=c", Expires: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
		{name: "UILink", call: func(ctx context.Context, c *Client) (any, error) { return c.UILink(ctx) },
			route: "POST /v1/ui/link", status: 201,
			answer: `{"url":"https://s/ui/?kiln_code=c","expires":"2026-01-02T03:04:05Z"}`,
			want:   &BrowserLink{URL: "https://s/ui/?kiln_code=c", Expires: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
		{name: "ServeChoose", call: func(ctx context.Context, c *Client) (any, error) {
			return c.ServeChoose(ctx, ServeChooseRequest{Model: ServeModel{Name: "m", Format: "gguf", WeightsBytes: 5, Path: "/m.gguf"}, Batch: 2})
		},
			route: "POST /v1/serve/choose", body: `{"model":{"name":"m","format":"gguf","weights_bytes":5,"path":"/m.gguf"},"batch":2}`,
			answer: `{"best":{"engine":"llama.cpp","node":"n1","gpus":1,"island":[0],"link":"one GPU","verdict":"runs","verdict_from":"x","memory_per_gpu_bytes":1,"capacity_bytes":2,"context":8,"batch":2,"command":["llama-server"],"port":8080,"ready":"/health"}}`,
			want: &ServeChooseReply{Best: ServeChoice{Engine: "llama.cpp", Node: "n1", GPUs: 1, Island: []int{0}, Link: "one GPU", Verdict: "runs", VerdictFrom: "x",
				MemoryPerGPUBytes: 1, CapacityBytes: 2, Context: 8, Batch: 2, Command: []string{"llama-server"}, Port: 8080, Ready: "/health"}}},
		{name: "AddServeTest", call: func(ctx context.Context, c *Client) (any, error) {
			return c.AddServeTest(ctx, "l-1", ServeTest{Smoke: []ServeSmoke{{Name: "chat", OK: true}}, Load: []ServeLoad{}})
		},
			route: "POST /v1/leases/{id}/serve-tests", values: map[string]string{"id": "l-1"}, status: 201,
			body:   `{"id":"","lease_id":"","project":"","user":"","model":"","engine":"","node":"","gpus":0,"at":"0001-01-01T00:00:00Z","smoke":[{"name":"chat","ok":true}],"load":[]}`,
			answer: `{"id":"st-1","lease_id":"l-1","project":"p","user":"u","model":"m","engine":"e","node":"n","gpus":1,"at":"2025-03-01T12:00:00Z","smoke":[],"load":[]}`,
			want:   &ServeTest{ID: "st-1", LeaseID: "l-1", Project: "p", User: "u", Model: "m", Engine: "e", Node: "n", GPUs: 1, At: t0, Smoke: []ServeSmoke{}, Load: []ServeLoad{}}},
		{name: "ServeTests", call: func(ctx context.Context, c *Client) (any, error) { return c.ServeTests(ctx, "m") },
			route: "GET /v1/serve-tests", query: url.Values{"model": {"m"}}, answer: `{"tests":[]}`, want: []ServeTest{}},
		{name: "ServeUsage", call: func(ctx context.Context, c *Client) (any, error) { return c.ServeUsage(ctx, 7) },
			route: "GET /v1/serve/usage", query: url.Values{"days": {"7"}},
			answer: `{"usage":[{"project":"p","model":"m","day":"2026-12-06","usage":{"requests":3,"errors":0,"prompt_tokens":4,"completion_tokens":5}}]}`,
			want:   []ServeUsageRow{{Project: "p", Model: "m", Day: "2026-12-06", Usage: ServeUsage{Requests: 3, PromptTokens: 4, CompletionTokens: 5}}}},
		{name: "GetJob", call: func(ctx context.Context, c *Client) (any, error) { return c.GetJob(ctx, "j-1") },
			route: "GET /v1/jobs/{id}", values: map[string]string{"id": "j-1"}, answer: mustJSON(job), want: job},
		{name: "JobLogs", call: func(ctx context.Context, c *Client) (any, error) { return readAll(c.JobLogs(ctx, "j-1", false)) },
			route: "GET /v1/jobs/{id}/logs", values: map[string]string{"id": "j-1"}, answer: "line 1\nline 2\n", want: "line 1\nline 2\n"},
		{name: "JobLogs follows", call: func(ctx context.Context, c *Client) (any, error) { return readAll(c.JobLogs(ctx, "j-1", true)) },
			route: "GET /v1/jobs/{id}/logs", values: map[string]string{"id": "j-1"}, query: url.Values{"follow": {"1"}}, answer: "x", want: "x"},
		{name: "Nodes", call: func(ctx context.Context, c *Client) (any, error) { return c.Nodes(ctx) },
			route: "GET /v1/nodes", answer: `{"nodes":[` + nodeJSON + `]}`, want: []Node{*node}},
		{name: "Node", call: func(ctx context.Context, c *Client) (any, error) { return c.Node(ctx, "n1") },
			route: "GET /v1/nodes/{id}", values: map[string]string{"id": "n1"}, answer: nodeJSON, want: node},
		{name: "DrainNode", call: func(ctx context.Context, c *Client) (any, error) {
			return c.DrainNode(ctx, "n1", DrainRequest{Devices: []string{"gpu0"}, Reason: "fan"})
		},
			route: "POST /v1/nodes/{id}/drain", values: map[string]string{"id": "n1"}, body: `{"devices":["gpu0"],"reason":"fan"}`, answer: nodeJSON, want: node},
		{name: "DrainNode undrains", call: func(ctx context.Context, c *Client) (any, error) {
			return c.DrainNode(ctx, "n1", DrainRequest{Undrain: true})
		},
			route: "POST /v1/nodes/{id}/drain", values: map[string]string{"id": "n1"}, body: `{"undrain":true}`, answer: nodeJSON, want: node},
		{name: "ForgetNode", call: func(ctx context.Context, c *Client) (any, error) { return nil, c.ForgetNode(ctx, "n1") },
			route: "DELETE /v1/nodes/{id}", values: map[string]string{"id": "n1"}, answer: `{"forgotten":"n1"}`},
		{name: "ReplaceNode", call: func(ctx context.Context, c *Client) (any, error) { return c.ReplaceNode(ctx, "n1") },
			route: "POST /v1/nodes/{id}/replace", values: map[string]string{"id": "n1"}, answer: nodeJSON, want: node},
		{name: "Projects", call: func(ctx context.Context, c *Client) (any, error) { return c.Projects(ctx) },
			route: "GET /v1/projects", answer: `{"projects":[` + mustJSON(project) + `]}`, want: []Project{*project}},
		{name: "PutProject", call: func(ctx context.Context, c *Client) (any, error) { return c.PutProject(ctx, *project) },
			route: "PUT /v1/projects/{name}", values: map[string]string{"name": "vision"}, body: mustJSON(project), answer: mustJSON(project), want: project},
		{name: "Users", call: func(ctx context.Context, c *Client) (any, error) { return c.Users(ctx) },
			route: "GET /v1/users", answer: `{"users":[{"id":"u-1","name":"ana","role":"member","created_at":"2025-03-01T12:00:00Z"}]}`,
			want: []User{{ID: "u-1", Name: "ana", Role: RoleMember, Created: t0}}},
		{name: "DeleteUser", call: func(ctx context.Context, c *Client) (any, error) { return nil, c.DeleteUser(ctx, "ana") },
			route: "DELETE /v1/users/{name}", values: map[string]string{"name": "ana"}, answer: `{"deleted":"ana"}`},
		{name: "Tokens", call: func(ctx context.Context, c *Client) (any, error) { return c.Tokens(ctx) },
			route: "GET /v1/tokens", answer: `{"tokens":[]}`, want: []Token{}},
		{name: "CreateToken", call: func(ctx context.Context, c *Client) (any, error) {
			return c.CreateToken(ctx, TokenRequest{User: "ana", Projects: []string{"vision"}, TTLSeconds: 60})
		},
			route: "POST /v1/tokens", body: `{"user":"ana","projects":["vision"],"ttl_s":60}`, status: 201, answer: mustJSON(token), want: token},
		{name: "DeleteToken", call: func(ctx context.Context, c *Client) (any, error) { return nil, c.DeleteToken(ctx, "t1") },
			route: "DELETE /v1/tokens/{id}", values: map[string]string{"id": "t1"}, answer: `{"deleted":"t1"}`},
		{name: "JoinTokens", call: func(ctx context.Context, c *Client) (any, error) { return c.JoinTokens(ctx) },
			route: "GET /v1/join-tokens", answer: `{"join_tokens":[` + mustJSON(jt) + `]}`, want: []JoinToken{*jt}},
		{name: "CreateJoinToken", call: func(ctx context.Context, c *Client) (any, error) {
			return c.CreateJoinToken(ctx, JoinTokenRequest{TTLSeconds: 3600, Uses: 2})
		},
			route: "POST /v1/join-tokens", body: `{"ttl_s":3600,"uses":2}`, status: 201, answer: mustJSON(jt), want: jt},
		{name: "RevokeJoinToken", call: func(ctx context.Context, c *Client) (any, error) { return nil, c.RevokeJoinToken(ctx, "jt1") },
			route: "DELETE /v1/join-tokens/{id}", values: map[string]string{"id": "jt1"}, answer: `{"revoked":"jt1"}`},
		{name: "Events", call: func(ctx context.Context, c *Client) (any, error) { return c.Events(ctx, EventFilter{}) },
			route: "GET /v1/events", answer: `{"events":[{"seq":4,"at":"2025-03-01T12:00:00Z","kind":"lease.granted","subject":"l-1","message":"m"}]}`,
			want: []Event{{Seq: 4, At: t0, Kind: "lease.granted", Subject: "l-1", Message: "m"}}},
		{name: "Events after", call: func(ctx context.Context, c *Client) (any, error) {
			return c.Events(ctx, EventFilter{After: 41, Limit: 10})
		},
			route: "GET /v1/events", query: url.Values{"after": {"41"}, "limit": {"10"}}, answer: `{"events":[]}`, want: []Event{}},
		{name: "Join", call: func(ctx context.Context, c *Client) (any, error) {
			return c.Join(ctx, JoinRequest{Token: "jt", Node: "n1", CSRPEM: "csr"})
		},
			route: "POST /v1/join", body: `{"token":"jt","node":"n1","csr_pem":"csr"}`,
			answer: `{"node":"n1","cert_pem":"c","ca_pem":"ca"}`, want: &JoinResponse{Node: "n1", CertPEM: "c", CAPEM: "ca"}},
		{name: "Register", call: func(ctx context.Context, c *Client) (any, error) {
			return c.Register(ctx, "n1", RegisterRequest{Executor: "process", Running: []string{"j-1"}})
		},
			route: "PUT /v1/agent/nodes/{node}", values: map[string]string{"node": "n1"}, body: `{"snapshot":null,"executor":"process","running":["j-1"]}`,
			answer: nodeJSON, want: node},
		{name: "Heartbeat", call: func(ctx context.Context, c *Client) (any, error) {
			return c.Heartbeat(ctx, "n1", Heartbeat{Running: []string{}, WaitMS: 5000})
		},
			route: "POST /v1/agent/nodes/{node}/heartbeat", values: map[string]string{"node": "n1"}, body: `{"running":[],"wait_ms":5000}`,
			answer: `{"stop":[{"job_id":"j-1","grace_ms":100,"reason":"expired"}]}`,
			want:   &HeartbeatReply{Stop: []StopOrder{{JobID: "j-1", GraceMS: 100, Reason: "expired"}}}},
		{name: "JobExit", call: func(ctx context.Context, c *Client) (any, error) {
			return c.JobExit(ctx, "n1", "j-1", ExitReport{Code: 1, Reason: "exited"})
		},
			route: "POST /v1/agent/nodes/{node}/jobs/{job}/exit", values: map[string]string{"node": "n1", "job": "j-1"}, body: `{"code":1,"reason":"exited"}`,
			answer: `{"status":"recorded"}`, want: true},
		{name: "JobExit ignored", call: func(ctx context.Context, c *Client) (any, error) {
			return c.JobExit(ctx, "n1", "j-1", ExitReport{Code: 0, Reason: "exited"})
		},
			route: "POST /v1/agent/nodes/{node}/jobs/{job}/exit", values: map[string]string{"node": "n1", "job": "j-1"}, body: `{"code":0,"reason":"exited"}`,
			answer: `{"status":"ignored"}`, want: false},
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func readAll(rc io.ReadCloser, err error) (string, error) {
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

// TestTypedCalls: each method reaches its route with the path values,
// query and body the server reads, sends the token, and decodes the
// answer; together they call every route the API has.
func TestTypedCalls(t *testing.T) {
	r := newRecorder(t)
	reached := map[string]bool{}
	for _, c := range callCases() {
		r.set(c.status, c.answer)
		got, err := c.call(context.Background(), r.client)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		reqs := r.take()
		if len(reqs) != 1 {
			t.Errorf("%s: %d requests, want 1: %+v", c.name, len(reqs), reqs)
			continue
		}
		q := reqs[0]
		reached[q.Pattern] = true
		if q.Pattern != c.route {
			t.Errorf("%s: reached %q, want %q", c.name, q.Pattern, c.route)
		}
		if c.values == nil {
			c.values = map[string]string{}
		}
		if !reflect.DeepEqual(q.Values, c.values) {
			t.Errorf("%s: path values %v, want %v", c.name, q.Values, c.values)
		}
		if c.query == nil {
			c.query = url.Values{}
		}
		if !reflect.DeepEqual(q.Query, c.query) {
			t.Errorf("%s: query %q, want %v", c.name, q.RawQuery, c.query)
		}
		switch {
		case c.body == "" && len(q.Body) > 0:
			t.Errorf("%s: sent a body %s, want none", c.name, q.Body)
		case c.body != "" && !sameJSON(t, q.Body, []byte(c.body)):
			t.Errorf("%s: sent %s, want %s", c.name, q.Body, c.body)
		case c.body != "" && q.ContentType != "application/json":
			t.Errorf("%s: content type %q", c.name, q.ContentType)
		}
		if q.Auth != "Bearer kiln_t_secret" {
			t.Errorf("%s: Authorization %q", c.name, q.Auth)
		}
		if c.want != nil && !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: decoded %s, want %s", c.name, mustJSON(got), mustJSON(c.want))
		}
	}

	// The log chunk: raw bytes, not JSON.
	r.set(http.StatusNoContent, "")
	chunk := []byte("\x00binary\xff output\n")
	if err := r.client.JobLogChunk(context.Background(), "n1", "j-1", chunk); err != nil {
		t.Fatal(err)
	}
	reqs := r.take()
	if len(reqs) != 1 || reqs[0].Pattern != "POST /v1/agent/nodes/{node}/jobs/{job}/logs" || reqs[0].Values["node"] != "n1" || reqs[0].Values["job"] != "j-1" ||
		!bytes.Equal(reqs[0].Body, chunk) || reqs[0].ContentType != "application/octet-stream" {
		t.Errorf("JobLogChunk sent %+v", reqs)
	} else {
		reached[reqs[0].Pattern] = true
	}

	for _, rt := range r.routes {
		if !reached[rt] && !streamed(rt) {
			t.Errorf("no typed method calls %s", rt)
		}
	}
}

// streamed are the routes whose bodies are full-duplex streams (HTTP/2),
// which this recorder (HTTP/1.1, bodies read whole) cannot answer, and
// the HTTP path to a job's port, which any HTTP client calls: server's
// TestTunnels reaches each through the typed methods (ConnectPort,
// TunnelOrders, AcceptTunnel, RefuseTunnel) and net/http, and its
// TestSessions reaches the sessions route through OpenSession; and the
// OpenAI-compatible endpoint, which OpenAI's clients call (kiln serve's
// end-to-end test does).
func streamed(route string) bool {
	_, path, _ := strings.Cut(route, " ")
	return (strings.HasPrefix(path, "/v1/leases/{id}/ports/") && !strings.HasSuffix(path, "/browser")) || strings.HasPrefix(path, "/v1/agent/nodes/{node}/tunnels") ||
		path == "/v1/leases/{id}/sessions" || strings.HasPrefix(path, "/openai/v1/")
}

// idCalls are the methods that put an id in the path, with the route and
// the path value it must reach.
func idCalls() []struct {
	name, route, param string
	call               func(ctx context.Context, c *Client, id string) error
} {
	type idc = struct {
		name, route, param string
		call               func(ctx context.Context, c *Client, id string) error
	}
	discard := func(_ any, err error) error { return err }
	return []idc{
		{"GetLease", "GET /v1/leases/{id}", "id", func(ctx context.Context, c *Client, id string) error {
			return discard(c.GetLease(ctx, id, LeaseWait{Since: "queued/1", For: time.Second}))
		}},
		{"CancelLease", "DELETE /v1/leases/{id}", "id", func(ctx context.Context, c *Client, id string) error { return discard(c.CancelLease(ctx, id)) }},
		{"AddJob", "POST /v1/leases/{id}/jobs", "id", func(ctx context.Context, c *Client, id string) error {
			return discard(c.AddJob(ctx, id, JobSpec{Command: []string{"true"}}))
		}},
		{"GetJob", "GET /v1/jobs/{id}", "id", func(ctx context.Context, c *Client, id string) error { return discard(c.GetJob(ctx, id)) }},
		{"JobLogs", "GET /v1/jobs/{id}/logs", "id", func(ctx context.Context, c *Client, id string) error {
			return discard(readAll(c.JobLogs(ctx, id, true)))
		}},
		{"Node", "GET /v1/nodes/{id}", "id", func(ctx context.Context, c *Client, id string) error { return discard(c.Node(ctx, id)) }},
		{"DrainNode", "POST /v1/nodes/{id}/drain", "id", func(ctx context.Context, c *Client, id string) error {
			return discard(c.DrainNode(ctx, id, DrainRequest{}))
		}},
		{"ForgetNode", "DELETE /v1/nodes/{id}", "id", func(ctx context.Context, c *Client, id string) error { return c.ForgetNode(ctx, id) }},
		{"ReplaceNode", "POST /v1/nodes/{id}/replace", "id", func(ctx context.Context, c *Client, id string) error { return discard(c.ReplaceNode(ctx, id)) }},
		{"PutProject", "PUT /v1/projects/{name}", "name", func(ctx context.Context, c *Client, id string) error {
			return discard(c.PutProject(ctx, Project{Name: id}))
		}},
		{"DeleteUser", "DELETE /v1/users/{name}", "name", func(ctx context.Context, c *Client, id string) error { return c.DeleteUser(ctx, id) }},
		{"DeleteToken", "DELETE /v1/tokens/{id}", "id", func(ctx context.Context, c *Client, id string) error { return c.DeleteToken(ctx, id) }},
		{"RevokeJoinToken", "DELETE /v1/join-tokens/{id}", "id", func(ctx context.Context, c *Client, id string) error { return c.RevokeJoinToken(ctx, id) }},
		{"Register", "PUT /v1/agent/nodes/{node}", "node", func(ctx context.Context, c *Client, id string) error {
			return discard(c.Register(ctx, id, RegisterRequest{}))
		}},
		{"Heartbeat", "POST /v1/agent/nodes/{node}/heartbeat", "node", func(ctx context.Context, c *Client, id string) error {
			return discard(c.Heartbeat(ctx, id, Heartbeat{}))
		}},
		{"JobExit node", "POST /v1/agent/nodes/{node}/jobs/{job}/exit", "node", func(ctx context.Context, c *Client, id string) error {
			return discard(c.JobExit(ctx, id, "j-1", ExitReport{}))
		}},
		{"JobExit job", "POST /v1/agent/nodes/{node}/jobs/{job}/exit", "job", func(ctx context.Context, c *Client, id string) error {
			return discard(c.JobExit(ctx, "n1", id, ExitReport{}))
		}},
		{"JobLogChunk node", "POST /v1/agent/nodes/{node}/jobs/{job}/logs", "node", func(ctx context.Context, c *Client, id string) error {
			return c.JobLogChunk(ctx, id, "j-1", []byte("x"))
		}},
		{"JobLogChunk job", "POST /v1/agent/nodes/{node}/jobs/{job}/logs", "job", func(ctx context.Context, c *Client, id string) error {
			return c.JobLogChunk(ctx, "n1", id, []byte("x"))
		}},
	}
}

// hostileIDs would reach another endpoint, or add a query, if they were
// put in a path as they are: "../admin" climbs a level, "?" and "#" end
// the path, "." and ".." are steps a server cleans away, "%2e%2e" would be
// a step once unescaped, and a "/" makes two segments.
var hostileIDs = []string{"../admin", "x?y=1", "x#y", "..", ".", "%2e%2e", "a/b", "../../v1/tokens", "a b", "l-1/jobs", "?all=1", "é"}

// TestIDsStayOneSegment: whatever an id holds, it reaches the route its
// method names as one path segment, read back unchanged, with no query it
// did not mean.
func TestIDsStayOneSegment(t *testing.T) {
	r := newRecorder(t)
	r.set(http.StatusOK, `{}`)
	for _, c := range idCalls() {
		for _, id := range hostileIDs {
			if err := c.call(context.Background(), r.client, id); err != nil {
				t.Errorf("%s(%q): %v", c.name, id, err)
				continue
			}
			reqs := r.take()
			if len(reqs) != 1 {
				t.Errorf("%s(%q): %d requests (redirected?): %+v", c.name, id, len(reqs), reqs)
				continue
			}
			q := reqs[0]
			if q.Pattern != c.route || q.Values[c.param] != id {
				t.Errorf("%s(%q): reached %s with %v, want %s with %s=%q", c.name, id, q.Pattern, q.Values, c.route, c.param, id)
			}
			if strings.HasPrefix(c.name, "GetLease") {
				if q.RawQuery != "since=queued%2F1&wait_s=1" {
					t.Errorf("%s(%q): query %q", c.name, id, q.RawQuery)
				}
			} else if strings.HasPrefix(c.name, "JobLogs") {
				if q.RawQuery != "follow=1" {
					t.Errorf("%s(%q): query %q", c.name, id, q.RawQuery)
				}
			} else if q.RawQuery != "" {
				t.Errorf("%s(%q): query %q, want none", c.name, id, q.RawQuery)
			}
		}
	}
}

// TestQueryValuesEncoded: filter values holding "&", "=", "#" or "+" stay
// the values they are.
func TestQueryValuesEncoded(t *testing.T) {
	r := newRecorder(t)
	r.set(http.StatusOK, `{"leases":[]}`)
	for _, v := range []string{"a&all=1", "x=y", "p#frag", "a+b c", "é/?"} {
		if _, err := r.client.ListLeases(context.Background(), LeaseFilter{Project: v, State: v}); err != nil {
			t.Fatal(err)
		}
		q := r.take()[0]
		if !reflect.DeepEqual(q.Query, url.Values{"project": {v}, "state": {v}}) {
			t.Errorf("ListLeases(%q): the server read %v", v, q.Query)
		}
	}
	r.set(http.StatusOK, `{}`)
	since := "queued/1&wait_s=300"
	if _, err := r.client.GetLease(context.Background(), "l-1", LeaseWait{Since: since, For: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if q := r.take()[0]; !reflect.DeepEqual(q.Query, url.Values{"since": {since}, "wait_s": {"2"}}) {
		t.Errorf("GetLease: the server read %v", q.Query)
	}
}

// TestEmptyIDRefused: an empty id would name another route (the list, or
// none): nothing is sent.
func TestEmptyIDRefused(t *testing.T) {
	r := newRecorder(t)
	for _, c := range idCalls() {
		err := c.call(context.Background(), r.client, "")
		if err == nil || !strings.Contains(err.Error(), "is empty") {
			t.Errorf("%s(\"\"): %v, want a refusal", c.name, err)
		}
		if got := r.take(); len(got) != 0 {
			t.Errorf("%s(\"\"): sent %+v", c.name, got)
		}
	}
}

// TestErrors: the server's error answer comes back as *Error with its
// status and its message unchanged; an answer that is not the server's
// JSON says what was asked and what came.
func TestErrors(t *testing.T) {
	r := newRecorder(t)
	ctx := context.Background()

	r.set(http.StatusNotFound, `{"error":"lease l-9 not found"}`+"\n")
	_, err := r.client.GetLease(ctx, "l-9", LeaseWait{})
	var e *Error
	if !errors.As(err, &e) || e.Status != 404 || e.Message != "lease l-9 not found" || err.Error() != "lease l-9 not found" {
		t.Errorf("404: %#v", err)
	}
	if StatusOf(err) != 404 {
		t.Errorf("StatusOf = %d", StatusOf(err))
	}

	r.set(http.StatusConflict, `{"error":"lease l-1 is done: jobs run only in a queued or granted lease"}`)
	_, err = r.client.AddJob(ctx, "l-1", JobSpec{Command: []string{"true"}})
	if !errors.As(err, &e) || e.Status != 409 || e.Message != "lease l-1 is done: jobs run only in a queued or granted lease" {
		t.Errorf("409: %#v", err)
	}
	// Wrapped, it is still found.
	if w := fmtWrap(err); StatusOf(w) != 409 || !errors.As(w, &e) {
		t.Errorf("wrapped 409: %v", w)
	}

	r.set(http.StatusForbidden, `{"error":"only an admin may do this"}`)
	if err := r.client.ForgetNode(ctx, "n1"); StatusOf(err) != 403 || err.Error() != "only an admin may do this" {
		t.Errorf("403 without an answer to decode: %v", err)
	}

	r.set(http.StatusBadGateway, "<html>bad gateway</html>\n")
	_, err = r.client.ListLeases(ctx, LeaseFilter{State: "done"})
	if StatusOf(err) != 502 || err.Error() != "GET /v1/leases?state=done: <html>bad gateway</html>" {
		t.Errorf("502 with a body that is not JSON: %v", err)
	}

	r.set(http.StatusServiceUnavailable, "")
	_, err = r.client.Nodes(ctx)
	if StatusOf(err) != 503 || err.Error() != "GET /v1/nodes: 503 Service Unavailable" {
		t.Errorf("503 without a body: %v", err)
	}

	r.set(http.StatusOK, `{"id": 3}`)
	_, err = r.client.Node(ctx, "n1")
	if err == nil || StatusOf(err) != 0 || !strings.Contains(err.Error(), "GET /v1/nodes/n1: reading the answer") {
		t.Errorf("an answer that does not decode: %v", err)
	}

	r.set(http.StatusNotFound, `{"error":"job j-1 not found"}`)
	if _, err := r.client.JobLogs(ctx, "j-1", true); StatusOf(err) != 404 || err.Error() != "job j-1 not found" {
		t.Errorf("JobLogs 404: %v", err)
	}
	if err := r.client.JobLogChunk(ctx, "n1", "j-1", []byte("x")); StatusOf(err) != 404 {
		t.Errorf("JobLogChunk 404: %v", err)
	}
}

func fmtWrap(err error) error { return errors.Join(errors.New("context"), err) }

func TestPathOf(t *testing.T) {
	for _, c := range []struct {
		pattern string
		ids     []string
		want    string
	}{
		{"/v1/leases", nil, "/v1/leases"},
		{"/v1/leases/{lease id}", []string{"l-1"}, "/v1/leases/l-1"},
		{"/v1/leases/{lease id}/jobs", []string{"../admin"}, "/v1/leases/..%2Fadmin/jobs"},
		{"/v1/agent/nodes/{node}/jobs/{job id}/exit", []string{"n 1", "x?y"}, "/v1/agent/nodes/n%201/jobs/x%3Fy/exit"},
		{"/v1/nodes/{node}", []string{".."}, "/v1/nodes/%2E%2E"},
		{"/v1/nodes/{node}", []string{"."}, "/v1/nodes/%2E"},
		{"/v1/nodes/{node}", []string{"..."}, "/v1/nodes/..."},
	} {
		got, err := pathOf(c.pattern, c.ids...)
		if err != nil || got != c.want {
			t.Errorf("pathOf(%q, %q) = %q, %v; want %q", c.pattern, c.ids, got, err, c.want)
		}
	}
	if _, err := pathOf("/v1/nodes/{node}"); err == nil {
		t.Error("a placeholder left unfilled is not refused")
	}
	if _, err := pathOf("/v1/nodes", "n1"); err == nil {
		t.Error("an id with no placeholder is not refused")
	}
	if _, err := pathOf("/v1/nodes/{node name}", ""); err == nil || err.Error() != "the node name is empty" {
		t.Errorf("empty id: %v", err)
	}
}
