package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The typed methods below are the API of server/routes.go, one method a
// route. Ids given to them are sent as one path segment each, escaped, and
// query values are encoded: an id holding "/", "?", "#" or ".." reaches
// the route the method names, never another. Errors the server answers are
// *Error, with the status and the server's message.

// pathOf fills the placeholders of pattern ("/v1/leases/{lease id}/jobs")
// with ids, in order, each escaped as one path segment. "." and ".." are
// escaped in full ("%2E"), so that they are not taken for steps in the
// path (the server reads them back as the ids they are). An empty id is
// refused: it would name another route.
func pathOf(pattern string, ids ...string) (string, error) {
	var b strings.Builder
	rest := pattern
	for _, id := range ids {
		open := strings.IndexByte(rest, '{')
		end := strings.IndexByte(rest, '}')
		if open < 0 || end < open {
			return "", fmt.Errorf("api: %s has fewer placeholders than ids", pattern)
		}
		name := rest[open+1 : end]
		if id == "" {
			return "", fmt.Errorf("the %s is empty", name)
		}
		b.WriteString(rest[:open])
		b.WriteString(segment(id))
		rest = rest[end+1:]
	}
	if strings.IndexByte(rest, '{') >= 0 {
		return "", fmt.Errorf("api: %s has more placeholders than ids", pattern)
	}
	b.WriteString(rest)
	return b.String(), nil
}

