package process

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CgroupOf is a process's cgroup v2 path ("/kiln/job-j1", from the "0::"
// line of proc/PID/cgroup), or "" when it cannot be read or the process
// is in no cgroup v2 hierarchy. proc is where /proc is ("/proc").
func CgroupOf(proc string, pid int) string {
	if pid <= 0 {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "cgroup"))
	if err != nil || len(b) > 64<<10 {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok && strings.HasPrefix(rest, "/") {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}
