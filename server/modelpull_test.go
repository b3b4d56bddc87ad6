package server_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/server"
)

// recordingExec starts nothing: it keeps the jobs it is given, each of
// which ends at once with code 0.
type recordingExec struct {
	name string
	mu   sync.Mutex
	jobs []executor.Job
}

func (r *recordingExec) Name() string { return r.name }

func (r *recordingExec) Start(_ context.Context, j executor.Job) (executor.Handle, error) {
	r.mu.Lock()
	r.jobs = append(r.jobs, j)
	r.mu.Unlock()
	return endedHandle{}, nil
}

func (r *recordingExec) job(id string) *executor.Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.jobs {
		if r.jobs[i].ID == id {
			return &r.jobs[i]
		}
	}
	return nil
}

type endedHandle struct{}

func (endedHandle) Logs() io.ReadCloser { return io.NopCloser(strings.NewReader("")) }
func (endedHandle) Wait(context.Context) (executor.Exit, error) {
	return executor.Exit{Code: 0, Reason: "exited"}, nil
}
func (endedHandle) Stop(context.Context, time.Duration) error { return nil }

// fakePuller "pulls" every model to dir, or fails with err.
type fakePuller struct {
	dir      string
	err      error
	mu       sync.Mutex
	got      []string
	released []string
}

func (f *fakePuller) Release(digest string) {
	f.mu.Lock()
	f.released = append(f.released, digest)
	f.mu.Unlock()
}

func (f *fakePuller) PullPinned(_ context.Context, ref, digest string, progress func(done, total int64)) (string, string, error) {
	f.mu.Lock()
	f.got = append(f.got, ref+" "+digest)
	f.mu.Unlock()
	progress(1<<20, 2<<20)
	if f.err != nil {
		return "", "", f.err
	}
	return f.dir, f.dir + "/weights.gguf", nil
}

// A job that names a model of the lab's registry starts once the agent
// has pulled it: a process gets the cache's folder and weights file in
// place of {model} and {model_file}, in its command and environment; a
// container gets /model, mounted read-only from the cache. A pull that
// fails, and a node without a model cache, fail the job with the reason in
// its log.
func TestJobModelPull(t *testing.T) {
	c := newCluster(t, server.Config{})
	proc, ctr := &recordingExec{name: "process"}, &recordingExec{name: "containerd"}
	puller := &fakePuller{dir: "/var/cache/kiln/models/4f2a"}
	c.addAgentWith("n1", machines(t)["pcie"], proc, 100*time.Millisecond, func(cfg *agent.Config) {
		cfg.Containers, cfg.Models = ctr, puller
	})
	c.waitNodes(1)
	alice := c.user("alice", "default")
	ctx := context.Background()
	model := &api.JobModel{Ref: "registry.lab:5000/models/m@sha256:" + strings.Repeat("c", 64), Digest: "sha256:" + strings.Repeat("c", 64)}
	run := func(spec api.JobSpec) *api.Lease {
		t.Helper()
		l, err := alice.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: &spec})
		if err != nil {
			t.Fatal(err)
		}
		return waitLease(t, alice, l.ID, 20*time.Second, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })
	}
	l := run(api.JobSpec{Command: []string{"engine", "--model", "{model}", "--file={model_file}"}, Env: map[string]string{"MODEL_DIR": "{model}"}, Model: model})
	j := proc.job(l.Jobs[0])
	if j == nil {
		t.Fatalf("the process job never started: %s", l.Reason)
	}
	if strings.Join(j.Command, " ") != "engine --model /var/cache/kiln/models/4f2a --file=/var/cache/kiln/models/4f2a/weights.gguf" ||
		j.Env["MODEL_DIR"] != "/var/cache/kiln/models/4f2a" || j.ModelDir != "/var/cache/kiln/models/4f2a" {
		t.Errorf("the process job: %q env %v model dir %q", j.Command, j.Env["MODEL_DIR"], j.ModelDir)
	}
	if len(puller.got) != 1 || puller.got[0] != model.Ref+" "+model.Digest {
		t.Errorf("pulled %q", puller.got)
	}
	l = run(api.JobSpec{Image: "registry.lab:5000/engines/llama:1", Command: []string{"llama-server", "-m", "{model_file}", "--path", "{model}"}, Model: model})
	j = ctr.job(l.Jobs[0])
	if j == nil {
		t.Fatalf("the image job never started: %s", l.Reason)
	}
	if strings.Join(j.Command, " ") != "llama-server -m /model/weights.gguf --path /model" || j.ModelDir != "/var/cache/kiln/models/4f2a" {
		t.Errorf("the image job: %q, model dir %q", j.Command, j.ModelDir)
	}
	logs := func(job string) string {
		rc, err := alice.JobLogs(ctx, job, false)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return string(b)
	}
	if lg := logs(l.Jobs[0]); !strings.Contains(lg, "pulling the model "+model.Ref) || !strings.Contains(lg, "1 of 2 MiB") {
		t.Errorf("the pull's progress in the job's log:\n%s", lg)
	}

	// Each job that pulled its model gave it back when it ended.
	puller.mu.Lock()
	released := append([]string(nil), puller.released...)
	puller.mu.Unlock()
	if len(released) != 2 || released[0] != model.Digest || released[1] != model.Digest {
		t.Errorf("released %q, want the model twice", released)
	}

	puller.err = errors.New("registry.lab:5000: connection refused")
	l = run(api.JobSpec{Command: []string{"engine", "{model}"}, Model: model})
	if proc.job(l.Jobs[0]) != nil {
		t.Error("a job whose model did not pull started")
	}
	if lg := logs(l.Jobs[0]); !strings.Contains(lg, "failed to start") || !strings.Contains(lg, "connection refused") {
		t.Errorf("a failed pull's log:\n%s", lg)
	}
	if puller.mu.Lock(); len(puller.released) != 2 {
		t.Errorf("a failed pull released the model: %q", puller.released)
	}
	puller.mu.Unlock()

	// A node without a model cache.
	c.addAgentWith("n2", machines(t)["pcie"], &recordingExec{name: "process"}, 100*time.Millisecond, nil)
	c.waitNodes(2)
	bare, err := alice.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Constraints: api.Constraints{Nodes: []string{"n2"}},
		Job: &api.JobSpec{Command: []string{"engine", "{model}"}, Model: model}})
	if err != nil {
		t.Fatal(err)
	}
	bare = waitLease(t, alice, bare.ID, 20*time.Second, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })
	if lg := logs(bare.Jobs[0]); !strings.Contains(lg, "no model cache") {
		t.Errorf("a node without a model cache:\n%s", lg)
	}
}
