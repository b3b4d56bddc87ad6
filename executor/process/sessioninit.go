package process

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
)

// Sessions beside a sandboxed job (kiln exec, kiln shell) are started by
// its job init, which alone is inside the job's namespaces and cgroup: the
// executor sends it requests on a control socket (fd 5, SOCK_SEQPACKET,
// one JSON message a packet) with the command's terminal or pipes passed
// as SCM_RIGHTS, and the init starts the command as the job's user with
// its environment and directory, and reports its process and, once reaped,
// how it ended. The job's end ends them all.

// ctlFD is the control socket's descriptor in the job init.
const ctlFD = 5

// maxCtlMsg bounds a control message.
const maxCtlMsg = 64 << 10

// ctlMsg is a control message, both ways.
type ctlMsg struct {
	Op   string   `json:"op,omitempty"` // to the init: "exec" or "signal"
	ID   uint64   `json:"id"`
	Argv []string `json:"argv,omitempty"`
	TTY  bool     `json:"tty,omitempty"`
	Term string   `json:"term,omitempty"`
	Sig  int      `json:"sig,omitempty"`
	// From the init: the started command's process, or why it did not
	// start; then Done with how it ended.
	PID    int    `json:"pid,omitempty"`
	Error  string `json:"error,omitempty"`
	Done   bool   `json:"done,omitempty"`
	Code   int    `json:"code,omitempty"`
	Signal int    `json:"signal,omitempty"`
}

// initSessions is the job init's side of its sessions.
type initSessions struct {
	conn *net.UnixConn
	cfg  *initConfig

	mu    sync.Mutex
	ended bool // the job is over: no new session
	byPID map[int]uint64
	byID  map[uint64]int
}

// openInitSessions takes the control socket, if the executor passed one.
func openInitSessions(cfg *initConfig) *initSessions {
	if !cfg.Control {
		return nil
	}
	syscall.CloseOnExec(ctlFD)
	f := os.NewFile(ctlFD, "control")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil
	}
	return &initSessions{conn: uc, cfg: cfg, byPID: map[int]uint64{}, byID: map[uint64]int{}}
}

func (s *initSessions) send(m ctlMsg) {
	b, err := json.Marshal(m)
	if err == nil {
		_, _ = s.conn.Write(b)
	}
}

// serve answers the executor's requests until it goes away, then ends the
// sessions.
func (s *initSessions) serve() {
	buf := make([]byte, maxCtlMsg)
	oob := make([]byte, syscall.CmsgSpace(3*4))
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			break
		}
		files := receivedFiles(oob[:oobn])
		var m ctlMsg
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			closeFiles(files)
			continue
		}
		switch m.Op {
		case "exec":
			s.exec(m, files)
		case "signal":
			closeFiles(files)
			s.signal(m.ID, syscall.Signal(m.Sig))
		default:
			closeFiles(files)
			s.send(ctlMsg{ID: m.ID, Error: fmt.Sprintf("unknown request %q", m.Op)})
		}
	}
	s.mu.Lock()
	for pid := range s.byPID {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	s.mu.Unlock()
}

func (s *initSessions) exec(m ctlMsg, files []*os.File) {
	defer closeFiles(files)
	fail := func(format string, args ...any) {
		s.send(ctlMsg{ID: m.ID, Error: fmt.Sprintf(format, args...)})
	}
	want := 3
	if m.TTY {
		want = 1
	}
	if len(files) != want {
		fail("the request carries %d descriptors; want %d", len(files), want)
		return
	}
	if m.TTY {
		files = []*os.File{files[0], files[0], files[0]}
	}
	argv := m.Argv
	if len(argv) == 0 {
		argv = []string{defaultShell()}
	}
	env := append([]string{}, s.cfg.Env...)
	if m.TTY {
		term := m.Term
		if term == "" {
			term = "xterm-256color"
		}
		env = setEnv(env, "TERM", term)
	}
	prog := argv[0]
	if !strings.Contains(prog, "/") {
		p, ok := lookPath(prog, env)
		if !ok {
			fail("%s: not found in the job's PATH", prog)
			return
		}
		prog = p
	}
	sys := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: s.cfg.UID, Gid: s.cfg.GID, Groups: append([]uint32{}, s.cfg.Groups...)}}
	if m.TTY {
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		sys.Setpgid = true
	}
	// Held until the process is in the map, so that the reaper, which
	// looks it up under the same lock, cannot miss it.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		fail("the job has ended")
		return
	}
	p, err := os.StartProcess(prog, argv, &os.ProcAttr{Dir: s.cfg.Dir, Env: env, Files: files, Sys: sys})
	if err != nil {
		fail("starting %s: %v", argv[0], err)
		return
	}
	s.byPID[p.Pid], s.byID[m.ID] = m.ID, p.Pid
	_ = p.Release()
	s.send(ctlMsg{ID: m.ID, PID: p.Pid})
}

func (s *initSessions) signal(id uint64, sig syscall.Signal) {
	s.mu.Lock()
	pid, ok := s.byID[id]
	s.mu.Unlock()
	if ok && sig > 0 && sig < 65 {
		_ = syscall.Kill(-pid, sig)
	}
}

// reaped reports a session's command the init reaped; false when pid is
// none of them.
func (s *initSessions) reaped(pid int, ws syscall.WaitStatus) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	id, ok := s.byPID[pid]
	if ok {
		delete(s.byPID, pid)
		delete(s.byID, id)
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	// What the command left in its group goes with it.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	m := ctlMsg{ID: id, Done: true, Code: ws.ExitStatus()}
	if ws.Signaled() {
		m.Signal = int(ws.Signal())
		m.Code = 128 + m.Signal
	}
	s.send(m)
	return true
}

// end refuses new sessions and kills those that run: the job is over.
func (s *initSessions) end() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.ended = true
	for pid := range s.byPID {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	s.mu.Unlock()
}

// receivedFiles are the descriptors an SCM_RIGHTS message carried.
func receivedFiles(oob []byte) []*os.File {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			syscall.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "session"))
		}
	}
	return files
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// defaultShell is the shell a session without a command runs.
func defaultShell() string {
	for _, sh := range []string{"/bin/bash", "/usr/bin/bash", "/bin/sh"} {
		if st, err := os.Stat(sh); err == nil && st.Mode()&0o111 != 0 {
			return sh
		}
	}
	return "/bin/sh"
}

// setEnv sets k in env (replacing it where it is).
func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}
