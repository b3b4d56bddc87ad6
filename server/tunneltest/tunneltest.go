// Package tunneltest is a job for tests of kiln's tunnels: a TCP echo and
// an HTTP server (a plain page, the request's headers at /headers, a
// WebSocket echo at /ws and a server-sent event stream), run by a
// test binary that a kiln job starts.
package tunneltest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/net/websocket"
)

// Env names the ports, "ECHO,HTTP", of a test binary started as the job.
const Env = "KILN_TEST_PORT_SERVER"

// Page is what GET /hello answers, with the path after it.
const Page = "hello from the job, path "

// Events are the data lines GET /events sends, in order.
var Events = []string{"event 0", "event 1", "event 2"}

// Wanted reports whether this process was started as the job.
func Wanted() bool { return os.Getenv(Env) != "" }

// Serve runs the job on the ports Env names until the process is stopped.
func Serve() error {
	echoPort, httpPort, ok := strings.Cut(os.Getenv(Env), ",")
	if !ok {
		return fmt.Errorf("%s=%q: want ECHO,HTTP ports", Env, os.Getenv(Env))
	}
	echo, err := net.Listen("tcp", "127.0.0.1:"+echoPort)
	if err != nil {
		return err
	}
	go Echo(echo)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s%s\n", Page, r.URL.Path)
	})
	// A job's page setting a cookie of its own and one of kiln's names
	// (the web page's session), as a tenant's page may try.
	mux.HandleFunc("/cookies", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "kiln_ui_session", Value: "planted", Path: "/ui/"})
		http.SetCookie(w, &http.Cookie{Name: "app_session", Value: "kept", Path: "/"})
		fmt.Fprintln(w, "cookies set")
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		_ = r.Header.Write(w)
	})
	// The connection a request came on (the agent's end of it).
	mux.HandleFunc("/peer", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, r.RemoteAddr)
	})
	mux.Handle("/ws", websocket.Handler(func(c *websocket.Conn) { _, _ = io.Copy(c, c) }))
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range Events {
			fmt.Fprintf(w, "data: %s\n\n", e)
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
		}
	})
	srv := &http.Server{Addr: "127.0.0.1:" + httpPort, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.ListenAndServe()
}

// Echo sends back what each connection l accepts sends, until l is
// closed.
func Echo(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
	}
}

// FreePorts returns n TCP ports free on loopback now.
func FreePorts(n int) ([]int, error) {
	var out []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
		defer ln.Close()
	}
	return out, nil
}

// CheckEcho sends size random bytes through an echo connection while
// reading them back, and says whether what came back is what was sent
// (compared by SHA-256).
func CheckEcho(conn io.ReadWriter, size int64) error {
	sent, got := sha256.New(), sha256.New()
	werr := make(chan error, 1)
	go func() {
		_, err := io.CopyN(conn, io.TeeReader(rand.Reader, sent), size)
		werr <- err
	}()
	if n, err := io.CopyN(got, conn, size); err != nil || n != size {
		return fmt.Errorf("echo: read %d of %d bytes: %v", n, size, err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	if !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
		return errors.New("echo: the bytes that came back differ from those sent")
	}
	return nil
}

// ReadEvents reads a server-sent event stream to its end and returns the
// data lines.
func ReadEvents(r io.Reader) []string {
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// WantEvents says whether events are the stream GET /events sends.
func WantEvents(events []string) bool { return strings.Join(events, ",") == strings.Join(Events, ",") }
