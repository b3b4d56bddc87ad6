package containerd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"kiln.dev/kiln/executor"
)

// Session limits.
const (
	sessionCallWait = 10 * time.Second // one call to containerd for a session
	sessionDrain    = 2 * time.Second  // for its output to drain after it ended
)

var _ executor.Execer = (*handle)(nil)

// Exec implements executor.Execer: the command runs in the job's
// container as another process of its task (what `ctr task exec` does),
// with the job's process spec (its user, environment, directory,
// capabilities, limits), in its namespaces and cgroup; on a terminal the
// shim makes when spec.TTY.
func (h *handle) Exec(ctx context.Context, spec executor.ExecSpec) (executor.Session, error) {
	select {
	case <-h.done:
		return nil, errors.New("the job has ended")
	default:
	}
	if h.ctr == nil {
		return nil, errors.New("containerd executor: this job was not started by this agent; it opens no sessions")
	}
	argv := spec.Command
	if err := executor.CheckCommand(argv); err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		argv = executor.DefaultSessionShell
	}
	ctx, cancel := context.WithTimeout(ctx, sessionCallWait)
	defer cancel()
	cs, err := h.ctr.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("job %s: reading its container's spec: %w", h.id, err)
	}
	if cs.Process == nil {
		return nil, fmt.Errorf("job %s: its container's spec has no process", h.id)
	}
	ps := *cs.Process
	ps.Args = slices.Clone(argv)
	ps.Env = slices.Clone(ps.Env)
	ps.Terminal = spec.TTY
	ps.ConsoleSize = nil
	if spec.TTY {
		term := spec.Term
		if term == "" {
			term = "xterm-256color"
		}
		ps.Env = setEnv(ps.Env, "TERM", term)
		if spec.Rows > 0 && spec.Cols > 0 {
			ps.ConsoleSize = &specs.Box{Height: uint(spec.Rows), Width: uint(spec.Cols)}
		}
	}

	id, err := sessionID()
	if err != nil {
		return nil, err
	}
	s := &ctrSession{tty: spec.TTY, SessionEnd: executor.NewSessionEnd()}
	var inR *io.PipeReader
	inR, s.stdinW = io.Pipe()
	var outW, errW *io.PipeWriter
	s.stdoutR, outW = io.Pipe()
	opts := []cio.Opt{cio.WithFIFODir(filepath.Join(h.fifoDir, "sessions"))}
	if spec.TTY {
		opts = append(opts, cio.WithStreams(inR, outW, nil), cio.WithTerminal)
	} else {
		s.stderrR, errW = io.Pipe()
		opts = append(opts, cio.WithStreams(inR, outW, errW))
	}
	// The session outlives ctx: its calls use a context that keeps the
	// namespace but not the caller's deadline.
	bg := context.WithoutCancel(ctx)
	p, err := h.task.Exec(ctx, id, &ps, cio.NewCreator(opts...))
	if err != nil {
		inR.Close()
		return nil, fmt.Errorf("job %s: a session in its container: %w", h.id, err)
	}
	exitCh, err := p.Wait(bg)
	if err == nil {
		err = p.Start(ctx)
	}
	if err != nil {
		inR.Close()
		dctx, dcancel := context.WithTimeout(bg, sessionCallWait)
		_, _ = p.Delete(dctx, client.WithProcessKill)
		dcancel()
		return nil, fmt.Errorf("job %s: starting %q in its container: %w", h.id, argv[0], err)
	}
	s.proc, s.bg = p, bg
	s.stdin = &ctrStdin{s: s}
	go s.watch(exitCh, inR, outW, errW)
	return s, nil
}

// ctrSession is a process of a job's container task.
type ctrSession struct {
	tty     bool
	proc    client.Process
	bg      context.Context
	stdin   *ctrStdin
	stdinW  *io.PipeWriter
	stdoutR *io.PipeReader
	stderrR *io.PipeReader
	*executor.SessionEnd
}

