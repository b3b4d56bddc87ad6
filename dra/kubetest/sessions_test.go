package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server/tunneltest"
)

// standInKubelet answers what the apiserver asks a node's kubelet for
// pods/exec (/exec/NAMESPACE/POD/CONTAINER), pods/portforward and pods/log,
// with the kubelet's own
// streaming server (k8s.io/cri-streaming). There is no kubelet nor
// container runtime in these tests: the command runs on this machine, as
// the test's user, in place of the Pod's container.
func standInKubelet(t *testing.T) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/exec/", func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/exec/"), "/")
		if len(parts) != 3 {
			http.Error(w, "want /exec/NAMESPACE/POD/CONTAINER", http.StatusNotFound)
			return
		}
		opts, err := remotecommand.NewOptions(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		t.Logf("stand-in kubelet: exec in %s/%s container %s: %q (tty %v)", parts[0], parts[1], parts[2], r.URL.Query()["command"], opts.TTY)
		remotecommand.ServeExec(w, r, hostExec{}, parts[1], "", parts[2], r.URL.Query()["command"], opts,
			time.Minute, 30*time.Second, remotecommand.SupportedStreamingProtocols)
	})
	// A container's log, as the kubelet reads it from the runtime: two
	// lines that name the Pod, then its end.
	mux.HandleFunc("/containerLogs/", func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/containerLogs/"), "/")
		if len(parts) != 3 {
			http.Error(w, "want /containerLogs/NAMESPACE/POD/CONTAINER", http.StatusNotFound)
			return
		}
		t.Logf("stand-in kubelet: log of %s/%s (%s)", parts[0], parts[1], r.URL.RawQuery)
		fmt.Fprintf(w, "log of %s/%s container %s\nsecond line\n", parts[0], parts[1], parts[2])
	})
	mux.HandleFunc("/portForward/", func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/portForward/"), "/")
		if len(parts) != 2 {
			http.Error(w, "want /portForward/NAMESPACE/POD", http.StatusNotFound)
			return
		}
		t.Logf("stand-in kubelet: port-forward to %s/%s", parts[0], parts[1])
		portforward.ServePortForward(w, r, hostPorts{}, parts[1], "", &portforward.V4Options{}, time.Minute, 30*time.Second, portforward.SupportedProtocols)
	})
	return mux
}

// hostPorts connects to a port of this machine's loopback in place of the
// Pod's.
type hostPorts struct{}

func (hostPorts) PortForward(ctx context.Context, _, _ string, port int32, stream io.ReadWriteCloser) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return err
	}
	defer c.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, stream)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		close(done)
	}()
	_, _ = io.Copy(stream, c)
	<-done
	return nil
}

// useStandInKubelet serves standInKubelet over TLS on loopback and points
// the nodes' status at it (their only address 127.0.0.1, the kubelet's
// port), as a kubelet would report itself; it stops with the test.
func useStandInKubelet(t *testing.T, ctx context.Context, nodes ...string) {
	t.Helper()
	addr, _, stop := serveWebhook(t, standInKubelet(t))
	t.Cleanup(stop)
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	for _, name := range nodes {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Only an address the apiserver can dial (it prefers a host name).
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}}
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
		if _, err := cp.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// hostExec runs a command on this machine in place of a container.
type hostExec struct{}

func (hostExec) ExecInContainer(ctx context.Context, _, _, _ string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) == 0 {
		return errors.New("no command")
	}
	c := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	if tty {
		f, err := pty.Start(c)
		if err != nil {
			return err
		}
		// The sizes are set until the command ends, and the terminal is
		// closed only after the last (Setsize reads its descriptor).
		stop := make(chan struct{})
		var sizing sync.WaitGroup
		sizing.Add(1)
		go func() {
			defer sizing.Done()
			for {
				select {
				case sz, ok := <-resize:
					if !ok {
						return
					}
					_ = pty.Setsize(f, &pty.Winsize{Rows: sz.Height, Cols: sz.Width})
				case <-stop:
					return
				}
			}
		}()
		defer func() {
			close(stop)
			sizing.Wait()
			f.Close()
		}()
		if in != nil {
			go func() { _, _ = io.Copy(f, in) }()
		}
		_, _ = io.Copy(out, f) // ends (EIO) once the command and its children closed the terminal
	} else {
		if in != nil {
			w, err := c.StdinPipe()
			if err != nil {
				return err
			}
			go func() { _, _ = io.Copy(w, in); w.Close() }()
		}
		c.Stdout, c.Stderr = out, errOut
		if err := c.Start(); err != nil {
			return err
		}
	}
	err := c.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return utilexec.CodeExitError{Err: err, Code: ee.ExitCode()}
	}
	return err
}

// syncBuffer is output read while it is written.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, b *syncBuffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(b.String(), want); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the session's output: %q", want, b.String())
		}
	}
}

