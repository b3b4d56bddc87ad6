package containerd

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/containerd/containerdtest"
	"kiln.dev/kiln/snapshot"
)

// TestContainerSupport says whether this machine runs the container tests,
// and if not, why: scripts/test.sh runs it verbosely so that CI shows it.
func TestContainerSupport(t *testing.T) {
	if reason := containerdtest.Unsupported(); reason != "" {
		t.Skipf("skipping container tests: %s", reason)
	}
	t.Log("container tests run here: root, containerd, runc, docker-registry, cgroups and namespaces are available")
}

func TestNormalizeRef(t *testing.T) {
	for in, want := range map[string]string{
		"alpine":                           "docker.io/library/alpine:latest",
		"registry.lab:5000/team/train":     "registry.lab:5000/team/train:latest",
		"127.0.0.1:5000/kiln/job:v1":       "127.0.0.1:5000/kiln/job:v1",
		"nvcr.io/nvidia/pytorch:24.05-py3": "nvcr.io/nvidia/pytorch:24.05-py3",
	} {
		got, err := NormalizeRef(in)
		if err != nil || got != want {
			t.Errorf("NormalizeRef(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := NormalizeRef("Bad Ref"); err == nil {
		t.Error("invalid reference accepted")
	}
}

func TestPlainHTTPHosts(t *testing.T) {
	e := &Executor{cfg: Config{PlainHTTP: []string{"registry.lab", "10.0.0.5:5000"}}}
	for host, want := range map[string]bool{
		"registry.lab":      true,
		"registry.lab:5000": true,
		"REGISTRY.LAB:443":  true,
		"10.0.0.5:5000":     true,
		"10.0.0.5:5001":     false,
		"docker.io":         false,
	} {
		if got, _ := e.plainHTTP(host); got != want {
			t.Errorf("plainHTTP(%q) = %v, want %v", host, got, want)
		}
	}
	all := &Executor{cfg: Config{PlainHTTP: []string{"*"}}}
	if ok, _ := all.plainHTTP("anything:1"); !ok {
		t.Error(`"*" does not allow every registry`)
	}
}

func TestJobEnv(t *testing.T) {
	env, err := jobEnv(executor.Job{Env: map[string]string{"B": "2", "A": "x=y", "EMPTY": ""}})
	if err != nil || !slices.Equal(env, []string{"A=x=y", "B=2", "EMPTY="}) {
		t.Errorf("env %q, %v", env, err)
	}
	for _, bad := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"A": "nul\x00"}} {
		if _, err := jobEnv(executor.Job{ID: "j", Env: bad}); err == nil {
			t.Errorf("env %q accepted", bad)
		}
	}
}

func TestCDINames(t *testing.T) {
	names, err := cdiNames([]executor.Device{
		{Vendor: "nvidia", Index: 3},
		{CDIName: "kiln.dev/gpu=0:1:0"},
		{Vendor: "nvidia", Index: 3},
	})
	if err != nil || !slices.Equal(names, []string{"kiln.dev/gpu=3", "kiln.dev/gpu=0:1:0"}) {
		t.Errorf("names %q, %v", names, err)
	}
	if _, err := cdiNames([]executor.Device{{Index: -1}}); err == nil {
		t.Error("device without name or index accepted")
	}
}

func TestMPSEnv(t *testing.T) {
	got := mpsEnv(&executor.Share{MilliGPU: 333, MemoryBytes: 10 << 30, Isolation: "mps"})
	want := []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=34", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M"}
	if !slices.Equal(got, want) {
		t.Errorf("mps env %q, want %q", got, want)
	}
	if s := mpsShare([]executor.Device{{Share: &executor.Share{Isolation: "time-slicing"}}}); s != nil {
		t.Error("a time-slicing share got MPS settings")
	}
}

func TestSignalOf(t *testing.T) {
	for code, want := range map[uint32]string{0: "", 1: "", 128: "", 137: "SIGKILL", 143: "SIGTERM", 139: "SIGSEGV", 255: ""} {
		if got := signalOf(code); got != want {
			t.Errorf("signalOf(%d) = %q, want %q", code, got, want)
		}
	}
}