// watch waits for the process to end, lets its output drain, closes the
// session's readers and removes the process from the task.
func (s *ctrSession) watch(exitCh <-chan client.ExitStatus, inR *io.PipeReader, outW, errW *io.PipeWriter) {
	st := <-exitCh
	code, at, err := st.Result()
	ex := executor.Exit{Code: int(code), Finished: at, Reason: "exited"}
	if err != nil {
		ex = executor.Exit{Code: -1, Reason: "ended without an exit status: " + err.Error()}
	}
	if at.IsZero() {
		ex.Finished = time.Now()
	}
	ex.Signal = signalOf(code)
	// Output still in the FIFOs arrives; a process the session left
	// behind that holds them open does not keep it waiting.
	drained := make(chan struct{})
	go func() { s.proc.IO().Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(sessionDrain):
	}
	ctx, cancel := context.WithTimeout(s.bg, sessionCallWait)
	if _, err := s.proc.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		ex.Reason += " (removing it: " + err.Error() + ")"
	}
	cancel()
	inR.Close()
	outW.Close()
	if errW != nil {
		errW.Close()
	}
	s.Finish(ex)
}

func (s *ctrSession) Stdin() io.WriteCloser { return s.stdin }
func (s *ctrSession) Stdout() io.Reader     { return s.stdoutR }

// Stderr implements executor.Session; nil on a terminal.
func (s *ctrSession) Stderr() io.Reader {
	if s.stderrR == nil {
		return nil
	}
	return s.stderrR
}

// Resize implements executor.Session.
func (s *ctrSession) Resize(rows, cols uint16) error {
	if !s.tty {
		return errors.New("the session has no terminal")
	}
	ctx, cancel := context.WithTimeout(s.bg, sessionCallWait)
	defer cancel()
	return s.proc.Resize(ctx, uint32(cols), uint32(rows))
}

// Signal implements executor.Session. The signal goes to the session's
// process (on a terminal, Ctrl-C reaches its foreground group through the
// terminal itself, as a byte of its input).
func (s *ctrSession) Signal(name string) error {
	sig, ok := executor.SignalNamed(name)
	if !ok {
		return fmt.Errorf("signal %q: want one of INT, TERM, HUP, QUIT, KILL", name)
	}
	if s.Ended() {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.bg, sessionCallWait)
	defer cancel()
	if err := s.proc.Kill(ctx, sig); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("signal %s: %w", name, err)
	}
	return nil
}

// Close implements executor.Session: a process still running is killed,
// and the session's readers end.
func (s *ctrSession) Close() error {
	if !s.Ended() {
		ctx, cancel := context.WithTimeout(s.bg, sessionCallWait)
		_ = s.proc.Kill(ctx, syscall.SIGKILL)
		cancel()
	}
	// Nobody reads any more: the copies into these pipes must not block.
	s.stdoutR.Close()
	if s.stderrR != nil {
		s.stderrR.Close()
	}
	s.stdinW.Close()
	return nil
}

// ctrStdin is a session's input. Closing it ends the input: on a
// terminal by typing Ctrl-D (a terminal has no end of input of its own),
// otherwise by closing the process's stdin in the shim.
type ctrStdin struct {
	s    *ctrSession
	once sync.Once
}

func (w *ctrStdin) Write(p []byte) (int, error) { return w.s.stdinW.Write(p) }

func (w *ctrStdin) Close() error {
	var err error
	w.once.Do(func() {
		if w.s.tty {
			_, err = w.s.stdinW.Write([]byte{4})
			return
		}
		w.s.stdinW.Close()
		ctx, cancel := context.WithTimeout(w.s.bg, sessionCallWait)
		defer cancel()
		if e := w.s.proc.CloseIO(ctx, client.WithStdinCloser); e != nil && !errdefs.IsNotFound(e) {
			err = fmt.Errorf("closing the session's input: %w", e)
		}
	})
	return err
}

// sessionID names a session's process in its task.
func sessionID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("a session id: %w", err)
	}
	return "kiln-session-" + hex.EncodeToString(b[:]), nil
}

// setEnv sets key in env (KEY=value pairs), replacing an earlier value.
func setEnv(env []string, key, value string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}
