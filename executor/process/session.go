package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"kiln.dev/kiln/executor"
)

// sessionStartWait bounds how long the job init may take to start a
// session's command.
const sessionStartWait = 10 * time.Second

// ctlConn is the executor's side of a job init's control socket.
type ctlConn struct {
	conn *net.UnixConn

	mu       sync.Mutex
	next     uint64
	starting map[uint64]chan ctlMsg
	running  map[uint64]*procSession
	gone     bool
}

// newCtlPair makes the control socket: the init's end (to pass as fd 5)
// and the executor's.
func newCtlPair() (*os.File, *ctlConn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("the job's control socket: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "control")
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("the job's control socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		syscall.Close(fds[1])
		return nil, nil, errors.New("the job's control socket is not a unix socket")
	}
	cc := &ctlConn{conn: uc, starting: map[uint64]chan ctlMsg{}, running: map[uint64]*procSession{}}
	go cc.read()
	return os.NewFile(uintptr(fds[1]), "control"), cc, nil
}

// read takes the init's messages until it is gone; the sessions still
// running then end with the job.
func (c *ctlConn) read() {
	buf := make([]byte, maxCtlMsg)
	for {
		n, err := c.conn.Read(buf)
		if err != nil || n == 0 {
			break
		}
		var m ctlMsg
		if json.Unmarshal(buf[:n], &m) != nil {
			continue
		}
		c.mu.Lock()
		if m.Done {
			if s := c.running[m.ID]; s != nil {
				delete(c.running, m.ID)
				ex := executor.Exit{Code: m.Code, Reason: "exited", Finished: time.Now()}
				if m.Signal > 0 {
					ex.Signal = syscall.Signal(m.Signal).String()
				}
				s.finish(ex)
			}
		} else if ch := c.starting[m.ID]; ch != nil {
			delete(c.starting, m.ID)
			ch <- m
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.gone = true
	for id, ch := range c.starting {
		ch <- ctlMsg{ID: id, Error: "the job has ended"}
	}
	for _, s := range c.running {
		s.finish(executor.Exit{Code: -1, Reason: "the job ended", Finished: time.Now()})
	}
	c.starting, c.running = map[uint64]chan ctlMsg{}, map[uint64]*procSession{}
	c.mu.Unlock()
	c.conn.Close()
}

// start asks the init to run spec on files (the terminal, or stdin,
// stdout and stderr) and registers s under its id.
func (c *ctlConn) start(ctx context.Context, spec executor.ExecSpec, files []*os.File, s *procSession) error {
	ch := make(chan ctlMsg, 1)
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return errors.New("the job has ended")
	}
	c.next++
	id := c.next
	// Registered before it can end: the init answers before it reaps.
	s.signal = func(sig syscall.Signal) error { return c.signal(id, sig) }
	c.starting[id], c.running[id] = ch, s
	c.mu.Unlock()
	b, err := json.Marshal(ctlMsg{Op: "exec", ID: id, Argv: spec.Command, TTY: spec.TTY, Term: spec.Term})
	if err == nil && len(b) > maxCtlMsg {
		err = fmt.Errorf("the command is too long (%d bytes)", len(b))
	}
	if err == nil {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		_, _, err = c.conn.WriteMsgUnix(b, syscall.UnixRights(fds...), nil)
	}
	if err != nil {
		c.mu.Lock()
		delete(c.starting, id)
		delete(c.running, id)
		c.mu.Unlock()
		return fmt.Errorf("asking the job init for the session: %w", err)
	}
	t := time.NewTimer(sessionStartWait)
	defer t.Stop()
	var m ctlMsg
	select {
	case m = <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = fmt.Errorf("the job init did not start the session within %s", sessionStartWait)
	}
	if err != nil {
		c.mu.Lock()
		_, waiting := c.starting[id]
		delete(c.starting, id)
		delete(c.running, id)
		c.mu.Unlock()
		if !waiting { // it started meanwhile: end it
			m = <-ch
			if m.Error == "" {
				c.signal(id, syscall.SIGKILL)
			}
		}
		return err
	}
	if m.Error != "" {
		c.mu.Lock()
		delete(c.running, id)
		c.mu.Unlock()
		return errors.New(m.Error)
	}
	return nil
}

func (c *ctlConn) signal(id uint64, sig syscall.Signal) error {
	b, _ := json.Marshal(ctlMsg{Op: "signal", ID: id, Sig: int(sig)})
	if _, err := c.conn.Write(b); err != nil {
		return fmt.Errorf("the job init: %w", err)
	}
	return nil
}

func (c *ctlConn) close() { c.conn.Close() }

// procSession is a session of the process executor.
type procSession struct {
	tty    *os.File // the terminal's master side, with TTY
	stdin  io.WriteCloser
	stdout io.Reader
	stderr io.Reader
	closer []io.Closer
	signal func(syscall.Signal) error
	*executor.SessionEnd
}

func (s *procSession) finish(ex executor.Exit) { s.Finish(ex) }

func (s *procSession) Stdin() io.WriteCloser { return s.stdin }
func (s *procSession) Stdout() io.Reader     { return s.stdout }
func (s *procSession) Stderr() io.Reader     { return s.stderr }

// Resize implements executor.Session.
func (s *procSession) Resize(rows, cols uint16) error {
	if s.tty == nil {
		return errors.New("the session has no terminal")
	}
	return pty.Setsize(s.tty, &pty.Winsize{Rows: rows, Cols: cols})
}

// Signal implements executor.Session.
func (s *procSession) Signal(name string) error {
	sig, ok := executor.SignalNamed(name)
	if !ok {
		return fmt.Errorf("signal %q: want one of INT, TERM, HUP, QUIT, KILL", name)
	}
	if s.Ended() {
		return nil
	}
	return s.signal(sig)
}

// Close implements executor.Session.
func (s *procSession) Close() error {
	if !s.Ended() {
		_ = s.signal(syscall.SIGKILL)
	}
	for _, c := range s.closer {
		c.Close()
	}
	return nil
}

// ttyReader reads a terminal's master side: EIO, which Linux gives once
// every process closed the other side, is its end.
type ttyReader struct{ f *os.File }

func (r ttyReader) Read(p []byte) (int, error) {
	n, err := r.f.Read(p)
	if err != nil && errors.Is(err, syscall.EIO) {
		err = io.EOF
	}
	return n, err
}

// ttyInput writes to the terminal; closing it types the end-of-file key
// (Ctrl-D) rather than hanging the terminal up.
type ttyInput struct {
	f    *os.File
	once sync.Once
}

func (w *ttyInput) Write(p []byte) (int, error) { return w.f.Write(p) }
func (w *ttyInput) Close() error {
	w.once.Do(func() { _, _ = w.f.Write([]byte{4}) })
	return nil
}

// sessionFiles makes a session's terminal or pipes: what the session keeps
// and the files its command gets (closed here once it has them).
func sessionFiles(spec executor.ExecSpec, s *procSession, uid, gid int) ([]*os.File, error) {
	if spec.TTY {
		master, slave, err := pty.Open()
		if err != nil {
			return nil, fmt.Errorf("a terminal for the session: %w", err)
		}
		rows, cols := spec.Rows, spec.Cols
		if rows == 0 || cols == 0 {
			rows, cols = 24, 80
		}
		_ = pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols})
		if uid >= 0 {
			// The terminal is its user's, as a login's is.
			_ = slave.Chown(uid, gid)
		}
		s.tty = master
		s.stdin, s.stdout = &ttyInput{f: master}, ttyReader{master}
		s.closer = []io.Closer{master}
		return []*os.File{slave}, nil
	}
	var mine, theirs []*os.File
	fail := func(err error) ([]*os.File, error) {
		closeFiles(mine)
		closeFiles(theirs)
		return nil, fmt.Errorf("pipes for the session: %w", err)
	}
	for i := 0; i < 3; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		if i == 0 {
			mine, theirs = append(mine, w), append(theirs, r)
		} else {
			mine, theirs = append(mine, r), append(theirs, w)
		}
	}
	s.stdin, s.stdout, s.stderr = mine[0], mine[1], mine[2]
	s.closer = []io.Closer{mine[0], mine[1], mine[2]}
	return theirs, nil
}

