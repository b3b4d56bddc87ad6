package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"kiln.dev/kiln/executor"
)

var _ executor.Execer = (*handle)(nil)

// jobContainer is the name of a job Pod's container.
const jobContainer = "job"

// Exec implements executor.Execer through the Kubernetes API, as kubectl
// exec does (pods/exec: WebSocket, or SPDY from an older apiserver): the
// command runs in the job's container, with its user, environment and
// isolation, on a terminal the container runtime makes when spec.TTY.
func (h *handle) Exec(ctx context.Context, spec executor.ExecSpec) (executor.Session, error) {
	select {
	case <-h.done:
		return nil, errors.New("the job has ended")
	default:
	}
	if h.e.Config == nil {
		return nil, errors.New("kubernetes executor: no REST configuration to reach pods/exec with; this agent opens no sessions")
	}
	argv := spec.Command
	for i, a := range argv {
		if a == "" && i == 0 || strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("argument %d of the command is empty or holds a NUL byte", i+1)
		}
	}
	if len(argv) == 0 {
		argv = executor.DefaultSessionShell
	}
	req := h.e.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(h.ns).Name(h.name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: jobContainer, Command: argv, Stdin: true, Stdout: true, Stderr: !spec.TTY, TTY: spec.TTY}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(h.e.Config, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("kubernetes executor: %w", err)
	}
	sp, err := remotecommand.NewSPDYExecutor(h.e.Config, "POST", req.URL())
	if err != nil {
		return nil, fmt.Errorf("kubernetes executor: %w", err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, sp, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes executor: %w", err)
	}

	s := &podSession{tty: spec.TTY, done: make(chan struct{}), sizes: make(chan remotecommand.TerminalSize, 4)}
	var inR *io.PipeReader
	inR, s.stdinW = io.Pipe()
	var outW, errW *io.PipeWriter
	s.stdoutR, outW = io.Pipe()
	opts := remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Tty: spec.TTY}
	if spec.TTY {
		if spec.Rows > 0 && spec.Cols > 0 {
			s.sizes <- remotecommand.TerminalSize{Width: spec.Cols, Height: spec.Rows}
		}
		opts.TerminalSizeQueue = s
	} else {
		s.stderrR, errW = io.Pipe()
		opts.Stderr = errW
	}
	// The session outlives ctx; Close ends it.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	go func() {
		err := ex.StreamWithContext(sctx, opts)
		x := executor.Exit{Code: 0, Reason: "exited", Finished: time.Now()}
		var ce utilexec.CodeExitError
		switch {
		case err == nil:
		case errors.As(err, &ce):
			x.Code = ce.Code
		case sctx.Err() != nil:
			x = executor.Exit{Code: -1, Reason: "closed", Finished: time.Now()}
		default:
			x = executor.Exit{Code: -1, Reason: "the session through the Kubernetes API ended: " + err.Error(), Finished: time.Now()}
		}
		inR.Close()
		outW.Close()
		if errW != nil {
			errW.Close()
		}
		s.once.Do(func() {
			s.exit = x
			close(s.done)
		})
	}()
	return s, nil
}

// podSession is a command run through pods/exec.
type podSession struct {
	tty     bool
	cancel  context.CancelFunc
	stdinW  *io.PipeWriter
	stdoutR *io.PipeReader
	stderrR *io.PipeReader
	sizes   chan remotecommand.TerminalSize

	once      sync.Once
	done      chan struct{}
	exit      executor.Exit
	stdinOnce sync.Once
}

// Next implements remotecommand.TerminalSizeQueue: the sizes asked, until
// the session ends.
func (s *podSession) Next() *remotecommand.TerminalSize {
	select {
	case sz := <-s.sizes:
		return &sz
	case <-s.done:
		return nil
	}
}

func (s *podSession) Stdin() io.WriteCloser { return podStdin{s} }
func (s *podSession) Stdout() io.Reader     { return s.stdoutR }

// Stderr implements executor.Session; nil on a terminal.
func (s *podSession) Stderr() io.Reader {
	if s.stderrR == nil {
		return nil
	}
	return s.stderrR
}

// Resize implements executor.Session.
func (s *podSession) Resize(rows, cols uint16) error {
	if !s.tty {
		return errors.New("the session has no terminal")
	}
	select {
	case s.sizes <- remotecommand.TerminalSize{Width: cols, Height: rows}:
	case <-s.done:
	default: // sizes not taken yet: the newest wins next time
		select {
		case <-s.sizes:
		default:
		}
		s.sizes <- remotecommand.TerminalSize{Width: cols, Height: rows}
	}
	return nil
}

// Signal implements executor.Session. The Kubernetes API sends no signal
// to a command run through pods/exec: on a terminal, INT is typed as
// Ctrl-C (the terminal makes it SIGINT for the foreground group), and the
// rest are refused.
func (s *podSession) Signal(name string) error {
	sig, ok := executor.SignalNamed(name)
	if !ok {
		return fmt.Errorf("signal %q: want one of INT, TERM, HUP, QUIT, KILL", name)
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	if s.tty && sig.String() == "interrupt" {
		_, err := s.stdinW.Write([]byte{3})
		return err
	}
	return fmt.Errorf("a session in a Pod takes no signal %s: the Kubernetes API sends none (on a terminal, Ctrl-C reaches the command)", name)
}

// Wait implements executor.Session.
func (s *podSession) Wait(ctx context.Context) (executor.Exit, error) {
	select {
	case <-s.done:
		return s.exit, nil
	case <-ctx.Done():
		return executor.Exit{}, ctx.Err()
	}
}

// Close implements executor.Session: the stream to the apiserver is cut,
// which ends the command's input and output.
func (s *podSession) Close() error {
	s.cancel()
	s.stdoutR.Close()
	if s.stderrR != nil {
		s.stderrR.Close()
	}
	s.stdinW.Close()
	return nil
}

// podStdin is a session's input; closing it ends the input (on a terminal
// by typing Ctrl-D, which has no end of input of its own).
type podStdin struct{ s *podSession }

func (w podStdin) Write(p []byte) (int, error) { return w.s.stdinW.Write(p) }

func (w podStdin) Close() error {
	var err error
	w.s.stdinOnce.Do(func() {
		if w.s.tty {
			_, err = w.s.stdinW.Write([]byte{4})
			return
		}
		err = w.s.stdinW.Close()
	})
	return err
}
