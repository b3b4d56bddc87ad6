package containerd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCgroupDir reads a process's cgroup v2 directory from its /proc
// entry, and nothing from what is not one.
func TestCgroupDir(t *testing.T) {
	proc := t.TempDir()
	for pid, body := range map[string]string{
		"10": "0::/default/job-j1\n",
		"11": "12:pids:/x\n1:name=systemd:/y\n", // cgroup v1 only
		"12": "0::not-a-path\n",
	} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := cgroupDir(proc, 10); got != "/sys/fs/cgroup/default/job-j1" {
		t.Errorf("cgroupDir(10) = %q", got)
	}
	for _, pid := range []int{11, 12, 13, 0, -1} {
		if got := cgroupDir(proc, pid); got != "" {
			t.Errorf("cgroupDir(%d) = %q, want none", pid, got)
		}
	}
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil && strings.Contains(string(b), "0::/") {
		if got := cgroupDir("/proc", os.Getpid()); !strings.HasPrefix(got, "/sys/fs/cgroup") {
			t.Errorf("this process's cgroup: %q", got)
		}
	}
}
