package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// TestProjectLimits: queued leases per member and per project, jobs per
// lease and the size of a job's environment are limited per project, and
// each refusal says which limit, its value and how an admin raises it.
func TestProjectLimits(t *testing.T) {
	// No node: every lease stays queued.
	c := newCluster(t, server.Config{})
	ctx := context.Background()
	lim := api.Limits{MaxQueued: 3, MaxQueuedPerUser: 2, MaxJobsPerLease: 2, MaxEnvBytes: 1000}
	if err := c.admin.Do(ctx, "PUT", "/v1/projects/vision", api.Project{Name: "vision", Weight: 1, Limits: lim}, nil); err != nil {
		t.Fatal(err)
	}
	ana, bo := c.user("ana", "vision"), c.user("bo", "vision")
	refused := func(what string, err error, status int, want ...string) {
		t.Helper()
		if api.StatusOf(err) != status {
			t.Errorf("%s: %v, want %d", what, err, status)
			return
		}
		for _, w := range append(want, "kiln token project vision") {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", what, err, w)
			}
		}
	}
	lease := func(cl *api.Client, job *api.JobSpec) (api.Lease, error) {
		var l api.Lease
		err := cl.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "vision", GPUs: 1, Job: job}, &l)
		return l, err
	}
	first, err := lease(ana, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease(ana, nil); err != nil {
		t.Fatal(err)
	}
	_, err = lease(ana, nil)
	refused("ana's third queued lease", err, http.StatusTooManyRequests, "max_queued_per_user 2")
	if _, err := lease(bo, nil); err != nil {
		t.Fatalf("bo's first lease: %v", err)
	}
	_, err = lease(bo, nil)
	refused("the project's fourth queued lease", err, http.StatusTooManyRequests, "max_queued 3")

	// Jobs per lease, environment size.
	job := api.JobSpec{Command: []string{"true"}}
	for i := 0; i < 2; i++ {
		if err := ana.Do(ctx, "POST", "/v1/leases/"+first.ID+"/jobs", job, nil); err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	refused("a third job in the lease", ana.Do(ctx, "POST", "/v1/leases/"+first.ID+"/jobs", job, nil), http.StatusForbidden, "max_jobs_per_lease 2")
	big := api.JobSpec{Command: []string{"true"}, Env: map[string]string{"BIG": strings.Repeat("x", 2000)}}
	if err := ana.Do(ctx, "DELETE", "/v1/leases/"+first.ID, nil, nil); err != nil {
		t.Fatal(err)
	}
	_, err = lease(ana, &big)
	refused("a 2 kB environment", err, http.StatusForbidden, "max_env_bytes 1000")

	// An admin raises a limit; a limit out of range is refused.
	lim.MaxQueuedPerUser = 10
	if err := c.admin.Do(ctx, "PUT", "/v1/projects/vision", api.Project{Name: "vision", Weight: 1, Limits: lim}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := lease(ana, nil); err != nil {
		t.Errorf("after the admin raised the limit: %v", err)
	}
	bad := api.Project{Name: "vision", Weight: 1, Limits: api.Limits{MaxQueued: -1}}
	if err := c.admin.Do(ctx, "PUT", "/v1/projects/vision", bad, nil); api.StatusOf(err) != http.StatusBadRequest {
		t.Errorf("a negative limit: %v, want 400", err)
	}
}

// TestLogLimits: a job's output is kept up to the job's log limit and the
// project's, then cut with a line that says so; before, one job could fill
// the server's disk.
func TestLogLimits(t *testing.T) {
	t.Parallel() // a cluster of its own; it mostly waits
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second})
	c.addAgent("hgx", machines(t)["hgx"], nil, 200*time.Millisecond)
	c.waitNodes(1)
	ctx := context.Background()
	lim := api.Limits{MaxLogBytesPerJob: 100 << 10, MaxLogBytes: 150 << 10}
	if err := c.admin.Do(ctx, "PUT", "/v1/projects/vision", api.Project{Name: "vision", Weight: 1, Limits: lim}, nil); err != nil {
		t.Fatal(err)
	}
	ana := c.user("ana", "vision")
	run := func() string {
		t.Helper()
		var l api.Lease
		// 1 MB of output.
		job := &api.JobSpec{Command: []string{"sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' 'x'; echo; echo the end"}}
		if err := ana.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "vision", GPUs: 1, Job: job}, &l); err != nil {
			t.Fatal(err)
		}
		waitLease(t, ana, l.ID, 30*time.Second, final)
		resp, err := ana.Raw(ctx, "GET", "/v1/jobs/"+l.Jobs[0]+"/logs", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	out := run()
	if len(out) > 100<<10+200 || !strings.Contains(out, "kiln: output cut here: the job's limit of 102400 bytes") {
		t.Errorf("first job: %d bytes kept, tail %q; want 100 KiB and the cut line", len(out), out[max(len(out)-120, 0):])
	}
	out = run()
	if len(out) > 50<<10+200 || !strings.Contains(out, "project vision's limit of 153600 bytes") {
		t.Errorf("second job: %d bytes kept, tail %q; want what is left of the project's 150 KiB and the cut line", len(out), out[max(len(out)-120, 0):])
	}
}