// TestKilnReachesPodJobs opens kiln sessions beside a job that runs as a
// Pod, through kiln's server and agent and the real apiserver's pods/exec:
// a command with its input, output, error output and exit code, and one on
// a terminal of the size asked, resized; and it reaches the Pod's ports
// through pods/portforward: the port states (one listens, one does not), a
// megabyte each way checked by hash, a refusal; and the job's log is the
// Pod's, read through pods/log. The apiserver reaches
// the node's kubelet at the address and port the node's status gives; a
// stand-in kubelet on loopback answers there (see standInKubelet).
func TestKilnReachesPodJobs(t *testing.T) {
	setup(t)
	if testing.Short() {
		t.Skip("builds kiln and starts its server")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodes := []string{"pcie-l40s-pairs", "rtx4090x8-mixed-load"}
	useStandInKubelet(t, ctx, nodes...)
	admin := kilnOnKube(t, ctx, nodes)
	// What the Pod listens on: an echo on this machine's loopback (the
	// stand-in kubelet forwards there), and a port nothing listens on.
	ports, err := tunneltest.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	echoPort, silentPort := ports[0], ports[1]
	echo, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(echoPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go tunneltest.Echo(echo)
	l, err := admin.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: &api.JobSpec{Image: "registry.local/serve:1", Ports: []int{echoPort, silentPort}}})
	if err != nil {
		t.Fatal(err)
	}
	l = waitLease(t, admin, l.ID, func(l *api.Lease) bool { return l.State == api.LeaseGranted && len(l.Jobs) == 1 })
	defer func() { _, _ = admin.CancelLease(context.Background(), l.ID) }()
	pod, _ := waitPodBound(t, admin, l.Jobs[0], "kiln-default", "kiln-"+l.Jobs[0])
	// The kubelet's part: the container runs.
	pod.Status.Phase = v1.PodRunning
	pod.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "job", Ready: true, State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	if _, err := cp.Client.CoreV1().Pods("kiln-default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	open := func(req api.SessionRequest) (*api.Stream, *api.FrameWriter) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			st, fw, err := admin.OpenSession(ctx, l.ID, "", 0, req)
			if err == nil {
				return st, fw
			}
			if time.Now().After(deadline) {
				t.Fatalf("opening a session in the job's Pod: %v", err)
			}
		}
	}
	// Pipes: input, output and error output apart, the exit code.
	st, fw := open(api.SessionRequest{Command: []string{"sh", "-c", "read line; echo got $line; echo oops >&2; exit 7"}})
	var out, errOut syncBuffer
	x, err := api.RunSession(ctx, st, fw, api.SessionIO{Stdin: strings.NewReader("hello\n"), Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	if x.Code != 7 || out.String() != "got hello\n" || errOut.String() != "oops\n" {
		t.Errorf("a session in a Pod: exit %+v, stdout %q, stderr %q; want 7, \"got hello\", \"oops\"", x, out.String(), errOut.String())
	}

	// A terminal of the size asked, then resized. The Kubernetes API has
	// no initial size for exec: the size travels on its own stream, and a
	// command that asks at once can run before it arrives (as with kubectl
	// exec -t), so the command reads a line first.
	st, fw = open(api.SessionRequest{Command: []string{"sh", "-c", "read w; stty size; read x; stty size; exit 4"}, TTY: true, Rows: 30, Cols: 100})
	inR, inW := io.Pipe()
	resize := make(chan [2]uint16, 1)
	var term syncBuffer
	done := make(chan api.SessionExit, 1)
	go func() {
		x, err := api.RunSession(ctx, st, fw, api.SessionIO{Stdin: inR, Stdout: &term, Resize: resize})
		if err != nil {
			t.Error(err)
		}
		done <- x
	}()
	time.Sleep(300 * time.Millisecond) // the size travels apart from the input
	if _, err := inW.Write([]byte("size\r")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &term, "30 100")
	resize <- [2]uint16{40, 120}
	time.Sleep(300 * time.Millisecond) // the size travels apart from the input
	if _, err := inW.Write([]byte("go\r")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &term, "40 120")
	select {
	case x := <-done:
		if x.Code != 4 {
			t.Errorf("a terminal session in a Pod exited %+v, want code 4", x)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the terminal session did not end: %q", term.String())
	}
	inW.Close()

	// The Pod's ports: their states, then the echo through kiln forward's
	// path, and a refusal for the port nothing listens on.
	began := time.Now()
	want := fmt.Sprintf("%d:open %d:waiting", echoPort, silentPort)
	waitLease(t, admin, l.ID, func(l *api.Lease) bool {
		var got []string
		for _, p := range l.Ports {
			got = append(got, fmt.Sprintf("%d:%s", p.Port, p.State))
		}
		return strings.Join(got, " ") == want
	})
	t.Logf("port states %s after %s", want, time.Since(began).Round(time.Millisecond))
	fwd, err := admin.ConnectPort(ctx, l.ID, echoPort, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	if err := tunneltest.CheckEcho(fwd, 1<<20); err != nil {
		t.Errorf("a megabyte through pods/portforward: %v", err)
	}
	t.Logf("a megabyte each way in %s", time.Since(began).Round(time.Millisecond))
	fwd.Close()
	if s, err := admin.ConnectPort(ctx, l.ID, silentPort, "", 0); err == nil || api.StatusOf(err) != http.StatusBadGateway {
		if s != nil {
			s.Close()
		}
		t.Errorf("a Pod port nothing listens on: %v, want 502", err)
	} else {
		t.Logf("refused: %v", err)
	}

	// The Pod's log is the job's (kiln logs), read through pods/log.
	if pod, err = cp.Client.CoreV1().Pods("kiln-default").Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = v1.PodSucceeded
	pod.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "job", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}}
	if _, err := cp.Client.CoreV1().Pods("kiln-default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLease(t, admin, l.ID, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })
	rc, err := admin.JobLogs(ctx, l.Jobs[0], false)
	if err != nil {
		t.Fatal(err)
	}
	logText, _ := io.ReadAll(rc)
	rc.Close()
	if want := "log of kiln-default/kiln-" + l.Jobs[0] + " container job\nsecond line\n"; string(logText) != want {
		t.Errorf("kiln logs of a Pod job: %q, want %q", logText, want)
	}
}
