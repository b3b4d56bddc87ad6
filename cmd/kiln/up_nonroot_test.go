package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// kiln up as a user other than root, without --job-user, is refused with
// the way out, and writes nothing: no data directory, CA or store is made
// for a service that cannot start.
func TestUpNonRootRefusedBeforeWriting(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start kiln as another user")
	}
	built := buildKiln(t)
	// t.TempDir's parent is root's alone: a folder under /tmp the other
	// user can enter.
	dir, err := os.MkdirTemp("", "kiln-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "kiln")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	cmd := exec.Command(bin, "up", "--data", data, "--listen", "127.0.0.1:0")
	cmd.Env = []string{"HOME=" + dir, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("exit %v, want 3\n%s", err, out)
	}
	if !strings.Contains(string(out), "--job-user") {
		t.Errorf("the refusal names no way out:\n%s", out)
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("the data directory was made (%v) for a service that was refused", err)
	}
}
