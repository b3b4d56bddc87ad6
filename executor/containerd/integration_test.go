package containerd

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/containerd/containerdtest"
	"kiln.dev/kiln/snapshot"
)

// writeCDISpecs writes kiln's GPU spec for a one-GPU NVIDIA host (the GPU
// nodes are fully described, so runc creates them without the driver)
// and a second spec whose device is the host's /dev/null under another
// name, with a file mount, to see host-backed injection work.
func writeCDISpecs(t *testing.T, dir, hostFile string) {
	t.Helper()
	snap := &snapshot.Snapshot{GPUs: []snapshot.GPU{{
		Index: 0, Vendor: snapshot.VendorNVIDIA, PCIAddress: "0000:17:00.0",
		UUID: "GPU-11111111-2222-3333-4444-555555555555",
	}}}
	root := fstest.MapFS{
		"proc/devices": {Data: []byte("Character devices:\n195 nvidia-frontend\n510 nvidia-uvm\n")},
		"proc/driver/nvidia/gpus/0000:17:00.0/information": {Data: []byte("Bus Location: \t 0000:17:00.0\nDevice Minor: \t 0\n")},
	}
	res, err := cdi.Generate(snap, cdi.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cdi.Write(res.Spec, dir); err != nil {
		t.Fatal(err)
	}
	test := cdispec.Spec{
		Version: "0.5.0",
		Kind:    "kiln.dev/test",
		Devices: []cdispec.Device{{
			Name: "null",
			ContainerEdits: cdispec.ContainerEdits{
				Env:         []string{"KILN_CDI_DEVICE=null"},
				DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/kiln-test", HostPath: "/dev/null"}},
				Mounts: []*cdispec.Mount{{
					HostPath: hostFile, ContainerPath: "/usr/local/nvidia/lib64/libkiln.so.1",
					Type: "bind", Options: []string{"ro", "rbind", "nosuid", "nodev"},
				}},
			},
		}},
	}
	b, err := json.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kiln.dev-test.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// cgroupValue reads a cgroup file of a process from the host: v1 file in
// the controller's hierarchy, or the v2 file in the unified one.
func cgroupValue(t *testing.T, pid uint32, controller, v1, v2 string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case parts[1] == "" && parts[0] == "0":
			file = filepath.Join("/sys/fs/cgroup", parts[2], v2)
		case slices.Contains(strings.Split(parts[1], ","), controller):
			file = filepath.Join("/sys/fs/cgroup", parts[1], parts[2], v1)
		default:
			continue
		}
		if v, err := os.ReadFile(file); err == nil {
			return strings.TrimSpace(string(v))
		}
	}
	t.Fatalf("no %s cgroup file for pid %d in %q", controller, pid, b)
	return ""
}

// lines sends r's lines, without their ends and a terminal's CR, until
// r ends.
func lines(r io.Reader) <-chan string {
	ch := make(chan string, 256)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- strings.TrimRight(sc.Text(), "\r")
		}
	}()
	return ch
}

// expectLine reads ch until a line equals want, within 20 s, and returns
// the lines before it.
func expectLine(t *testing.T, ch <-chan string, want string) []string {
	t.Helper()
	timeout := time.After(20 * time.Second)
	var seen []string
	for {
		select {
		case l, ok := <-ch:
			if !ok {
				t.Fatalf("output ended without %q; it was %q", want, seen)
			}
			// A terminal echoes a typed Ctrl-C as ^C before what follows.
			if strings.TrimPrefix(l, "^C") == want {
				return seen
			}
			seen = append(seen, l)
		case <-timeout:
			t.Fatalf("no %q within 20 s; output %q", want, seen)
		}
	}
}

// readUntil reads r until a line equals want.
func readUntil(t *testing.T, r io.Reader, want string) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if sc.Text() == want {
			return
		}
	}
	t.Fatalf("log ended without %q (%v)", want, sc.Err())
}

