package main

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"

	"kiln.dev/kiln/api"
)

// pathRecorder is a TLS server on loopback with the API's routes (read
// from api/openapi.yaml, which a server test keeps equal to the server's
// routes); it records which route each request reached and with what path
// values, and answers plausible records.
type pathRecorder struct {
	mu   sync.Mutex
	got  []recorded
	conn []string // the connection flags for kiln
}

type recorded struct {
	Method, Pattern string
	Values          map[string]string
	Query           url.Values
}

var pathParam = regexp.MustCompile(`\{([a-z]+)\}`)

func newPathRecorder(t *testing.T) *pathRecorder {
	t.Helper()
	js, err := yaml.YAMLToJSON(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	pr := &pathRecorder{}
	mux := http.NewServeMux()
	for p, ops := range doc.Paths {
		names := pathParam.FindAllStringSubmatch(p, -1)
		for m := range ops {
			method := strings.ToUpper(m)
			if !slices.Contains([]string{"GET", "PUT", "POST", "DELETE"}, method) {
				continue
			}
			pattern := method + " " + p
			mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
				rec := recorded{Method: r.Method, Pattern: pattern, Values: map[string]string{}, Query: r.URL.Query()}
				for _, n := range names {
					rec.Values[n[1]] = r.PathValue(n[1])
				}
				pr.mu.Lock()
				pr.got = append(pr.got, rec)
				pr.mu.Unlock()
				pr.answer(w, pattern, rec)
			})
		}
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		pr.mu.Lock()
		pr.got = append(pr.got, recorded{Method: r.Method, Pattern: "no route: " + r.URL.EscapedPath()})
		pr.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":"no such endpoint"}` + "\n"))
	})
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	pr.conn = []string{"--config", filepath.Join(t.TempDir(), "none.json"), "--server", srv.URL, "--ca", ca, "--token", "kiln_x_y"}
	return pr
}

func (pr *pathRecorder) answer(w http.ResponseWriter, pattern string, rec recorded) {
	var v any = map[string]string{}
	id := rec.Values["id"]
	switch pattern {
	case "GET /v1/leases/{id}", "DELETE /v1/leases/{id}":
		v = api.Lease{ID: id, State: api.LeaseCancelled, Jobs: []string{"j-1"}}
	case "POST /v1/leases/{id}/jobs":
		v = api.Job{ID: "j-1", LeaseID: id, State: api.JobPending}
	case "GET /v1/jobs/{id}":
		zero := 0
		v = api.Job{ID: id, State: api.JobExited, ExitCode: &zero}
	case "GET /v1/jobs/{id}/logs":
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("output\n"))
		return
	case "GET /v1/nodes/{id}", "POST /v1/nodes/{id}/drain":
		v = api.Node{ID: id, State: api.NodeReady}
	case "PUT /v1/projects/{name}":
		v = api.Project{Name: rec.Values["name"]}
	case "GET /v1/leases":
		v = api.LeaseList{Leases: []api.Lease{}}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func (pr *pathRecorder) take() []recorded {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	got := pr.got
	pr.got = nil
	return got
}

// TestCLISendsIDsAsOneSegment: an id typed on the command line reaches the
// route the command means, as one path segment the server reads back
// unchanged, whatever it holds ("/", "?", "#", "..", "."): it never reaches
// another endpoint nor adds a query.
func TestCLISendsIDsAsOneSegment(t *testing.T) {
	pr := newPathRecorder(t)
	for _, id := range []string{"../admin", "x?y=1", "..", ".", "a/b#c", "%2e%2e", "a b"} {
		for _, c := range []struct {
			args    []string
			pattern string
			param   string
			query   url.Values
		}{
			{[]string{"cancel", id}, "DELETE /v1/leases/{id}", "id", nil},
			{[]string{"nodes", id}, "GET /v1/nodes/{id}", "id", nil},
			{[]string{"drain", id, "gpu0"}, "POST /v1/nodes/{id}/drain", "id", nil},
			{[]string{"token", "rm", id}, "DELETE /v1/tokens/{id}", "id", nil},
			{[]string{"token", "rm", "--user", id}, "DELETE /v1/users/{name}", "name", nil},
			{[]string{"token", "revoke", id}, "DELETE /v1/join-tokens/{id}", "id", nil},
			{[]string{"token", "project", id}, "PUT /v1/projects/{name}", "name", nil},
			{[]string{"logs", id}, "GET /v1/jobs/{id}/logs", "id", nil},
			{[]string{"logs", "-f", id}, "GET /v1/jobs/{id}/logs", "id", url.Values{"follow": {"1"}}},
			{[]string{"logs", "l-" + id}, "GET /v1/leases/{id}", "id", nil},
			{[]string{"run", "--lease", id, "--", "true"}, "POST /v1/leases/{id}/jobs", "id", nil},
			{[]string{"ls", "--project", id, "--state", id}, "GET /v1/leases", "", url.Values{"project": {id}, "state": {id}}},
		} {
			args := append(append([]string{c.args[0]}, pr.conn...), c.args[1:]...)
			if i := slices.Index(c.args, "--"); i > 0 {
				// the connection flags go before --
				args = append(append(append([]string{c.args[0]}, pr.conn...), c.args[1:i]...), c.args[i:]...)
			}
			_, stderr, code := kiln(t, args...)
			got := pr.take()
			if len(got) == 0 {
				t.Errorf("%q: nothing reached the server (exit %d: %s)", c.args, code, stderr)
				continue
			}
			first := got[0]
			want := id
			if c.args[0] == "logs" && !slices.Contains(c.args, "-f") && strings.HasPrefix(c.args[1], "l-") {
				want = "l-" + id
			}
			if first.Pattern != c.pattern || (c.param != "" && first.Values[c.param] != want) {
				t.Errorf("%q: reached %s %v, want %s with %s=%q", c.args, first.Pattern, first.Values, c.pattern, c.param, want)
				continue
			}
			if q := first.Query; len(q) != len(c.query) || c.query != nil && q.Encode() != c.query.Encode() {
				t.Errorf("%q: query %v, want %v", c.args, q, c.query)
			}
			if code != 0 {
				t.Errorf("%q: exit %d: %s", c.args, code, stderr)
			}
		}
	}
}

// TestCLIRefusesEmptyIDs: an empty id would name another route (a list,
// or none): nothing is sent, and kiln says why.
func TestCLIRefusesEmptyIDs(t *testing.T) {
	pr := newPathRecorder(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"cancel", ""}, "the lease id is empty"},
		{[]string{"nodes", ""}, "the node name is empty"},
		{[]string{"drain", ""}, "the node name is empty"},
		{[]string{"logs", ""}, "the job id is empty"},
		{[]string{"token", "rm", ""}, "the token id is empty"},
		{[]string{"token", "revoke", ""}, "the join token id is empty"},
	} {
		args := append(append([]string{c.args[0]}, pr.conn...), c.args[1:]...)
		_, stderr, code := kiln(t, args...)
		if got := pr.take(); len(got) != 0 {
			t.Errorf("%q: sent %+v", c.args, got)
		}
		if code != 3 || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, %q; want 3 and %q", c.args, code, stderr, c.want)
		}
	}
}