// do runs one request through the server's handler, in process.
func do(srv *server.Server, token, method, path string, in any) (int, string) {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req := httptest.NewRequest(method, path, body)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestFullDiskResumes: when the disk fills, changes are refused with 503
// (and /healthz says so); when space returns the server takes changes
// again by itself, and what it answered matches what it stored. It used to
// refuse everything until restarted.
func TestFullDiskResumes(t *testing.T) {
	t.Parallel() // a cluster of its own; it mostly waits
	dir := filepath.Join(t.TempDir(), "small")
	os.Mkdir(dir, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("no small file system for the test (mount tmpfs needs root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	data := filepath.Join(dir, "data")
	srv, err := openServer(t, data)
	if err != nil {
		t.Fatal(err)
	}
	tok := srv.Bootstrap.AdminToken
	// Fill the disk.
	filler := filepath.Join(dir, "filler")
	f, _ := os.Create(filler)
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	env := map[string]string{"PAD": strings.Repeat("p", 200<<10)}
	var full string
	for i := 0; i < 50 && full == ""; i++ {
		code, body := do(srv, tok, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, Job: &api.JobSpec{Command: []string{"true"}, Env: env}})
		switch code {
		case http.StatusCreated:
		case http.StatusServiceUnavailable:
			full = body
		default:
			t.Fatalf("lease on a full disk: %d %s, want 201 or 503", code, body)
		}
	}
	if full == "" {
		t.Fatal("50 leases of 200 kB fit on a full 4 MB disk")
	}
	if !strings.Contains(full, "disk full") {
		t.Errorf("503 does not say why: %s", full)
	}
	if code, _ := do(srv, tok, "GET", "/healthz", nil); code != http.StatusServiceUnavailable {
		t.Errorf("/healthz on a full disk: %d, want 503", code)
	}
	if code, body := do(srv, tok, "PUT", "/v1/projects/p1", api.Project{Name: "p1", Weight: 1}); code != http.StatusServiceUnavailable {
		t.Errorf("a project on a full disk: %d %s, want 503", code, body)
	}

	// Space returns: the server takes changes again by itself.
	os.Remove(filler)
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := do(srv, tok, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1})
		if code == http.StatusCreated {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("after space returned: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := do(srv, tok, "GET", "/healthz", nil); code != http.StatusOK {
		t.Errorf("/healthz after space returned: %d, want 200", code)
	}
	_, before := do(srv, tok, "GET", "/v1/leases", nil)
	srv.Close()
	srv, err = openServer(t, data)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, after := do(srv, tok, "GET", "/v1/leases", nil)
	var b, a api.LeaseList
	json.Unmarshal([]byte(before), &b)
	json.Unmarshal([]byte(after), &a)
	ids := func(l api.LeaseList) string {
		var out []string
		for _, x := range l.Leases {
			out = append(out, x.ID+" "+x.State)
		}
		return strings.Join(out, ",")
	}
	if ids(a) != ids(b) || len(a.Leases) == 0 {
		t.Errorf("leases before the restart:\n%s\nafter:\n%s", ids(b), ids(a))
	}
}