// Exec implements executor.Execer: the command runs beside the job, as
// its user, with its environment, directory, namespaces and cgroup (a
// sandboxed job's init starts it), or as the agent's user with the job's
// environment when the executor has no sandbox.
func (h *handle) Exec(ctx context.Context, spec executor.ExecSpec) (executor.Session, error) {
	select {
	case <-h.done:
		return nil, errors.New("the job has ended")
	default:
	}
	if err := executor.CheckCommand(spec.Command); err != nil {
		return nil, err
	}
	s := &procSession{SessionEnd: executor.NewSessionEnd()}
	if h.ctl != nil {
		files, err := sessionFiles(spec, s, h.uid, h.gid)
		if err != nil {
			return nil, err
		}
		err = h.ctl.start(ctx, spec, files, s)
		closeFiles(files)
		if err != nil {
			for _, c := range s.closer {
				c.Close()
			}
			return nil, fmt.Errorf("process executor: %w", err)
		}
		return s, nil
	}
	if h.status != nil {
		return nil, errors.New("process executor: this job was started without a control socket; it opens no sessions")
	}
	return h.execPlain(spec, s)
}

// execPlain runs a session as the agent's user (no sandbox).
func (h *handle) execPlain(spec executor.ExecSpec, s *procSession) (executor.Session, error) {
	argv := spec.Command
	if len(argv) == 0 {
		argv = []string{defaultShell()}
	}
	files, err := sessionFiles(spec, s, -1, -1)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = append([]string{}, h.env...), h.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if spec.TTY {
		term := spec.Term
		if term == "" {
			term = "xterm-256color"
		}
		cmd.Env = setEnv(cmd.Env, "TERM", term)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[0], files[0]
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	} else {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	}
	err = cmd.Start()
	closeFiles(files)
	if err != nil {
		for _, c := range s.closer {
			c.Close()
		}
		return nil, fmt.Errorf("process executor: starting %s: %w", argv[0], err)
	}
	pid := cmd.Process.Pid
	s.signal = func(sig syscall.Signal) error { return syscall.Kill(-pid, sig) }
	go func() {
		_ = cmd.Wait()
		ex := executor.Exit{Code: cmd.ProcessState.ExitCode(), Reason: "exited", Finished: time.Now()}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			ex.Signal = ws.Signal().String()
			ex.Code = 128 + int(ws.Signal())
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		s.finish(ex)
	}()
	go func() { // the job's end ends its sessions
		select {
		case <-h.done:
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		case <-s.Done():
		}
	}()
	return s, nil
}
