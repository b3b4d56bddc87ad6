// Package containerdtest starts what container tests need on one machine:
// Debian's containerd (with its own root, state and socket in a temporary
// directory, so it never touches the host's containerd) and Debian's
// docker-registry on a loopback port, and pushes small images built from
// static Go programs.
//
// Where the machine cannot run containers (no root, no cgroups, no
// namespaces) the test is skipped and the reason is printed, so CI output
// says why. A missing package skips with how to install it, or fails where
// KILN_REQUIRE_TOOLS=1 (package testenv), as scripts/test.sh sets it.
package containerdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"kiln.dev/kiln/testenv"
)

// Packages is what scripts/test.sh installs for these tests.
const Packages = "containerd runc docker-registry"

// hint says how to get the programs these tests run.
const hint = "apt-get install " + Packages + " (scripts/test.sh installs them)"

// programs are what a container test runs: containerd, its runc shim,
// runc, and docker-registry to pull images from.
var programs = []string{"containerd", "containerd-shim-runc-v2", "runc", "docker-registry"}

// Unsupported says why this machine cannot run containers, or "" when it
// can: it checks the operating system, root, the programs (containerd,
// its runc shim, runc, docker-registry), cgroups and namespaces, in that
// order.
func Unsupported() string {
	if reason := hostUnsupported(); reason != "" {
		return reason
	}
	for _, bin := range programs {
		if _, err := testenv.Look(bin); err != nil {
			return fmt.Sprintf("%v (Debian packages: %s)", err, Packages)
		}
	}
	return kernelUnsupported()
}

// hostUnsupported checks the operating system and root.
func hostUnsupported() string {
	if runtime.GOOS != "linux" {
		return "containers need Linux, this is " + runtime.GOOS
	}
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Sprintf("containerd needs root, tests run as uid %d", uid)
	}
	return ""
}

// kernelUnsupported checks cgroups and namespaces.
func kernelUnsupported() string {
	if reason := cgroupProbe(); reason != "" {
		return reason
	}
	return namespaceProbe()
}

// cgroupProbe creates and removes one cgroup.
func cgroupProbe() string {
	base := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(base, "cgroup.controllers")); err != nil {
		// cgroup v1: limits live in per-controller hierarchies.
		base = filepath.Join(base, "memory")
		if _, err := os.Stat(base); err != nil {
			return "no cgroup file system: neither /sys/fs/cgroup/cgroup.controllers (v2) nor /sys/fs/cgroup/memory (v1) exists"
		}
	}
	probe := filepath.Join(base, fmt.Sprintf("kiln-probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return fmt.Sprintf("cannot create a cgroup under %s: %v", base, err)
	}
	if err := os.Remove(probe); err != nil {
		return fmt.Sprintf("cannot remove the probe cgroup %s: %v", probe, err)
	}
	return ""
}

// namespaceProbe runs /bin/true in new mount, PID, UTS and IPC
// namespaces, as runc does for every container.
func namespaceProbe() string {
	truePath, err := exec.LookPath("true")
	if err != nil {
		return "no true(1) to probe namespaces with"
	}
	cmd := exec.Command(truePath)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
	}
	if err := cmd.Run(); err != nil {
		return fmt.Sprintf("cannot create mount/PID/UTS/IPC namespaces: %v", err)
	}
	return ""
}

// Daemon is a containerd started for one test.
type Daemon struct {
	// Address is its socket.
	Address string
	// Snapshotter is "overlayfs", or "native" where overlayfs cannot be
	// used on this file system.
	Snapshotter string
	// Dir holds its root, state, config and log.
	Dir string
	cmd *exec.Cmd
}