// TestSpecOpts applies a job's edits (all but the image's) to containerd's
// default spec: command, environment, working directory, host network,
// limits, and the CDI devices from a spec kiln wrote.
func TestSpecOpts(t *testing.T) {
	dir := t.TempDir()
	snap := &snapshot.Snapshot{GPUs: []snapshot.GPU{
		{Index: 0, Vendor: "nvidia", PCIAddress: "0000:17:00.0"},
		{Index: 1, Vendor: "nvidia", PCIAddress: "0000:65:00.0"},
	}}
	root := fstest.MapFS{
		"proc/devices": {Data: []byte("Character devices:\n195 nvidia\n510 nvidia-uvm\n")},
		"proc/driver/nvidia/gpus/0000:17:00.0/information": {Data: []byte("Device Minor: 0\n")},
		"proc/driver/nvidia/gpus/0000:65:00.0/information": {Data: []byte("Device Minor: 1\n")},
	}
	res, err := cdi.Generate(snap, cdi.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cdi.Write(res.Spec, dir); err != nil {
		t.Fatal(err)
	}
	e := &Executor{cfg: Config{CDIDirs: []string{dir}, MPSPipeDir: filepath.Join(dir, "no-mps")}}
	job := executor.Job{
		ID: "j1", Command: []string{"python", "train.py"}, WorkDir: "/work",
		Env:     map[string]string{"EPOCHS": "3"},
		Devices: []executor.Device{{Vendor: "nvidia", Index: 1, CDIName: "kiln.dev/gpu=1"}},
		Limits:  executor.Limits{CPUMilli: 2500, MemoryBytes: 1 << 30},
	}
	opts, err := e.specOpts(job, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), "kiln")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "j1"}, opts[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Process.Args, []string{"python", "train.py"}) || s.Process.Cwd != "/work" {
		t.Errorf("args %q cwd %q", s.Process.Args, s.Process.Cwd)
	}
	if !slices.Contains(s.Process.Env, "EPOCHS=3") {
		t.Errorf("env %q", s.Process.Env)
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == "network" {
			t.Error("job got its own network namespace; host network is the default")
		}
	}
	if l := s.Linux.Resources.Memory.Limit; l == nil || *l != 1<<30 {
		t.Errorf("memory limit %v", l)
	}
	if c := s.Linux.Resources.CPU; c == nil || c.Quota == nil || *c.Quota != 250000 || c.Period == nil || *c.Period != 100000 {
		t.Errorf("cpu %+v", c)
	}
	var devs []string
	for _, d := range s.Linux.Devices {
		devs = append(devs, d.Path)
	}
	if !slices.Contains(devs, "/dev/nvidia1") || slices.Contains(devs, "/dev/nvidia0") {
		t.Errorf("devices %v: want GPU 1 only", devs)
	}

	e.cfg.IsolateNetwork = true
	opts, _ = e.specOpts(executor.Job{ID: "j2"}, nil)
	s, err = oci.GenerateSpec(ctx, nil, &containers.Container{ID: "j2"}, opts[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == "network" }) {
		t.Error("IsolateNetwork did not give the job a network namespace")
	}
	if _, err := e.specOpts(executor.Job{ID: "j3", Limits: executor.Limits{CPUMilli: -1}}, nil); err == nil {
		t.Error("negative CPU limit accepted")
	}

	// A job's model: its cache folder, read-only at /model, and nothing
	// else of the host.
	opts, err = e.specOpts(executor.Job{ID: "j4", ModelDir: "/var/cache/kiln/models/abc"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err = oci.GenerateSpec(ctx, nil, &containers.Container{ID: "j4"}, opts[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	var model *specs.Mount
	for i, m := range s.Mounts {
		if m.Destination == executor.ModelTarget {
			model = &s.Mounts[i]
		}
		if m.Type == "bind" && m.Destination != executor.ModelTarget {
			t.Errorf("a host path is mounted: %+v", m)
		}
	}
	if model == nil || model.Source != "/var/cache/kiln/models/abc" || !slices.Contains(model.Options, "ro") || slices.Contains(model.Options, "rw") {
		t.Errorf("the model's mount: %+v", model)
	}
	if _, err := e.specOpts(executor.Job{ID: "j5", ModelDir: "models/abc"}, nil); err == nil {
		t.Error("a relative model folder accepted")
	}
}

func TestNewWithoutContainerd(t *testing.T) {
	_, err := New(context.Background(), Config{Address: filepath.Join(t.TempDir(), "none.sock"), LogDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "is containerd running?") {
		t.Errorf("err %v", err)
	}
}

// TestFollowerReadsUntilTheEnd appends to a file while a reader follows
// it: the reader sees every byte, then EOF once the job is done.
func TestFollowerReadsUntilTheEnd(t *testing.T) {
	p := filepath.Join(t.TempDir(), "job.log")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	h := &handle{id: "j", logPath: p, poll: 5 * time.Millisecond, done: done}
	r := h.Logs()
	defer r.Close()
	var got []byte
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		got, _ = io.ReadAll(r)
	}()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := range 50 {
		line := strings.Repeat("x", i) + "\n"
		want.WriteString(line)
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	f.Close()
	close(done)
	wg.Wait()
	if string(got) != want.String() {
		t.Errorf("read %d bytes, wrote %d", len(got), want.Len())
	}

	// Close ends a reader that waits for output.
	h2 := &handle{id: "k", logPath: p, poll: 5 * time.Millisecond, done: make(chan struct{})}
	r2 := h2.Logs()
	if _, err := io.ReadAll(io.LimitReader(r2, int64(want.Len()))); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := r2.Read(make([]byte, 10)); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	r2.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Error("read after close returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a waiting read")
	}

	// A job whose log cannot be opened reports why.
	h3 := &handle{id: "m", logPath: filepath.Join(t.TempDir(), "missing.log"), done: make(chan struct{})}
	if _, err := io.ReadAll(h3.Logs()); err == nil || !strings.Contains(err.Error(), "job m: logs") {
		t.Errorf("missing log: %v", err)
	}
}

// TestSpecIsolation: a container never runs as root (an image's own
// non-root user is kept), with no capability, no new privileges and the
// default seccomp profile.
func TestSpecIsolation(t *testing.T) {
	e := &Executor{cfg: Config{MPSPipeDir: filepath.Join(t.TempDir(), "no-mps")}}
	opts, err := e.specOpts(executor.Job{ID: "j1", Command: []string{"id"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := namespaces.WithNamespace(context.Background(), "kiln")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "j1"}, opts[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	if s.Process.User.UID == 0 || s.Process.User.GID == 0 {
		t.Errorf("the container runs as %+v, want not root", s.Process.User)
	}
	if c := s.Process.Capabilities; c == nil || len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Ambient) != 0 {
		t.Errorf("capabilities %+v, want none", c)
	}
	if !s.Process.NoNewPrivileges {
		t.Error("no_new_privileges not set")
	}
	if s.Linux.Seccomp == nil || len(s.Linux.Seccomp.Syscalls) == 0 {
		t.Error("no seccomp profile")
	}
	own := &oci.Spec{Process: &specs.Process{User: specs.User{UID: 1000, GID: 1000}}}
	if err := e.withoutRoot()(ctx, nil, nil, own); err != nil || own.Process.User.UID != 1000 {
		t.Errorf("an image's own user: %+v %v, want kept", own.Process.User, err)
	}
}
