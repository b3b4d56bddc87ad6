package capture

import (
	"bytes"
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// The loaded kernel modules, as /proc/modules lists them ("nouveau 1495040
// 0 - Live 0xffffffffc0a1b000") or lsmod prints them ("Module Size Used
// by" and then "nouveau 1495040 0"): which GPU drivers the kernel has
// loaded. nvidia-bug-report.log and sosreports carry them.
func init() {
	RegisterFile(FileImporter{Kind: "kernel-modules", Detect: detectModules, Parse: parseModules})
}

func detectModules(_ string, data []byte) bool {
	n, ok := 0, 0
	lsmod := false
	forEachLine(data[:min(len(data), detectHead)], func(line []byte) bool {
		t := strings.TrimSpace(string(line))
		if t == "" {
			return true
		}
		n++
		if n == 1 && strings.HasPrefix(t, "Module") && strings.Contains(t, "Size") && strings.Contains(t, "Used by") {
			lsmod = true
			ok++
			return true
		}
		if _, good := moduleLine(t, lsmod); good {
			ok++
		}
		return n < 200
	})
	return n >= 3 && ok*10 >= n*9
}

// moduleLine reads one line: the module's name, with its size and use
// count as numbers; /proc/modules adds its users, state and address.
func moduleLine(t string, lsmod bool) (string, bool) {
	f := strings.Fields(t)
	if len(f) < 3 || !isNumber(f[1]) || !isNumber(f[2]) {
		return "", false
	}
	if !lsmod {
		if len(f) < 5 || (f[4] != "Live" && f[4] != "Loading" && f[4] != "Unloading") {
			return "", false
		}
	}
	for _, c := range f[0] {
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return "", false
		}
	}
	return f[0], true
}

func isNumber(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func parseModules(_ string, data []byte) (*snapshot.Snapshot, error) {
	s := snapshot.New()
	loaded := map[string]bool{}
	lsmod := bytes.HasPrefix(bytes.TrimSpace(data), []byte("Module"))
	forEachLine(data, func(line []byte) bool {
		if name, ok := moduleLine(strings.TrimSpace(string(line)), lsmod); ok {
			loaded[name] = true
		}
		return true
	})
	if len(loaded) == 0 {
		return nil, fmt.Errorf("no module line found")
	}
	s.Drivers.NouveauLoaded = snapshot.Ptr(loaded["nouveau"])
	var gpu []string
	for _, m := range []string{"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia_peermem", "nouveau", "amdgpu", "radeon", "i915", "xe"} {
		if loaded[m] {
			gpu = append(gpu, m)
		}
	}
	msg := "GPU driver modules loaded: none"
	if len(gpu) > 0 {
		msg = "GPU driver modules loaded: " + strings.Join(gpu, ", ")
	}
	s.Notes = append(s.Notes, snapshot.Note{Source: "kernel-modules", Message: fmt.Sprintf("%s (%d modules)", msg, len(loaded))})
	return s, nil
}