// Start starts containerd for t and stops it when t ends; t is skipped,
// with the reason, where containers cannot run.
func Start(t testing.TB) *Daemon {
	t.Helper()
	// Not being root or lacking cgroups is the machine's nature and skips;
	// a missing program is a missing package: it skips with the hint, and
	// fails where KILN_REQUIRE_TOOLS=1 (package testenv).
	if reason := hostUnsupported(); reason != "" {
		t.Skipf("skipping container test: %s", reason)
	}
	for _, p := range programs {
		testenv.Need(t, p, hint)
	}
	if reason := kernelUnsupported(); reason != "" {
		t.Skipf("skipping container test: %s", reason)
	}
	bin := testenv.Need(t, "containerd", hint)
	// Socket paths are limited to 108 bytes: keep the directory short.
	dir, err := os.MkdirTemp("", "kiln-ctd-")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{Address: filepath.Join(dir, "containerd.sock"), Dir: dir}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), d.Address, d.Address+".ttrpc", filepath.Join(dir, "opt"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "containerd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin, "--config", cfgPath)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	// Debian installs runc in /usr/sbin, which a non-login shell's PATH may
	// lack: containerd looks for it on PATH.
	d.cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":"+strings.Join(testenv.SbinDirs, ":"))
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait(); logf.Close() }()
	t.Cleanup(func() { d.stop(t, exited) })

	c, err := waitForDaemon(d.Address, exited)
	if err != nil {
		t.Fatalf("containerd did not start: %v\n%s", err, tail(logPath, 30))
	}
	defer c.Close()
	d.Snapshotter, err = snapshotter(c)
	if err != nil {
		t.Fatalf("%v\n%s", err, tail(logPath, 30))
	}
	if d.Snapshotter != "overlayfs" {
		t.Logf("containerd: overlayfs unavailable here, using the %s snapshotter", d.Snapshotter)
	}
	return d
}

func waitForDaemon(address string, exited <-chan error) (*client.Client, error) {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("containerd exited: %v", err)
		default:
		}
		if _, err := os.Stat(address); err == nil {
			c, err := client.New(address, client.WithTimeout(2*time.Second))
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err = c.Version(ctx)
				cancel()
				if err == nil {
					return c, nil
				}
				c.Close()
			}
			last = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("no answer on %s after 30 s: %v", address, last)
}

// snapshotter picks overlayfs when containerd loaded it, else native.
func snapshotter(c *client.Client) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.IntrospectionService().Plugins(ctx, `type=="io.containerd.snapshotter.v1"`)
	if err != nil {
		return "", fmt.Errorf("listing containerd's snapshotters: %w", err)
	}
	native := false
	for _, p := range resp.Plugins {
		if p.InitErr != nil {
			continue
		}
		switch p.ID {
		case "overlayfs":
			return "overlayfs", nil
		case "native":
			native = true
		}
	}
	if native {
		return "native", nil
	}
	return "", errors.New("containerd loaded neither the overlayfs nor the native snapshotter")
}

// stop removes what tests left in containerd, stops it, and unmounts
// anything left under its directory.
func (d *Daemon) stop(t testing.TB, exited <-chan error) {
	if c, err := client.New(d.Address, client.WithTimeout(2*time.Second)); err == nil {
		cleanAll(c)
		c.Close()
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-exited
	}
	unmountUnder(d.Dir)
	if err := os.RemoveAll(d.Dir); err != nil {
		t.Logf("removing %s: %v", d.Dir, err)
	}
}

// cleanAll kills and deletes every task and container in every namespace.
func cleanAll(c *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nss, err := c.NamespaceService().List(ctx)
	if err != nil {
		return
	}
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		ctrs, err := c.Containers(nctx)
		if err != nil {
			continue
		}
		for _, ctr := range ctrs {
			if task, err := ctr.Task(nctx, nil); err == nil {
				_, _ = task.Delete(nctx, client.WithProcessKill)
			}
			_ = ctr.Delete(nctx, client.WithSnapshotCleanup)
		}
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

// tail returns the last n lines of a file, for failure messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Registry is a docker-registry on a loopback port.
type Registry struct {
	// Host is "127.0.0.1:<port>", the registry part of image references.
	Host string
}

// StartRegistry starts Debian's docker-registry for t, storing images in a
// temporary directory; t is skipped, with the hint, when it is missing
// (fails with KILN_REQUIRE_TOOLS=1).
func StartRegistry(t testing.TB) *Registry {
	t.Helper()
	bin := testenv.Need(t, "docker-registry", hint)
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	config := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(dir, "data"), host)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "registry.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case err := <-exited:
			t.Fatalf("docker-registry exited: %v\n%s", err, tail(logPath, 20))
		default:
		}
		resp, err := hc.Get("http://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return &Registry{Host: host}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("docker-registry on %s did not answer: %v\n%s", host, err, tail(logPath, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