// segment escapes s as one path segment.
func segment(s string) string {
	switch s {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(s)
}

// withQuery adds the encoded query to path, when there is one.
func withQuery(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// call builds the path from pattern and ids, sends in as JSON (when not
// nil) and decodes the answer into out (when not nil).
func (c *Client) call(ctx context.Context, method string, q url.Values, in, out any, pattern string, ids ...string) error {
	p, err := pathOf(pattern, ids...)
	if err != nil {
		return err
	}
	return c.Do(ctx, method, withQuery(p, q), in, out)
}

// Health asks GET /healthz; nil when the server is up and its store
// writes.
func (c *Client) Health(ctx context.Context) error {
	resp, err := c.Raw(ctx, "GET", "/healthz", nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// maxMetrics bounds a scrape read by Metrics.
const maxMetrics = 64 << 20

// Metrics reads GET /metrics (an admin's): the server's Prometheus series
// in the text format.
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	resp, err := c.Raw(ctx, "GET", "/metrics", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetrics+1))
	if err == nil && len(b) > maxMetrics {
		err = fmt.Errorf("GET /metrics: more than %d bytes", maxMetrics)
	}
	return b, err
}

// WhoAmI says who the server takes the caller for.
func (c *Client) WhoAmI(ctx context.Context) (*WhoAmI, error) {
	var w WhoAmI
	if err := c.call(ctx, "GET", nil, nil, &w, "/v1/whoami"); err != nil {
		return nil, err
	}
	return &w, nil
}

// Leases.

// CreateLease asks for GPUs; the answer is the lease, queued or granted.
func (c *Client) CreateLease(ctx context.Context, req LeaseRequest) (*Lease, error) {
	var l Lease
	if err := c.call(ctx, "POST", nil, req, &l, "/v1/leases"); err != nil {
		return nil, err
	}
	return &l, nil
}

// LeaseWait makes GetLease a long poll: the server answers once the
// lease's version differs from Since, or after For.
type LeaseWait struct {
	// Since is the version of the lease seen last (LeaseVersion).
	Since string
	// For is the longest the server waits, at most 5 minutes; 0: it
	// answers at once.
	For time.Duration
}

// LeaseVersion is the version of a lease that GetLease waits to change
// from: its state and queue position, "queued/3", and a deployment's
// state, "granted/0/ready" (the server sends the same in the
// X-Kiln-Lease-Version header).
func LeaseVersion(l *Lease) string {
	v := l.State + "/" + strconv.Itoa(l.QueuePosition)
	if l.Deployment != nil {
		v += "/" + l.Deployment.State
	}
	return v
}

// GetLease returns a lease; with a LeaseWait it waits for the lease to
// change first.
func (c *Client) GetLease(ctx context.Context, id string, wait LeaseWait) (*Lease, error) {
	q := url.Values{}
	if wait.For > 0 {
		q.Set("wait_s", strconv.FormatFloat(wait.For.Seconds(), 'f', -1, 64))
	}
	if wait.Since != "" {
		q.Set("since", wait.Since)
	}
	var l Lease
	if err := c.call(ctx, "GET", q, nil, &l, "/v1/leases/{lease id}", id); err != nil {
		return nil, err
	}
	return &l, nil
}

// LeaseFilter selects the leases ListLeases returns; the zero value: the
// live leases of every project the caller may see.
type LeaseFilter struct {
	// All adds the leases that ended.
	All     bool
	Project string
	State   string
}

// ListLeases returns the leases the caller may see, oldest first.
func (c *Client) ListLeases(ctx context.Context, f LeaseFilter) ([]Lease, error) {
	q := url.Values{}
	if f.All {
		q.Set("all", "1")
	}
	if f.Project != "" {
		q.Set("project", f.Project)
	}
	if f.State != "" {
		q.Set("state", f.State)
	}
	var list LeaseList
	if err := c.call(ctx, "GET", q, nil, &list, "/v1/leases"); err != nil {
		return nil, err
	}
	return list.Leases, nil
}

// CancelLease removes a queued lease or releases a granted one; the answer
// is the lease after.
func (c *Client) CancelLease(ctx context.Context, id string) (*Lease, error) {
	var l Lease
	if err := c.call(ctx, "DELETE", nil, nil, &l, "/v1/leases/{lease id}", id); err != nil {
		return nil, err
	}
	return &l, nil
}

// Jobs.

// AddJob runs a job in a lease.
func (c *Client) AddJob(ctx context.Context, leaseID string, spec JobSpec) (*Job, error) {
	var j Job
	if err := c.call(ctx, "POST", nil, spec, &j, "/v1/leases/{lease id}/jobs", leaseID); err != nil {
		return nil, err
	}
	return &j, nil
}

// GetJob returns a job.
func (c *Client) GetJob(ctx context.Context, id string) (*Job, error) {
	var j Job
	if err := c.call(ctx, "GET", nil, nil, &j, "/v1/jobs/{job id}", id); err != nil {
		return nil, err
	}
	return &j, nil
}

// JobLogs returns a job's output, as kept so far or, with follow, as it
// comes until the job ends. The caller closes it.
func (c *Client) JobLogs(ctx context.Context, id string, follow bool) (io.ReadCloser, error) {
	p, err := pathOf("/v1/jobs/{job id}/logs", id)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.Raw(ctx, "GET", withQuery(p, q), nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Nodes.

// Nodes returns every node with its devices.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var nl NodeList
	if err := c.call(ctx, "GET", nil, nil, &nl, "/v1/nodes"); err != nil {
		return nil, err
	}
	return nl.Nodes, nil
}

// Node returns one node.
func (c *Client) Node(ctx context.Context, id string) (*Node, error) {
	var n Node
	if err := c.call(ctx, "GET", nil, nil, &n, "/v1/nodes/{node name}", id); err != nil {
		return nil, err
	}
	return &n, nil
}

// DrainNode drains a node's devices, undrains them or frees what lost
// leases hold, as req says (admins); the answer is the node after.
func (c *Client) DrainNode(ctx context.Context, id string, req DrainRequest) (*Node, error) {
	var n Node
	if err := c.call(ctx, "POST", nil, req, &n, "/v1/nodes/{node name}/drain", id); err != nil {
		return nil, err
	}
	return &n, nil
}

// ForgetNode removes a node that is not ready (admins).
func (c *Client) ForgetNode(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", nil, nil, nil, "/v1/nodes/{node name}", id)
}

// ReplaceNode lets the next agent that joins take the node's name with a
// new key (admins); the answer is the node.
func (c *Client) ReplaceNode(ctx context.Context, id string) (*Node, error) {
	var n Node
	if err := c.call(ctx, "POST", nil, nil, &n, "/v1/nodes/{node name}/replace", id); err != nil {
		return nil, err
	}
	return &n, nil
}

// Projects and users.

// Projects returns the projects the caller may see, with their use.
func (c *Client) Projects(ctx context.Context) ([]Project, error) {
	var out struct {
		Projects []Project `json:"projects"`
	}
	if err := c.call(ctx, "GET", nil, nil, &out, "/v1/projects"); err != nil {
		return nil, err
	}
	return out.Projects, nil
}

// PutProject creates or changes a project, p.Name (admins).
func (c *Client) PutProject(ctx context.Context, p Project) (*Project, error) {
	var got Project
	if err := c.call(ctx, "PUT", nil, p, &got, "/v1/projects/{project name}", p.Name); err != nil {
		return nil, err
	}
	return &got, nil
}

// Users returns every user (admins).
func (c *Client) Users(ctx context.Context) ([]User, error) {
	var out struct {
		Users []User `json:"users"`
	}
	if err := c.call(ctx, "GET", nil, nil, &out, "/v1/users"); err != nil {
		return nil, err
	}
	return out.Users, nil
}

// DeleteUser removes a user with its tokens and memberships (admins).
func (c *Client) DeleteUser(ctx context.Context, name string) error {
	return c.call(ctx, "DELETE", nil, nil, nil, "/v1/users/{user name}", name)
}

// Tokens.

// Tokens returns the caller's API tokens (an admin's: everyone's), without
// their secrets.
func (c *Client) Tokens(ctx context.Context) ([]Token, error) {
	var out struct {
		Tokens []Token `json:"tokens"`
	}
	if err := c.call(ctx, "GET", nil, nil, &out, "/v1/tokens"); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// CreateToken makes an API token; its Secret is shown this once.
func (c *Client) CreateToken(ctx context.Context, req TokenRequest) (*Token, error) {
	var t Token
	if err := c.call(ctx, "POST", nil, req, &t, "/v1/tokens"); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteToken revokes an API token.
func (c *Client) DeleteToken(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", nil, nil, nil, "/v1/tokens/{token id}", id)
}

// JoinTokens returns the join tokens (admins).
func (c *Client) JoinTokens(ctx context.Context) ([]JoinToken, error) {
	var out struct {
		JoinTokens []JoinToken `json:"join_tokens"`
	}
	if err := c.call(ctx, "GET", nil, nil, &out, "/v1/join-tokens"); err != nil {
		return nil, err
	}
	return out.JoinTokens, nil
}

// CreateJoinToken makes a join token (admins); its Secret and Command are
// shown this once.
func (c *Client) CreateJoinToken(ctx context.Context, req JoinTokenRequest) (*JoinToken, error) {
	var jt JoinToken
	if err := c.call(ctx, "POST", nil, req, &jt, "/v1/join-tokens"); err != nil {
		return nil, err
	}
	return &jt, nil
}

// RevokeJoinToken ends a join token (admins).
func (c *Client) RevokeJoinToken(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", nil, nil, nil, "/v1/join-tokens/{join token id}", id)
}

// Events.

// EventFilter selects the events Events returns.
type EventFilter struct {
	// After: only events with a greater Seq.
	After int64
	// Limit is the most events answered; 0: the server's default.
	Limit int
}

// Events returns the event log the caller may see, oldest first.
func (c *Client) Events(ctx context.Context, f EventFilter) ([]Event, error) {
	q := url.Values{}
	if f.After > 0 {
		q.Set("after", strconv.FormatInt(f.After, 10))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var out struct {
		Events []Event `json:"events"`
	}
	if err := c.call(ctx, "GET", q, nil, &out, "/v1/events"); err != nil {
		return nil, err
	}
	return out.Events, nil
}

// The agent's calls.

// Join asks for a node certificate with a join token.
func (c *Client) Join(ctx context.Context, req JoinRequest) (*JoinResponse, error) {
	var resp JoinResponse
	if err := c.call(ctx, "POST", nil, req, &resp, "/v1/join"); err != nil {
		return nil, err
	}
	return &resp, nil
}

// Register sends a node's snapshot; the answer is the node as the server
// sees it.
func (c *Client) Register(ctx context.Context, node string, req RegisterRequest) (*Node, error) {
	var n Node
	if err := c.call(ctx, "PUT", nil, req, &n, "/v1/agent/nodes/{node name}", node); err != nil {
		return nil, err
	}
	return &n, nil
}

// Heartbeat says the agent is alive and what it runs; the answer says what
// to start and stop.
func (c *Client) Heartbeat(ctx context.Context, node string, hb Heartbeat) (*HeartbeatReply, error) {
	var r HeartbeatReply
	if err := c.call(ctx, "POST", nil, hb, &r, "/v1/agent/nodes/{node name}/heartbeat", node); err != nil {
		return nil, err
	}
	return &r, nil
}

// JobExit reports how a job's task on the node ended; recorded is false
// when the server had nothing to record (the job was over already).
func (c *Client) JobExit(ctx context.Context, node, job string, rep ExitReport) (recorded bool, err error) {
	var out struct {
		Status string `json:"status"`
	}
	if err := c.call(ctx, "POST", nil, rep, &out, "/v1/agent/nodes/{node name}/jobs/{job id}/exit", node, job); err != nil {
		return false, err
	}
	return out.Status == "recorded", nil
}

// JobLogChunk adds output of a job's task on the node to its log.
func (c *Client) JobLogChunk(ctx context.Context, node, job string, chunk []byte) error {
	p, err := pathOf("/v1/agent/nodes/{node name}/jobs/{job id}/logs", node, job)
	if err != nil {
		return err
	}
	resp, err := c.send(ctx, "POST", p, "application/octet-stream", bytes.NewReader(chunk))
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// Tunnels.

// Stream is a connection carried through the server: what is written goes
// to the far end, what it sends is read. Close ends both ways.
type Stream struct {
	r    io.ReadCloser
	w    *io.PipeWriter
	once sync.Once
}

func (s *Stream) Read(p []byte) (int, error)  { return s.r.Read(p) }
func (s *Stream) Write(p []byte) (int, error) { return s.w.Write(p) }

// CloseWrite says the far end gets nothing more; what it sends is still
// read until it ends.
func (s *Stream) CloseWrite() error { return s.w.Close() }

// Close ends the stream both ways.
func (s *Stream) Close() error {
	s.once.Do(func() {
		_ = s.w.Close()
		_ = s.r.Close()
	})
	return nil
}

// openStream sends a full-duplex request (HTTP/2): the request body is
// what the caller writes, the answer's body what it reads.
func (c *Client) openStream(ctx context.Context, path string) (*Stream, error) {
	return c.openStreamWith(ctx, path, nil)
}

// openStreamWith opens a stream whose first bytes, written by first, go
// out before the server answers (it reads them to decide).
func (c *Client) openStreamWith(ctx context.Context, path string, first func(io.Writer) error) (*Stream, error) {
	pr, pw := io.Pipe()
	wrote := make(chan struct{})
	if first != nil {
		go func() {
			defer close(wrote)
			if err := first(pw); err != nil {
				pw.CloseWithError(err)
			}
		}()
	} else {
		close(wrote)
	}
	resp, err := c.send(ctx, "POST", path, "application/octet-stream", pr)
	if err != nil {
		pw.Close()
		<-wrote
		return nil, err
	}
	if resp.ProtoMajor < 2 {
		resp.Body.Close()
		pw.Close()
		<-wrote
		return nil, fmt.Errorf("POST %s: the connection to the server is %s; a tunnel needs HTTP/2", path, resp.Proto)
	}
	<-wrote
	return &Stream{r: resp.Body, w: pw}, nil
}

// ConnectPort opens a connection to a TCP port a job of the lease declared
// (JobSpec.Ports), through the server: the newest job that declares it,
// or job when given; its task of the given rank.
func (c *Client) ConnectPort(ctx context.Context, leaseID string, port int, job string, rank int) (*Stream, error) {
	p, err := pathOf("/v1/leases/{lease id}/ports/{port}/connect", leaseID, strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if job != "" {
		q.Set("job", job)
	}
	if rank != 0 {
		q.Set("rank", strconv.Itoa(rank))
	}
	return c.openStream(ctx, withQuery(p, q))
}

// OpenSession opens a session beside a job of the lease (kiln exec, kiln
// shell): the newest running job, or job when given; its task of the given
// rank. The caller sends req as the first frame (FrameOpen), then input;
// it reads output frames until FrameExit or FrameError.
func (c *Client) OpenSession(ctx context.Context, leaseID, job string, rank int, req SessionRequest) (*Stream, *FrameWriter, error) {
	if err := req.Check(); err != nil {
		return nil, nil, err
	}
	p, err := pathOf("/v1/leases/{lease id}/sessions", leaseID)
	if err != nil {
		return nil, nil, err
	}
	q := url.Values{}
	if job != "" {
		q.Set("job", job)
	}
	if rank != 0 {
		q.Set("rank", strconv.Itoa(rank))
	}
	st, err := c.openStreamWith(ctx, withQuery(p, q), func(w io.Writer) error {
		return NewFrameWriter(w).WriteJSON(FrameOpen, req)
	})
	if err != nil {
		return nil, nil, err
	}
	return st, NewFrameWriter(st), nil
}

// TunnelOrders is the agent's order stream: one TunnelOrder a line (blank
// lines keep it alive). The caller closes it.
func (c *Client) TunnelOrders(ctx context.Context, node string) (io.ReadCloser, error) {
	p, err := pathOf("/v1/agent/nodes/{node name}/tunnels", node)
	if err != nil {
		return nil, err
	}
	resp, err := c.Raw(ctx, "GET", p, nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// AcceptTunnel is the agent's side of tunnel id.
func (c *Client) AcceptTunnel(ctx context.Context, node, id string) (*Stream, error) {
	p, err := pathOf("/v1/agent/nodes/{node name}/tunnels/{tunnel id}", node, id)
	if err != nil {
		return nil, err
	}
	return c.openStream(ctx, p)
}

// RefuseTunnel tells the server why the agent could not connect tunnel id.
func (c *Client) RefuseTunnel(ctx context.Context, node, id, why string) error {
	p, err := pathOf("/v1/agent/nodes/{node name}/tunnels/{tunnel id}", node, id)
	if err != nil {
		return err
	}
	resp, err := c.send(ctx, "POST", withQuery(p, url.Values{"refused": {why}}), "application/octet-stream", http.NoBody)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// BrowserLink makes a link that opens the HTTP path to a port of the
// lease's job in a browser (one visit, within minutes).
// UILink asks for a link that signs a browser in to the web page (/ui/)
// as the caller, once.
func (c *Client) UILink(ctx context.Context) (*BrowserLink, error) {
	var out BrowserLink
	if err := c.call(ctx, "POST", nil, nil, &out, "/v1/ui/link"); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) BrowserLink(ctx context.Context, leaseID string, port int) (*BrowserLink, error) {
	var out BrowserLink
	if err := c.call(ctx, "POST", nil, nil, &out, "/v1/leases/{lease id}/ports/{port}/browser", leaseID, strconv.Itoa(port)); err != nil {
		return nil, err
	}
	return &out, nil
}

// ServeChoose asks how the server's nodes would serve a model (kiln serve):
// the engine, image, node and GPUs, with the engine's command filled.
func (c *Client) ServeChoose(ctx context.Context, req ServeChooseRequest) (*ServeChooseReply, error) {
	var out ServeChooseReply
	if err := c.call(ctx, "POST", nil, req, &out, "/v1/serve/choose"); err != nil {
		return nil, err
	}
	return &out, nil
}

// AddServeTest stores kiln serve test's results with the deployment (a
// serving lease of the caller's project); the server fills in where it
// ran.
func (c *Client) AddServeTest(ctx context.Context, leaseID string, t ServeTest) (*ServeTest, error) {
	var out ServeTest
	if err := c.call(ctx, "POST", nil, t, &out, "/v1/leases/{lease id}/serve-tests", leaseID); err != nil {
		return nil, err
	}
	return &out, nil
}

// ServeTests lists stored test results of the caller's projects, newest
// first; model "" lists every model's.
func (c *Client) ServeTests(ctx context.Context, model string) ([]ServeTest, error) {
	q := url.Values{}
	if model != "" {
		q.Set("model", model)
	}
	var out ServeTestList
	if err := c.call(ctx, "GET", q, nil, &out, "/v1/serve-tests"); err != nil {
		return nil, err
	}
	return out.Tests, nil
}

// ServeUsage lists what the endpoint routed per project, model and day for
// the caller's projects, over the last days days.
func (c *Client) ServeUsage(ctx context.Context, days int) ([]ServeUsageRow, error) {
	q := url.Values{}
	if days > 0 {
		q.Set("days", strconv.Itoa(days))
	}
	var out ServeUsageList
	if err := c.call(ctx, "GET", q, nil, &out, "/v1/serve/usage"); err != nil {
		return nil, err
	}
	return out.Usage, nil
}
