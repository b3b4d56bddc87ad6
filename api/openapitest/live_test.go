package openapitest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/server"
)

// hgxFixture is a recorded 8-GPU machine the agent of the tests reports.
const hgxFixture = "../../testdata/fixtures/h100-hgx8-sysfs"

// live is a kiln server on loopback and what it takes to call it.
type live struct {
	t     *testing.T
	srv   *server.Server
	url   string
	admin string // the bootstrap admin token
	pool  *x509.CertPool
}

// start runs a real server on 127.0.0.1 with a fresh data directory, over
// TLS with its own CA, until the test ends.
func start(t *testing.T) *live {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	srv, err := server.New(context.Background(), server.Config{
		DataDir: t.TempDir(),
		URL:     url,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ctx, ln); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err := srv.Close(); err != nil {
			t.Errorf("closing the server: %v", err)
		}
	})
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(srv.CAPEM()) {
		t.Fatal("the server's CA is not PEM")
	}
	if srv.Bootstrap == nil || srv.Bootstrap.AdminToken == "" {
		t.Fatal("a first start made no admin token")
	}
	return &live{t: t, srv: srv, url: url, admin: srv.Bootstrap.AdminToken, pool: pool}
}

// client is a generated client that trusts only the server's CA and sends
// the bearer token (when not empty) and the client certificate (when not
// nil). Its connections are closed before the server stops.
func (l *live) client(token string, cert *tls.Certificate) *ClientWithResponses {
	l.t.Helper()
	tc := &tls.Config{RootCAs: l.pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	l.t.Cleanup(tr.CloseIdleConnections) // runs before the server's cleanup
	opts := []ClientOption{WithHTTPClient(&http.Client{Transport: tr, Timeout: 30 * time.Second})}
	if token != "" {
		opts = append(opts, WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
	}
	c, err := NewClientWithResponses(l.url, opts...)
	if err != nil {
		l.t.Fatal(err)
	}
	return c
}

// answer is what every generated response has.
type answer interface {
	StatusCode() int
	GetBody() []byte
}

// ok checks that a call answered status with a JSON body that the
// generated client parsed (its JSON<status> field is set: the status is
// documented for the operation), and that the body is exactly a T:
// decoded refusing unknown fields and encoded again, it is the same JSON.
// A field the server sends that the description lacks, a required one it
// leaves out, or a type that differs fails the test.
func ok[T any](t *testing.T, what string, r answer, err error, status int) T {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if r.StatusCode() != status {
		t.Fatalf("%s: status %d, want %d: %s", what, r.StatusCode(), status, r.GetBody())
	}
	parsed(t, what, r, status)
	var v T
	exact(t, what, r.GetBody(), &v)
	return v
}

// refused checks that a call was refused with status, documented for the
// operation, and an error body whose message holds want.
func refused(t *testing.T, what string, r answer, err error, status int, want string) {
	t.Helper()
	e := ok[Error](t, what, r, err, status)
	if !strings.Contains(e.Error, want) {
		t.Errorf("%s: error %q, want it to say %q", what, e.Error, want)
	}
}

// parsed checks that the generated response's JSON<status> field is set.
func parsed(t *testing.T, what string, r answer, status int) {
	t.Helper()
	v := reflect.ValueOf(r)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	f := v.FieldByName(fmt.Sprintf("JSON%d", status))
	if !f.IsValid() {
		t.Fatalf("%s: the description documents no JSON answer %d for this operation (%s)", what, status, v.Type())
	}
	if f.IsNil() {
		t.Fatalf("%s: the generated client did not parse the %d answer: %s", what, status, r.GetBody())
	}
}

// exact decodes body into v, refusing unknown fields, and checks that v
// encodes to the same JSON value.
func exact(t *testing.T, what string, body []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: the answer is not a %T of the description: %v\n%s", what, v, err, body)
	}
	again, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var want, got any
	if err := json.Unmarshal(body, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(again, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("%s: the answer does not survive a %T of the description:\nserver: %s\nclient: %s", what, v, body, again)
	}
}

func ptr[T any](v T) *T { return &v }

// TestLiveUsers: a user's side of the API, through the generated client.
func TestLiveUsers(t *testing.T) {
	l := start(t)
	ctx := context.Background()
	admin := l.client(l.admin, nil)

	h, err := admin.GetHealthWithResponse(ctx)
	if err != nil || h.StatusCode() != http.StatusOK || string(h.Body) != "ok\n" {
		t.Fatalf("getHealth: %v %d %q", err, h.StatusCode(), h.Body)
	}
	if ct := h.HTTPResponse.Header.Get("Content-Type"); ct != "text/plain" {
		t.Errorf("getHealth: Content-Type %q, want text/plain", ct)
	}

	r1, err := admin.WhoAmIWithResponse(ctx)
	me := ok[WhoAmI](t, "whoAmI", r1, err, 200)
	if me.User == nil || *me.User != "admin" || me.Role == nil || *me.Role != Admin {
		t.Errorf("whoAmI: %s, want the admin", r1.Body)
	}

	r2, err := admin.ListNodesWithResponse(ctx)
	if nodes := ok[NodeList](t, "listNodes", r2, err, 200); len(nodes.Nodes) != 0 {
		t.Errorf("listNodes: %d nodes on a new server", len(nodes.Nodes))
	}

	// A project that may hold one GPU at once.
	r3, err := admin.PutProjectWithResponse(ctx, "vision", ProjectSpec{Name: "vision", Weight: ptr(2.0), MaxGpus: ptr(1.0)})
	p := ok[Project](t, "putProject", r3, err, 200)
	if p.Name != "vision" || p.Weight != 2 || p.MaxGpus == nil || *p.MaxGpus != 1 || p.PeriodS == nil || *p.PeriodS != 30*24*3600 {
		t.Errorf("putProject: %s", r3.Body)
	}
	r3, err = admin.PutProjectWithResponse(ctx, "vision", ProjectSpec{Name: "audio"})
	refused(t, "putProject with another name", r3, err, 400, `differs from the path's "vision"`)

	// A member of it.
	r4, err := admin.CreateTokenWithResponse(ctx, TokenRequest{User: ptr("alice"), Role: ptr(Member), Projects: &[]Name{"vision"}, Name: ptr("laptop")})
	tok := ok[Token](t, "createToken", r4, err, 201)
	if tok.User != "alice" || tok.Token == nil || !strings.HasPrefix(*tok.Token, "kiln_"+tok.ID+"_") {
		t.Fatalf("createToken: %s", r4.Body)
	}
	alice := l.client(*tok.Token, nil)
	r1, err = alice.WhoAmIWithResponse(ctx)
	me = ok[WhoAmI](t, "whoAmI (member)", r1, err, 200)
	if me.User == nil || *me.User != "alice" || me.Role == nil || *me.Role != Member || me.Projects == nil || !reflect.DeepEqual(*me.Projects, []string{"vision"}) {
		t.Errorf("whoAmI (member): %s", r1.Body)
	}
	r5, err := alice.ListProjectsWithResponse(ctx)
	if ps := ok[ProjectList](t, "listProjects (member)", r5, err, 200); len(ps.Projects) != 1 || ps.Projects[0].Name != "vision" || ps.Projects[0].Members == nil || !reflect.DeepEqual(*ps.Projects[0].Members, []string{"alice"}) {
		t.Errorf("listProjects (member): %s, want vision with alice", r5.Body)
	}
	r6, err := alice.ListTokensWithResponse(ctx)
	if ts := ok[TokenList](t, "listTokens (member)", r6, err, 200); len(ts.Tokens) != 1 || ts.Tokens[0].ID != tok.ID || ts.Tokens[0].Token != nil {
		t.Errorf("listTokens (member): %s, want her token without its secret", r6.Body)
	}
	r3, err = alice.PutProjectWithResponse(ctx, "vision", ProjectSpec{Name: "vision"})
	refused(t, "putProject (member)", r3, err, 403, "only an admin may do this")

	// A lease that cannot be placed: no node has joined, so it waits.
	r7, err := alice.CreateLeaseWithResponse(ctx, LeaseRequest{Gpus: ptr(1), Name: ptr("train")})
	queued := ok[Lease](t, "createLease", r7, err, 201)
	if queued.State != LeaseStateQueued || queued.Project != "vision" || queued.User != "alice" || queued.Reason == nil || !strings.HasPrefix(*queued.Reason, "waiting: ") || queued.GpusEquivalent != 1 {
		t.Errorf("createLease: %s, want it queued in vision, waiting", r7.Body)
	}
	// One the project's quota never lets it hold: refused, with the reason.
	r7, err = alice.CreateLeaseWithResponse(ctx, LeaseRequest{Gpus: ptr(2)})
	never := ok[Lease](t, "createLease over the quota", r7, err, 201)
	if never.State != LeaseStateRefused || never.Reason == nil || *never.Reason != "asks for 2 GPUs; project vision may hold at most 1 at once" {
		t.Errorf("createLease over the quota: %s, want it refused for the quota", r7.Body)
	}
	r7, err = alice.CreateLeaseWithResponse(ctx, LeaseRequest{Gpus: ptr(1), Fraction: ptr(0.5)})
	refused(t, "createLease with gpus and fraction", r7, err, 400, "ask for exactly one of")
	r7, err = alice.CreateLeaseWithResponse(ctx, LeaseRequest{Gpus: ptr(1), Project: ptr("default")})
	refused(t, "createLease in another project", r7, err, 403, "not a member of project default")
	r7, err = alice.CreateLeaseWithBodyWithResponse(ctx, "application/json", strings.NewReader(`{"gpus": 1, "colour": "red"}`))
	refused(t, "createLease with an unknown field", r7, err, 400, `unknown field "colour"`)

	// A job in the queued lease waits for it.
	r8, err := alice.AddJobWithResponse(ctx, queued.ID, JobSpec{Command: &[]string{"nvidia-smi", "-L"}, Env: &map[string]string{"HELLO": "1"}})
	job := ok[Job](t, "addJob", r8, err, 201)
	if job.State != JobStatePending || job.LeaseID != queued.ID || job.Project != "vision" {
		t.Errorf("addJob: %s, want a pending job of the lease", r8.Body)
	}
	r9, err := alice.GetJobWithResponse(ctx, job.ID)
	if j := ok[Job](t, "getJob", r9, err, 200); j.ID != job.ID || j.Spec.Command == nil || (*j.Spec.Command)[0] != "nvidia-smi" {
		t.Errorf("getJob: %s", r9.Body)
	}
	r10, err := alice.GetJobLogsWithResponse(ctx, job.ID, nil)
	if err != nil || r10.StatusCode() != 200 || len(r10.Body) != 0 {
		t.Errorf("getJobLogs: %v %d %q, want no output yet", err, r10.StatusCode(), r10.Body)
	}
	r9, err = alice.GetJobWithResponse(ctx, "j-nonesuch")
	refused(t, "getJob unknown", r9, err, 404, "job j-nonesuch not found")

	r11, err := alice.GetLeaseWithResponse(ctx, queued.ID, nil)
	got := ok[Lease](t, "getLease", r11, err, 200)
	if got.ID != queued.ID || got.State != LeaseStateQueued || got.QueuePosition == nil || *got.QueuePosition != 1 || got.Jobs == nil || len(*got.Jobs) != 1 {
		t.Errorf("getLease: %s, want it first in the queue with its job", r11.Body)
	}
	version := r11.HTTPResponse.Header.Get("X-Kiln-Lease-Version")
	if version != "queued/1" {
		t.Errorf("getLease: X-Kiln-Lease-Version %q, want queued/1", version)
	}
	// A long poll with nothing changing waits wait_s, then answers.
	t0 := time.Now()
	r11, err = alice.GetLeaseWithResponse(ctx, queued.ID, &GetLeaseParams{Since: &version, WaitS: ptr(0.3)})
	if ok[Lease](t, "getLease (long poll)", r11, err, 200).State != LeaseStateQueued || time.Since(t0) < 250*time.Millisecond {
		t.Errorf("getLease (long poll): answered after %s: %s", time.Since(t0), r11.Body)
	}
	r11, err = alice.GetLeaseWithResponse(ctx, queued.ID, &GetLeaseParams{WaitS: ptr(301.0)})
	refused(t, "getLease with a long wait", r11, err, 400, "wait_s=301")
	r11, err = alice.GetLeaseWithResponse(ctx, "l-nonesuch", nil)
	refused(t, "getLease unknown", r11, err, 404, "lease l-nonesuch not found")

	r12, err := alice.ListLeasesWithResponse(ctx, nil)
	if ls := ok[LeaseList](t, "listLeases", r12, err, 200); len(ls.Leases) != 1 || ls.Leases[0].ID != queued.ID {
		t.Errorf("listLeases: %s, want the queued lease only", r12.Body)
	}
	r12, err = alice.ListLeasesWithResponse(ctx, &ListLeasesParams{All: ptr(true)})
	if ls := ok[LeaseList](t, "listLeases all", r12, err, 200); len(ls.Leases) != 2 || ls.Leases[0].ID != queued.ID || ls.Leases[1].ID != never.ID {
		t.Errorf("listLeases all: %s, want the queued and the refused lease", r12.Body)
	}
	r12, err = alice.ListLeasesWithResponse(ctx, &ListLeasesParams{State: ptr(LeaseStateRefused)})
	if ls := ok[LeaseList](t, "listLeases refused", r12, err, 200); len(ls.Leases) != 1 || ls.Leases[0].ID != never.ID {
		t.Errorf("listLeases refused: %s, want the refused lease", r12.Body)
	}

	r13, err := alice.CancelLeaseWithResponse(ctx, queued.ID)
	if c := ok[Lease](t, "cancelLease", r13, err, 200); c.ID != queued.ID || c.State != LeaseStateCancelled || c.EndedAt == nil {
		t.Errorf("cancelLease: %s, want it cancelled", r13.Body)
	}
	r11, err = alice.GetLeaseWithResponse(ctx, queued.ID, nil)
	if ok[Lease](t, "getLease after cancelLease", r11, err, 200).State != LeaseStateCancelled {
		t.Errorf("getLease after cancelLease: %s", r11.Body)
	}
	r9, err = alice.GetJobWithResponse(ctx, job.ID)
	if j := ok[Job](t, "getJob after cancelLease", r9, err, 200); j.State != JobStateStopped || j.Reason == nil {
		t.Errorf("getJob after cancelLease: %s, want it stopped with a reason", r9.Body)
	}
	r8, err = alice.AddJobWithResponse(ctx, queued.ID, JobSpec{Command: &[]string{"true"}})
	refused(t, "addJob to an ended lease", r8, err, 409, "jobs run only in a queued or granted lease")

	// The admin's side: users, events, tokens.
	r14, err := admin.ListUsersWithResponse(ctx)
	if us := ok[UserList](t, "listUsers", r14, err, 200); len(us.Users) != 2 || us.Users[0].Name != "admin" || us.Users[1].Name != "alice" || us.Users[1].Role != Member {
		t.Errorf("listUsers: %s, want admin and alice", r14.Body)
	}
	r14, err = alice.ListUsersWithResponse(ctx)
	refused(t, "listUsers (member)", r14, err, 403, "only an admin may do this")
	r15, err := admin.ListEventsWithResponse(ctx, &ListEventsParams{Limit: ptr(100)})
	evs := ok[EventList](t, "listEvents", r15, err, 200)
	kinds := map[string]bool{}
	for _, e := range evs.Events {
		kinds[e.Kind] = true
	}
	for _, k := range []string{"server.created", "project.put", "token.created"} {
		if !kinds[k] {
			t.Errorf("listEvents: no %s event in %s", k, r15.Body)
		}
	}
	r15, err = admin.ListEventsWithResponse(ctx, &ListEventsParams{Limit: ptr(10001)})
	refused(t, "listEvents over the limit", r15, err, 400, "limit=10001")

	r4, err = alice.CreateTokenWithResponse(ctx, TokenRequest{Name: ptr("ci"), TTLS: ptr(3600)})
	second := ok[Token](t, "createToken (member)", r4, err, 201)
	if second.User != "alice" || second.ExpiresAt == nil {
		t.Errorf("createToken (member): %s, want her token with an expiry", r4.Body)
	}
	r4, err = alice.CreateTokenWithResponse(ctx, TokenRequest{User: ptr("bob")})
	refused(t, "createToken (member) for another", r4, err, 403, "only make tokens for themself")
	r16, err := alice.DeleteTokenWithResponse(ctx, second.ID)
	if d := ok[struct {
		Deleted string `json:"deleted"`
	}](t, "deleteToken", r16, err, 200); d.Deleted != second.ID {
		t.Errorf("deleteToken: %s", r16.Body)
	}
	r16, err = alice.DeleteTokenWithResponse(ctx, second.ID)
	refused(t, "deleteToken again", r16, err, 404, "not found")

	r17, err := admin.DeleteUserWithResponse(ctx, "admin")
	refused(t, "deleteUser the last admin", r17, err, 409, "the last admin")
	r17, err = admin.DeleteUserWithResponse(ctx, "alice")
	if d := ok[struct {
		Deleted string `json:"deleted"`
	}](t, "deleteUser", r17, err, 200); d.Deleted != "alice" {
		t.Errorf("deleteUser: %s", r17.Body)
	}
	// Her token went with her.
	r1, err = alice.WhoAmIWithResponse(ctx)
	refused(t, "whoAmI (deleted user)", r1, err, 401, "bearer token or agent certificate")
	r2, err = l.client("", nil).ListNodesWithResponse(ctx)
	refused(t, "listNodes without a token", r2, err, 401, "bearer token or agent certificate")
}

// TestLiveAgent: an agent joins with a CSR and calls its endpoints with
// the client certificate the server's CA signed (the mutualTLS scheme);
// the lease that waited for a node is granted once it registers.
func TestLiveAgent(t *testing.T) {
	l := start(t)
	ctx := context.Background()
	admin := l.client(l.admin, nil)

	// A lease that waits: no node has joined yet.
	r1, err := admin.CreateLeaseWithResponse(ctx, LeaseRequest{Project: ptr("default"), Gpus: ptr(2)})
	ls := ok[Lease](t, "createLease", r1, err, 201)
	if ls.State != LeaseStateQueued {
		t.Fatalf("createLease: %s, want it queued", r1.Body)
	}

	r2, err := admin.CreateJoinTokenWithResponse(ctx, JoinTokenRequest{TTLS: ptr(600)})
	jt := ok[JoinToken](t, "createJoinToken", r2, err, 201)
	if jt.Token == nil || !strings.HasPrefix(*jt.Token, "kjoin_"+jt.ID+"_") || jt.Command == nil || jt.Uses != 1 || jt.Used != 0 {
		t.Fatalf("createJoinToken: %s", r2.Body)
	}
	r2, err = admin.CreateJoinTokenWithBodyWithResponse(ctx, "application/json", nil)
	other := ok[JoinToken](t, "createJoinToken without a body", r2, err, 201)
	r2, err = admin.CreateJoinTokenWithResponse(ctx, JoinTokenRequest{Uses: ptr(100001)})
	refused(t, "createJoinToken with too many uses", r2, err, 400, "uses 100001")
	r3, err := admin.ListJoinTokensWithResponse(ctx)
	seen := 0
	for _, j := range ok[JoinTokenList](t, "listJoinTokens", r3, err, 200).JoinTokens {
		if j.Token != nil || j.Command != nil {
			t.Errorf("listJoinTokens shows a secret: %s", r3.Body)
		}
		if j.ID == jt.ID || j.ID == other.ID {
			seen++
		}
	}
	if seen != 2 {
		t.Errorf("listJoinTokens: %s, want both new join tokens", r3.Body)
	}
	r4, err := admin.RevokeJoinTokenWithResponse(ctx, other.ID)
	if rv := ok[struct {
		Revoked string `json:"revoked"`
	}](t, "revokeJoinToken", r4, err, 200); rv.Revoked != other.ID {
		t.Errorf("revokeJoinToken: %s", r4.Body)
	}
	r4, err = admin.RevokeJoinTokenWithResponse(ctx, other.ID)
	refused(t, "revokeJoinToken again", r4, err, 404, "not found")

	// The agent joins: its key, a CSR, its certificate.
	const node = "hgx1"
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: node}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	anon := l.client("", nil)
	r5, err := anon.JoinNodeWithResponse(ctx, JoinRequest{Token: *other.Token, Node: node, CsrPem: csr})
	refused(t, "joinNode with a revoked token", r5, err, 401, "revoked")
	r5, err = anon.JoinNodeWithResponse(ctx, JoinRequest{Token: *jt.Token, Node: node, CsrPem: csr})
	joined := ok[JoinResponse](t, "joinNode", r5, err, 200)
	if joined.Node != node || joined.CaPem != string(l.srv.CAPEM()) {
		t.Fatalf("joinNode: %s", r5.Body)
	}
	r5, err = anon.JoinNodeWithResponse(ctx, JoinRequest{Token: *jt.Token, Node: "hgx2", CsrPem: csr})
	refused(t, "joinNode with a used token", r5, err, 401, "used up")
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair([]byte(joined.CertPem), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatalf("the joined certificate: %v", err)
	}
	agent := l.client("", &cert)

	r6, err := agent.WhoAmIWithResponse(ctx)
	if me := ok[WhoAmI](t, "whoAmI (agent)", r6, err, 200); me.Node == nil || *me.Node != node || me.User != nil {
		t.Errorf("whoAmI (agent): %s, want node %s", r6.Body, node)
	}
	r7, err := agent.SendHeartbeatWithResponse(ctx, node, Heartbeat{Running: &[]string{}})
	if hb := ok[HeartbeatReply](t, "sendHeartbeat before registering", r7, err, 200); hb.Register == nil || !*hb.Register {
		t.Errorf("sendHeartbeat before registering: %s, want register", r7.Body)
	}
	r7, err = agent.SendHeartbeatWithResponse(ctx, "hgx2", Heartbeat{})
	refused(t, "sendHeartbeat for another node", r7, err, 403, "may not act for node hgx2")
	r7, err = admin.SendHeartbeatWithResponse(ctx, node, Heartbeat{})
	refused(t, "sendHeartbeat with a token", r7, err, 403, "only an agent")
	r8, err := agent.ListNodesWithResponse(ctx)
	refused(t, "listNodes (agent)", r8, err, 403, "agents may not call user endpoints")

	// It registers the recorded machine.
	snap, err := discover.Replay(ctx, hgxFixture)
	if err != nil {
		t.Fatal(err)
	}
	kb.Default().Annotate(snap)
	b, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	var snapshot map[string]any
	if err := json.Unmarshal(b, &snapshot); err != nil {
		t.Fatal(err)
	}
	r9, err := agent.RegisterNodeWithResponse(ctx, node, RegisterRequest{Snapshot: snapshot, Recorded: ptr(true), Executor: ptr("process"), Running: &[]string{}})
	nd := ok[Node](t, "registerNode", r9, err, 200)
	if nd.ID != node || nd.State != NodeStateReady || nd.TotalGpus != 8 || len(nd.Devices) < 8 || nd.Recorded == nil || !*nd.Recorded {
		t.Fatalf("registerNode: %s, want 8 GPUs ready", r9.Body)
	}

	// The waiting lease is granted: a long poll sees it change.
	version := "queued/1"
	var granted Lease
	for deadline := time.Now().Add(20 * time.Second); ; {
		r, err := admin.GetLeaseWithResponse(ctx, ls.ID, &GetLeaseParams{Since: &version, WaitS: ptr(2.0)})
		granted = ok[Lease](t, "getLease (long poll)", r, err, 200)
		version = r.HTTPResponse.Header.Get("X-Kiln-Lease-Version")
		if granted.State != LeaseStateQueued || time.Now().After(deadline) {
			break
		}
	}
	if granted.State != LeaseStateGranted || granted.Allocations == nil || len(*granted.Allocations) != 1 || version != "granted/0" {
		t.Fatalf("getLease: %s (version %s), want it granted", mustJSON(granted), version)
	}
	alloc := (*granted.Allocations)[0]
	if alloc.Node != node || len(alloc.Devices) != 2 || alloc.Devices[0].Isolation != Exclusive || alloc.Devices[0].MilliGpu != 1000 {
		t.Errorf("getLease: allocation %s, want 2 whole GPUs of %s", mustJSON(alloc), node)
	}

	r7, err = agent.SendHeartbeatWithResponse(ctx, node, Heartbeat{Running: &[]string{}})
	if hb := ok[HeartbeatReply](t, "sendHeartbeat", r7, err, 200); hb.Register != nil || hb.Start != nil {
		t.Errorf("sendHeartbeat: %s, want nothing to do (the lease has no job)", r7.Body)
	}
	r10, err := agent.ReportJobExitWithResponse(ctx, node, "j-nonesuch", ExitReport{Code: ptr(0), Reason: ptr("exited")})
	if st := ok[struct {
		Status string `json:"status"`
	}](t, "reportJobExit", r10, err, 200); st.Status != "ignored" {
		t.Errorf("reportJobExit of a job the node does not run: %s, want ignored", r10.Body)
	}
	r11, err := agent.AppendJobLogWithBodyWithResponse(ctx, node, "j-nonesuch", "application/octet-stream", strings.NewReader("hello\n"))
	refused(t, "appendJobLog of a job the node does not run", r11, err, 404, "has no task on node hgx1")

	dev := alloc.Devices[0].ID
	r12, err := admin.GetNodeWithResponse(ctx, node)
	nd = ok[Node](t, "getNode", r12, err, 200)
	if nd.FreeGpus != 6 || !holds(nd, dev, ls.ID) {
		t.Errorf("getNode: free %g, want 6 and %s held by %s: %s", nd.FreeGpus, dev, ls.ID, r12.Body)
	}
	r13, err := admin.DrainNodeWithResponse(ctx, node, DrainRequest{Devices: &[]string{dev}, Reason: ptr("fan")})
	nd = ok[Node](t, "drainNode", r13, err, 200)
	for _, d := range nd.Devices {
		if d.ID == dev && (d.Drained == nil || !*d.Drained || d.DrainReason == nil || *d.DrainReason != "fan") {
			t.Errorf("drainNode: %s, want %s drained for the fan", mustJSON(d), dev)
		}
	}
	r13, err = admin.DrainNodeWithResponse(ctx, "nonesuch", DrainRequest{})
	refused(t, "drainNode unknown", r13, err, 404, "node nonesuch not found")

	r14, err := admin.CancelLeaseWithResponse(ctx, ls.ID)
	if c := ok[Lease](t, "cancelLease", r14, err, 200); c.State != LeaseStateDone {
		t.Errorf("cancelLease: %s, want a granted lease without jobs done at once", r14.Body)
	}

	r15, err := admin.ForgetNodeWithResponse(ctx, node)
	refused(t, "forgetNode (ready)", r15, err, 409, "is ready")
	r16, err := admin.ReplaceNodeWithResponse(ctx, node)
	if n := ok[Node](t, "replaceNode", r16, err, 200); n.State != NodeStateLost {
		t.Errorf("replaceNode: %s, want the node lost", r16.Body)
	}
	r6, err = agent.WhoAmIWithResponse(ctx)
	refused(t, "whoAmI (replaced agent)", r6, err, 401, "bearer token or agent certificate")
	r15, err = admin.ForgetNodeWithResponse(ctx, node)
	if f := ok[struct {
		Forgotten string `json:"forgotten"`
	}](t, "forgetNode", r15, err, 200); f.Forgotten != node {
		t.Errorf("forgetNode: %s", r15.Body)
	}
	r12, err = admin.GetNodeWithResponse(ctx, node)
	refused(t, "getNode (forgotten)", r12, err, 404, "not found")
}

// holds reports whether the node's device is held by the lease.
func holds(n Node, dev, lease string) bool {
	for _, d := range n.Devices {
		if d.ID == dev && d.Leases != nil {
			for _, l := range *d.Leases {
				if l == lease {
					return true
				}
			}
		}
	}
	return false
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