func TestContainerJobsEndToEnd(t *testing.T) {
	d := containerdtest.Start(t)
	reg := containerdtest.StartRegistry(t)
	img := containerdtest.Image(t, containerdtest.BuildStatic(t, "testdata/jobprog"))
	ref := reg.Push(t, img, "kiln/jobprog:test")
	t.Logf("containerd at %s (%s snapshotter), image %s", d.Address, d.Snapshotter, ref)

	tmp := t.TempDir()
	cdiDir := filepath.Join(tmp, "cdi")
	hostFile := filepath.Join(tmp, "libkiln.so.1")
	if err := os.WriteFile(hostFile, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeCDISpecs(t, cdiDir, hostFile)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ex, err := New(ctx, Config{
		Address:     d.Address,
		Snapshotter: d.Snapshotter,
		PlainHTTP:   []string{reg.Host},
		LogDir:      filepath.Join(tmp, "logs"),
		CDIDirs:     []string{cdiDir},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()

	t.Run("report", func(t *testing.T) {
		h, err := ex.Start(ctx, executor.Job{
			ID: "job-report", LeaseID: "lease-1", Image: ref,
			Command: []string{"/jobprog", "report", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm",
				"/dev/kiln-test", "/usr/local/nvidia/lib64/libkiln.so.1", "/dev/nvidia1"},
			Env:     map[string]string{"KILN_TEST_VALUE": "a b=c"},
			WorkDir: "/tmp",
			Devices: []executor.Device{
				{Vendor: "nvidia", Index: 0, CDIName: "kiln.dev/gpu=0"},
				{CDIName: "kiln.dev/test=null"},
				{Vendor: "nvidia", Index: 0, CDIName: "kiln.dev/gpu=0",
					Share: &executor.Share{MilliGPU: 250, MemoryBytes: 8 << 30, Isolation: "mps"}},
			},
			Limits: executor.Limits{CPUMilli: 1500, MemoryBytes: 64 << 20},
		})
		if err != nil {
			t.Fatal(err)
		}
		logs := h.Logs() // opened while the job may still run: it follows
		defer logs.Close()
		exit, err := h.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if exit.Code != 3 || exit.Reason != "exited" || exit.Signal != "" || exit.Finished.IsZero() {
			t.Errorf("exit %+v, want code 3, exited", exit)
		}
		b, err := io.ReadAll(logs)
		if err != nil {
			t.Fatal(err)
		}
		out := string(b)
		t.Logf("job output:\n%s", out)
		for _, want := range []string{
			"hello from a kiln job",
			"this line went to stderr",
			"env KILN_TEST_VALUE=a b=c",
			"env KILN_IMAGE_ENV=from-image",
			"env KILN_CDI_DEVICE=null",
			"env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
			"env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M",
			"cwd /tmp",
			"path /dev/nvidia0: char 195:0",
			"path /dev/nvidiactl: char 195:255",
			"path /dev/nvidia-uvm: char 510:0",
			"path /dev/kiln-test: char 1:3",
			"path /usr/local/nvidia/lib64/libkiln.so.1: file 10 bytes",
			"path /dev/nvidia1: missing",
		} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("output lacks %q", want)
			}
		}
		if !strings.Contains(out, "memory:/kiln/job-report") && !strings.Contains(out, "0::/kiln/job-report") {
			t.Error("the job does not run in its own cgroup /kiln/job-report")
		}
		// A second reader gets the whole log again, and the file stays.
		again, _ := io.ReadAll(h.Logs())
		if string(again) != out {
			t.Errorf("second reader got %d bytes, first %d", len(again), len(out))
		}
		if _, err := os.Stat(ex.LogPath("job-report")); err != nil {
			t.Error(err)
		}
		// The container and its snapshot are gone.
		if _, err := ex.client.LoadContainer(ex.ns(ctx), "job-report"); err == nil {
			t.Error("container job-report still exists after the job ended")
		}
	})

	t.Run("stop-with-sigterm", func(t *testing.T) {
		h, err := ex.Start(ctx, executor.Job{ID: "job-trap", Image: ref, Command: []string{"/jobprog", "trap"}})
		if err != nil {
			t.Fatal(err)
		}
		logs := h.Logs()
		defer logs.Close()
		readUntil(t, logs, "ready")
		start := time.Now()
		if err := h.Stop(ctx, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		exit, err := h.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if exit.Code != 0 || exit.Signal != "" || exit.Reason != "killed" {
			t.Errorf("exit %+v, want code 0 after SIGTERM, reason killed", exit)
		}
		if time.Since(start) > 15*time.Second {
			t.Errorf("SIGTERM took %v: the grace period ran out", time.Since(start))
		}
		readUntil(t, logs, "terminated")
	})

	t.Run("stop-with-sigkill-after-grace", func(t *testing.T) {
		h, err := ex.Start(ctx, executor.Job{ID: "job-wait", Image: ref, Command: []string{"/jobprog", "wait"},
			Limits: executor.Limits{CPUMilli: 1500, MemoryBytes: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		logs := h.Logs()
		defer logs.Close()
		readUntil(t, logs, "ready")
		if ids, err := ex.Running(ctx); err != nil || !slices.Equal(ids, []string{"job-wait"}) {
			t.Errorf("Running = %v, %v; want [job-wait]", ids, err)
		}
		// The limits, read from the host's cgroup files of the job.
		pid := h.(*handle).task.Pid()
		mem := cgroupValue(t, pid, "memory", "memory.limit_in_bytes", "memory.max")
		cpu := cgroupValue(t, pid, "cpu", "cpu.cfs_quota_us", "cpu.max")
		t.Logf("job-wait cgroup: memory limit %s, CPU quota %s", mem, cpu)
		if got := mem; got != "67108864" {
			t.Errorf("memory limit %q, want 67108864 (64 MiB)", got)
		}
		if got := cpu; got != "150000" && got != "150000 100000" {
			t.Errorf("CPU quota %q, want 150000 per 100000 us (1.5 CPUs)", got)
		}
		if err := h.Stop(ctx, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		exit, err := h.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if exit.Code != 137 || exit.Signal != "SIGKILL" || exit.Reason != "killed" {
			t.Errorf("exit %+v, want 137 SIGKILL killed", exit)
		}
		if _, err := io.ReadAll(logs); err != nil {
			t.Errorf("log reader after the end: %v", err)
		}
		if ids, err := ex.Running(ctx); err != nil || len(ids) != 0 {
			t.Errorf("Running after the end = %v, %v", ids, err)
		}
		if err := h.Stop(ctx, time.Second); err != nil {
			t.Errorf("Stop after the end: %v", err)
		}
	})

	t.Run("sessions", func(t *testing.T) {
		h, err := ex.Start(ctx, executor.Job{ID: "job-sessions", Image: ref, Command: []string{"/jobprog", "wait"},
			Env: map[string]string{"KILN_TEST_VALUE": "v1"}, WorkDir: "/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		logs := h.Logs()
		defer logs.Close()
		readUntil(t, logs, "ready")
		execer, ok := h.(executor.Execer)
		if !ok {
			t.Fatal("a container job's handle opens no sessions")
		}

		// Pipes: the job's user, directory, environment and cgroup; input
		// answered, stderr apart, SIGINT, the exit code.
		s, err := execer.Exec(ctx, executor.ExecSpec{Command: []string{"/jobprog", "session"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		out := lines(s.Stdout())
		errs := lines(s.Stderr())
		var before []string
		for _, want := range []string{"uid 65534 gid 65534", "cwd /tmp", "env KILN_TEST_VALUE=v1", "tty no"} {
			before = append(before, expectLine(t, out, want)...)
		}
		if !slices.ContainsFunc(before, func(l string) bool {
			return strings.HasPrefix(l, "proc-cgroup ") && strings.Contains(l, "/kiln/job-sessions")
		}) {
			t.Errorf("the session does not run in its job's cgroup /kiln/job-sessions: %q", before)
		}
		fmt.Fprintln(s.Stdin(), "hello")
		expectLine(t, out, "got hello")
		fmt.Fprintln(s.Stdin(), "stderr oops")
		expectLine(t, errs, "oops")
		fmt.Fprintln(s.Stdin(), "sleep")
		expectLine(t, out, "sleeping")
		if err := s.Signal("INT"); err != nil {
			t.Fatal(err)
		}
		expectLine(t, out, "interrupted")
		if ex, err := s.Wait(ctx); err != nil || ex.Code != 130 {
			t.Errorf("session after SIGINT: %+v %v, want code 130", ex, err)
		}

		// The end of input reaches the command.
		s2, err := execer.Exec(ctx, executor.ExecSpec{Command: []string{"/jobprog", "session"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		out2 := lines(s2.Stdout())
		fmt.Fprintln(s2.Stdin(), "last line")
		if err := s2.Stdin().Close(); err != nil {
			t.Fatal(err)
		}
		expectLine(t, out2, "got last line")
		expectLine(t, out2, "eof")
		if ex, err := s2.Wait(ctx); err != nil || ex.Code != 0 {
			t.Errorf("session after its input ended: %+v %v, want code 0", ex, err)
		}

		// A terminal of the size asked, resized, TERM set, Ctrl-C typed.
		tty, err := execer.Exec(ctx, executor.ExecSpec{Command: []string{"/jobprog", "session"}, TTY: true, Rows: 30, Cols: 100, Term: "screen"})
		if err != nil {
			t.Fatal(err)
		}
		defer tty.Close()
		if tty.Stderr() != nil {
			t.Error("a terminal session has a separate stderr")
		}
		tout := lines(tty.Stdout())
		for _, want := range []string{"term screen", "tty yes", "size 30 100"} {
			expectLine(t, tout, want)
		}
		if err := tty.Resize(40, 120); err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(tty.Stdin(), "size\r")
		expectLine(t, tout, "size 40 120")
		fmt.Fprint(tty.Stdin(), "sleep\r")
		expectLine(t, tout, "sleeping")
		if _, err := tty.Stdin().Write([]byte{3}); err != nil {
			t.Fatal(err)
		}
		expectLine(t, tout, "interrupted")
		if ex, err := tty.Wait(ctx); err != nil || ex.Code != 130 {
			t.Errorf("terminal session after Ctrl-C: %+v %v, want code 130", ex, err)
		}
		tty2, err := execer.Exec(ctx, executor.ExecSpec{Command: []string{"/jobprog", "session"}, TTY: true, Rows: 24, Cols: 80})
		if err != nil {
			t.Fatal(err)
		}
		defer tty2.Close()
		tout2 := lines(tty2.Stdout())
		expectLine(t, tout2, "size 24 80")
		fmt.Fprint(tty2.Stdin(), "exit 7\r")
		if ex, err := tty2.Wait(ctx); err != nil || ex.Code != 7 {
			t.Errorf("terminal session's exit: %+v %v, want code 7", ex, err)
		}

		// A program the image lacks is refused with its name; bad
		// arguments never reach containerd.
		if _, err := execer.Exec(ctx, executor.ExecSpec{Command: []string{"/no-such-program"}}); err == nil || !strings.Contains(err.Error(), "/no-such-program") {
			t.Errorf("a session of a missing program: %v", err)
		}
		if _, err := execer.Exec(ctx, executor.ExecSpec{Command: []string{"/jobprog", "a\x00b"}}); err == nil {
			t.Error("an argument with a NUL byte was taken")
		}

		// The job's end ends its sessions.
		s3, err := execer.Exec(ctx, executor.ExecSpec{Command: []string{"/jobprog", "session"}})
		if err != nil {
			t.Fatal(err)
		}
		defer s3.Close()
		expectLine(t, lines(s3.Stdout()), "tty no")
		if err := h.Stop(ctx, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		if _, err := s3.Wait(wctx); err != nil {
			t.Errorf("a session outlived its job: %v", err)
		}
		if _, err := h.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := execer.Exec(ctx, executor.ExecSpec{Command: []string{"/jobprog", "session"}}); err == nil {
			t.Error("a session opened beside a job that ended")
		}
	})

	t.Run("isolated-network-ports", func(t *testing.T) {
		iso, err := New(ctx, Config{Address: d.Address, Snapshotter: d.Snapshotter, PlainHTTP: []string{reg.Host},
			LogDir: filepath.Join(tmp, "logs"), CDIDirs: []string{cdiDir}, IsolateNetwork: true})
		if err != nil {
			t.Fatal(err)
		}
		defer iso.Close()
		// A port free on the host: the job listens on it in its own
		// namespace, where only DialPort reaches it.
		hl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := hl.Addr().(*net.TCPAddr).Port
		hl.Close()
		h, err := iso.Start(ctx, executor.Job{ID: "job-isolated", Image: ref, Command: []string{"/jobprog", "listen", strconv.Itoa(port)}})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Stop(ctx, time.Second)
		logs := h.Logs()
		defer logs.Close()
		readUntil(t, logs, "listening")
		if c, err := net.Dial("tcp", hl.Addr().String()); err == nil {
			c.Close()
			t.Fatal("the isolated job's port answers on the host's loopback")
		}
		dialer, ok := h.(interface {
			DialPort(context.Context, int) (net.Conn, error)
		})
		if !ok {
			t.Fatal("an isolated container job's handle does not dial its ports")
		}
		c, err := dialer.DialPort(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		want := []byte("through the job's network namespace")
		if _, err := c.Write(want); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != string(want) {
			t.Errorf("echo in the job's namespace: %q %v", got, err)
		}
		if _, err := dialer.DialPort(ctx, port+1); err == nil {
			t.Error("a port nothing listens on in the job's namespace was reached")
		}
		// The agent's own thread is back in its namespace: the host's
		// loopback still refuses the job's port.
		if c, err := net.Dial("tcp", hl.Addr().String()); err == nil {
			c.Close()
			t.Error("after DialPort the job's port answers on the host's loopback")
		}
	})

	t.Run("plain-http-needs-the-setting", func(t *testing.T) {
		other := reg.Push(t, img, "kiln/jobprog:other")
		strict, err := New(ctx, Config{Address: d.Address, Snapshotter: d.Snapshotter, LogDir: filepath.Join(tmp, "logs")})
		if err != nil {
			t.Fatal(err)
		}
		defer strict.Close()
		_, err = strict.Start(ctx, executor.Job{ID: "job-https", Image: other, Command: []string{"/jobprog", "wait"}})
		if err == nil || !strings.Contains(err.Error(), "plain HTTP") {
			t.Errorf("pull over HTTPS from a plain-HTTP registry: %v", err)
		}
	})

	t.Run("unknown-cdi-device", func(t *testing.T) {
		_, err := ex.Start(ctx, executor.Job{ID: "job-nogpu", Image: ref, Command: []string{"/jobprog", "wait"},
			Devices: []executor.Device{{CDIName: "kiln.dev/gpu=7"}}})
		if err == nil || !strings.Contains(err.Error(), "kiln.dev/gpu=7") {
			t.Errorf("start with an unknown GPU: %v", err)
		}
		if _, err := ex.client.LoadContainer(ex.ns(ctx), "job-nogpu"); err == nil {
			t.Error("a container was left for a job that could not start")
		}
	})
}
