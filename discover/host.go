package discover

import (
	"bufio"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// readHost fills s.Host from procfs, /etc/os-release and the NUMA and CPU
// directories of sysfs.
func readHost(r *reader, s *snapshot.Snapshot) {
	h := &s.Host
	if v, ok := r.readString("proc/sys/kernel/hostname"); ok {
		h.Hostname = v
	}
	if v, ok := r.readString("proc/sys/kernel/osrelease"); ok {
		h.Kernel = v
	}
	if v, ok := r.readString("proc/sys/kernel/arch"); ok {
		h.Arch = v
	}
	if b, err := r.readFile("etc/os-release"); err == nil {
		osr := ParseOSRelease(string(b))
		h.OS, h.OSVersion, h.OSPrettyName = osr["ID"], osr["VERSION_ID"], osr["PRETTY_NAME"]
	} else if b, err := r.readFile("usr/lib/os-release"); err == nil {
		osr := ParseOSRelease(string(b))
		h.OS, h.OSVersion, h.OSPrettyName = osr["ID"], osr["VERSION_ID"], osr["PRETTY_NAME"]
	}
	if b, err := r.readFile("proc/cpuinfo"); err == nil {
		h.CPUModel, h.CPUs = ParseCPUInfo(string(b))
	} else {
		note(s, "sysfs", "CPU model unknown: /proc/cpuinfo not readable")
	}
	if b, err := r.readFile("proc/meminfo"); err == nil {
		h.MemoryBytes = parseMemTotal(string(b), "MemTotal:")
	}
	h.NUMANodes = readNUMANodes(r)
	if v, ok := r.readString("sys/devices/system/cpu/online"); ok {
		h.OnlineCPUs = v
	}
	if b, err := r.readFile("proc/self/status"); err == nil {
		h.CPUSet = statusField(string(b), "Cpus_allowed_list")
	}
	if h.CPUSet != "" && h.OnlineCPUs != "" {
		inSet, err1 := CPUListCount(h.CPUSet)
		online, err2 := CPUListCount(h.OnlineCPUs)
		if err1 == nil && err2 == nil && inSet < online {
			notef(s, "sysfs", "this process may use %d of the host's %d online CPUs (cpuset %s): it runs in a container or under a CPU restriction", inSet, online, h.CPUSet)
		}
	}
}

// ParseOSRelease reads os-release(5) KEY=value lines; values may be quoted.
func ParseOSRelease(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
			v = strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\$`, `$`, "\\`", "`").Replace(v)
		}
		out[strings.TrimSpace(k)] = v
	}
	return out
}

// ParseCPUInfo returns the first "model name" (x86) and the number of
// "processor" entries of /proc/cpuinfo.
func ParseCPUInfo(text string) (model string, cpus int) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			if _, err := strconv.Atoi(v); err == nil {
				cpus++
			}
		case "model name":
			if model == "" {
				model = v
			}
		}
	}
	return model, cpus
}

// parseMemTotal finds a "<key> <n> kB" line (as in /proc/meminfo, and in
// node meminfo after the "Node N" prefix) and returns bytes.
func parseMemTotal(text, key string) uint64 {
	for _, line := range strings.Split(text, "\n") {
		i := strings.Index(line, key)
		if i < 0 {
			continue
		}
		f := strings.Fields(line[i+len(key):])
		if len(f) == 0 {
			return 0
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0
		}
		if len(f) > 1 && strings.EqualFold(f[1], "kB") {
			return n * 1024
		}
		return n
	}
	return 0
}

// statusField returns a "Key:\tvalue" field of /proc/<pid>/status.
func statusField(text, key string) string {
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func readNUMANodes(r *reader) []snapshot.NUMANode {
	es, err := r.readDir("sys/devices/system/node")
	if err != nil {
		return nil
	}
	var out []snapshot.NUMANode
	for _, e := range es {
		name := e.Name()
		if !strings.HasPrefix(name, "node") {
			continue
		}
		id, err := strconv.Atoi(strings.TrimPrefix(name, "node"))
		if err != nil || id < 0 {
			continue
		}
		n := snapshot.NUMANode{ID: id}
		dir := "sys/devices/system/node/" + name
		if v, ok := r.readString(dir + "/cpulist"); ok {
			n.CPUs = v
		} else {
			r.markDir(dir)
		}
		if b, err := r.readFile(dir + "/meminfo"); err == nil {
			n.MemoryBytes = parseMemTotal(string(b), "MemTotal:")
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// CPUListCount counts the CPUs of a kernel CPU list ("0-3,8,10-11" is 7).
func CPUListCount(list string) (int, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return 0, nil
	}
	n := 0
	for _, part := range strings.Split(list, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0, &listError{list}
		}
		b := a
		if isRange {
			// "0-63:2/4" (group syntax) is not used in sysfs output.
			b, err = strconv.Atoi(hi)
			if err != nil || b < a {
				return 0, &listError{list}
			}
		}
		n += b - a + 1
		if n > 1<<20 {
			return 0, &listError{list}
		}
	}
	return n, nil
}

type listError struct{ list string }

func (e *listError) Error() string {
	return "cannot read " + strconv.Quote(e.list) + " as a kernel CPU list"
}
