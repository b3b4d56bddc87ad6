// Package imagetest builds container images shaped like real GPU images
// (CUDA libraries with .nv_fatbin sections, torch/version.py, versioned .so
// names, ROCm version files) and runs a real registry to push them to. It
// serves kiln's compat tests and its compat benchmark.
package imagetest

import (
	"golang.org/x/crypto/bcrypt"

	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/testenv"
)

// RegistryBinary is Debian's CNCF distribution registry (package docker-registry).
const RegistryBinary = "/usr/bin/docker-registry"

// RegistryHint says how to get RegistryBinary.
const RegistryHint = "apt-get install docker-registry (Debian's CNCF distribution registry; scripts/test.sh installs it)"

// Registry is a running docker-registry on a loopback port.
type Registry struct {
	// Host is "127.0.0.1:PORT", the registry part of image references.
	Host string
	cmd  *exec.Cmd
	dir  string
	done chan error
}

// StartRegistry starts the docker-registry program bin (RegistryBinary
// when "") with its storage in dir, listening on a free loopback port, and
// waits until it answers.
func StartRegistry(bin, dir string) (*Registry, error) { return startRegistry(bin, dir, "", "") }

// StartRegistryAuth is StartRegistry for a registry that admits only user
// with password (htpasswd), as a lab's private registry does.
func StartRegistryAuth(bin, dir, user, password string) (*Registry, error) {
	return startRegistry(bin, dir, user, password)
}

func startRegistry(bin, dir, user, password string) (*Registry, error) {
	if bin == "" {
		bin = RegistryBinary
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s not found: %s: %w", bin, RegistryHint, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	host := fmt.Sprintf("127.0.0.1:%d", port)
	storage := filepath.Join(dir, "storage")
	if err := os.MkdirAll(storage, 0o755); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, storage, host)
	if user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			return nil, err
		}
		htpasswd := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
			return nil, err
		}
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: kiln-test\n    path: %s\n", htpasswd)
	}
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	r := &Registry{Host: host, cmd: cmd, dir: dir, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || (user != "" && resp.StatusCode == http.StatusUnauthorized) {
				return r, nil
			}
		}
		select {
		case err := <-r.done:
			log, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			return nil, fmt.Errorf("docker-registry exited before answering (%v): %s", err, strings.TrimSpace(string(log)))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.Stop()
			return nil, errors.New("docker-registry did not answer on " + host + " within 20 s")
		}
	}
}

// Stop ends the registry process and waits for it.
func (r *Registry) Stop() {
	if r == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Signal(os.Interrupt)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// NewTestRegistry starts a registry for one test and stops it when the
// test ends. Without the docker-registry program the test skips, saying how
// to get it (fails with KILN_REQUIRE_TOOLS=1; see package testenv).
func NewTestRegistry(t testing.TB) *Registry {
	t.Helper()
	r, err := StartRegistry(NeedRegistry(t), t.TempDir())
	if err != nil {
		t.Fatalf("compat integration tests need a real registry: %v", err)
	}
	t.Cleanup(r.Stop)
	return r
}

// NeedRegistry returns the path of the docker-registry program, or skips t
// (fails it with KILN_REQUIRE_TOOLS=1) with the hint to install it.
func NeedRegistry(t testing.TB) string {
	t.Helper()
	return testenv.Need(t, "docker-registry", RegistryHint)
}

func freePort() (int, error) {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PushSpec builds the image of spec and pushes it to the registry as
// repo:v1, failing t on error; it returns the reference.
func (r *Registry) PushSpec(t testing.TB, repo string, spec Spec) string {
	t.Helper()
	img, err := Image(spec)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := Push(r.Host, repo, "v1", img)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}
