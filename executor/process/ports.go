package process

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Jobs share the node's network namespace, so a port on loopback may be
// another tenant's. CheckPort makes sure the process that listens on a
// declared port is the job's before the agent connects to it.

// maxProcNetBytes bounds what is read of one /proc/net/tcp file.
const maxProcNetBytes = 64 << 20

// ErrNotTheJobs is a port that something other than the job listens on.
var ErrNotTheJobs = errors.New("another process, not the job's, listens on this port")

// CheckPort reports nil when a process of the job listens on port (on
// loopback or every address), ErrNotTheJobs when only others do, and
// another error when nothing does or /proc cannot tell.
func (h *handle) CheckPort(port int) error {
	if h.cmd.Process == nil {
		return errors.New("the job has no process")
	}
	return h.owned.check("/proc", h.cmd.Process.Pid, port)
}

// Owned remembers the listening sockets found to be a job's, so that
// each connection to a port reads /proc/net/tcp but not every process's
// descriptors: a socket's inode stays its own while it is open.
type Owned struct {
	mu    sync.Mutex
	known map[int]uint64 // port -> inode of the job's listener
}

// CheckListener is CheckPort for a job whose processes are root and its
// descendants (a container's init, for the containerd executor).
func (o *Owned) CheckListener(root, port int) error { return o.check("/proc", root, port) }

func (o *Owned) check(proc string, root, port int) error {
	listening, err := listeners(proc, port)
	if err != nil {
		return err
	}
	o.mu.Lock()
	in, ok := o.known[port]
	o.mu.Unlock()
	if ok && slices.Contains(listening, in) {
		return nil
	}
	mine := socketInodes(proc, descendants(proc, root))
	for _, in := range listening {
		if mine[in] {
			o.mu.Lock()
			if o.known == nil {
				o.known = map[int]uint64{}
			}
			o.known[port] = in
			o.mu.Unlock()
			return nil
		}
	}
	return ErrNotTheJobs
}

// listeners are the inodes of the sockets listening on port where the
// agent connects.
func listeners(proc string, port int) ([]uint64, error) {
	if proc == "/proc" {
		// The kernel's answer is quick; /proc/net/tcp is read when
		// sock_diag is not there (a kernel without it, a seccomp filter).
		if inodes, err := diagListeners(port); err == nil {
			if len(inodes) == 0 {
				return nil, fmt.Errorf("nothing listens on port %d", port)
			}
			return inodes, nil
		}
	}
	var listening []uint64
	for _, f := range []string{"net/tcp", "net/tcp6"} {
		b, err := readBounded(filepath.Join(proc, f), maxProcNetBytes)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		inodes, err := parseListeners(b, port)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		listening = append(listening, inodes...)
	}
	if len(listening) == 0 {
		return nil, fmt.Errorf("nothing listens on port %d", port)
	}
	return listening, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// parseListeners reads /proc/net/tcp or tcp6 and returns the socket
// inodes that listen on port on a loopback or wildcard address.
func parseListeners(b []byte, port int) ([]uint64, error) {
	var out []uint64
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 512), 4096)
	first := true
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if first {
			first = false
			if len(f) > 0 && f[0] == "sl" {
				continue
			}
		}
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
		if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
			continue
		}
		addr, p, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		pn, err := strconv.ParseUint(p, 16, 16)
		if err != nil || int(pn) != port || !reachableAddr(addr) {
			continue
		}
		in, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil || in == 0 {
			continue
		}
		out = append(out, in)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// reachableAddr: the agent connects to 127.0.0.1 or ::1, which reaches a
// socket bound there or to every address (/proc's hex, in host order
// per 32-bit word).
func reachableAddr(hex string) bool {
	switch strings.ToUpper(hex) {
	case "00000000", "0100007F", // 0.0.0.0, 127.0.0.1
		"00000000000000000000000000000000",                                     // ::
		"00000000000000000000000001000000",                                     // ::1
		"0000000000000000FFFF00000100007F", "0000000000000000FFFF000000000000": // ::ffff:127.0.0.1, ::ffff:0.0.0.0
		return true
	}
	return false
}

// descendants is root and every process below it.
func descendants(proc string, root int) []int {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return []int{root}
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := readBounded(filepath.Join(proc, e.Name(), "stat"), 4096)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// socketInodes are the sockets the processes hold open.
func socketInodes(proc string, pids []int) map[uint64]bool {
	out := map[uint64]bool{}
	for _, pid := range pids {
		dir := filepath.Join(proc, strconv.Itoa(pid), "fd")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			l, err := os.Readlink(filepath.Join(dir, e.Name()))
			if err != nil {
				continue
			}
			if s, ok := strings.CutPrefix(l, "socket:["); ok {
				if in, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil {
					out[in] = true
				}
			}
		}
	}
	return out
}
