package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"

	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/textsafe"
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
	if err := executor.CheckCommand(argv); err != nil {
		return nil, err
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

	s := &podSession{tty: spec.TTY, SessionEnd: executor.NewSessionEnd(), sizes: make(chan remotecommand.TerminalSize, 4)}
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
		s.Finish(x)
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
	*executor.SessionEnd
	stdinOnce sync.Once
}

// Next implements remotecommand.TerminalSizeQueue: the sizes asked, until
// the session ends.
func (s *podSession) Next() *remotecommand.TerminalSize {
	select {
	case sz := <-s.sizes:
		return &sz
	case <-s.Done():
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
	case <-s.Done():
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
	if s.Ended() {
		return nil
	}
	if s.tty && sig == syscall.SIGINT {
		_, err := s.stdinW.Write([]byte{3})
		return err
	}
	return fmt.Errorf("a session in a Pod takes no signal %s: the Kubernetes API sends none (on a terminal, Ctrl-C reaches the command)", name)
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

// DialPort connects to port of the job's Pod through the Kubernetes API,
// as kubectl port-forward does (pods/portforward over SPDY): one
// connection of the API per connection to the port, nothing opened on the
// node. It satisfies the agent's PortDialer.
func (h *handle) DialPort(ctx context.Context, port int) (net.Conn, error) {
	select {
	case <-h.done:
		return nil, errors.New("the job has ended")
	default:
	}
	if h.e.Config == nil {
		return nil, errors.New("kubernetes executor: no REST configuration to reach pods/portforward with")
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: want 1 to 65535", port)
	}
	rt, upgrader, err := spdy.RoundTripperFor(h.e.Config)
	if err != nil {
		return nil, fmt.Errorf("kubernetes executor: %w", err)
	}
	u := h.e.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(h.ns).Name(h.name).SubResource("portforward").URL()
	type dialed struct {
		c   httpstream.Connection
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		c, _, err := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: rt}, "POST", u).Dial(portForwardProtocol)
		ch <- dialed{c, err}
	}()
	var conn httpstream.Connection
	select {
	case d := <-ch:
		if d.err != nil {
			return nil, fmt.Errorf("port %d of the job's Pod: %w", port, d.err)
		}
		conn = d.c
	case <-ctx.Done():
		go func() {
			if d := <-ch; d.c != nil {
				d.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
	hdr := http.Header{}
	hdr.Set(corev1.StreamType, corev1.StreamTypeError)
	hdr.Set(corev1.PortHeader, strconv.Itoa(port))
	hdr.Set(corev1.PortForwardRequestIDHeader, "0")
	errStream, err := conn.CreateStream(hdr)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("port %d of the job's Pod: %w", port, err)
	}
	errStream.Close() // nothing is sent on it
	hdr.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(hdr)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("port %d of the job's Pod: %w", port, err)
	}
	pc := &podConn{conn: conn, data: data, port: port, failed: make(chan struct{})}
	// The kubelet says on the error stream when it could not connect
	// (nothing listens in the Pod), and says nothing when it could: wait
	// that long for a refusal, so that a port nobody listens on is not
	// taken for open.
	go func() {
		msg, _ := io.ReadAll(io.LimitReader(errStream, 4096))
		if len(msg) > 0 {
			pc.failure.Store(strings.TrimSpace(textsafe.Printable(string(msg))))
			close(pc.failed)
			conn.Close()
		}
	}()
	t := time.NewTimer(portRefusalWait)
	defer t.Stop()
	select {
	case <-pc.failed:
		return nil, pc.err(nil)
	case <-ctx.Done():
		pc.Close()
		return nil, ctx.Err()
	case <-t.C:
	}
	return pc, nil
}

// portRefusalWait is how long a new connection to a Pod's port waits for
// the kubelet to say it could not connect.
const portRefusalWait = 100 * time.Millisecond

// portForwardProtocol is the SPDY subprotocol of pods/portforward.
const portForwardProtocol = "portforward.k8s.io"

// podConn is one connection to a Pod's port over pods/portforward.
type podConn struct {
	conn    httpstream.Connection
	data    httpstream.Stream
	port    int
	failed  chan struct{}
	failure atomic.Value // string
	once    sync.Once
}

func (c *podConn) err(err error) error {
	select {
	case <-c.failed:
		return fmt.Errorf("port %d of the job's Pod: %s", c.port, c.failure.Load())
	default:
		return err
	}
}

func (c *podConn) Read(p []byte) (int, error) {
	n, err := c.data.Read(p)
	if err != nil && err != io.EOF {
		err = c.err(err)
	}
	return n, err
}

func (c *podConn) Write(p []byte) (int, error) {
	n, err := c.data.Write(p)
	if err != nil {
		err = c.err(err)
	}
	return n, err
}

// CloseWrite ends what is sent to the port; what it answers still comes.
func (c *podConn) CloseWrite() error { return c.data.Close() }

func (c *podConn) Close() error {
	c.once.Do(func() {
		_ = c.data.Reset()
		_ = c.conn.Close()
	})
	return nil
}

func (c *podConn) LocalAddr() net.Addr                { return podAddr("kiln agent") }
func (c *podConn) RemoteAddr() net.Addr               { return podAddr("pod port " + strconv.Itoa(c.port)) }
func (c *podConn) SetDeadline(t time.Time) error      { return nil }
func (c *podConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *podConn) SetWriteDeadline(t time.Time) error { return nil }

// podAddr names the ends of a podConn.
type podAddr string

func (a podAddr) Network() string { return "pods/portforward" }
func (a podAddr) String() string  { return string(a) }
