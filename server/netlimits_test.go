package server_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// rawTLS opens a TLS connection (HTTP/1.1) to the server from the given
// local address ("" for any).
func rawTLS(t testing.TB, url string, caPEM []byte, local string) (*tls.Conn, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	d := &net.Dialer{Timeout: 10 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	return tls.DialWithDialer(d, "tcp", strings.TrimPrefix(url, "https://"), &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}, ServerName: "127.0.0.1"})
}

// TestSlowBodyTimedOut: a request body that never arrives is answered 408
// after the body timeout, on the join route (no credentials) and on an
// authenticated one; it used to hold the handler forever.
func TestSlowBodyTimedOut(t *testing.T) {
	c := newCluster(t, server.Config{BodyTimeout: 300 * time.Millisecond})
	for _, req := range []string{
		"POST /v1/join HTTP/1.1\r\nHost: kiln\r\nContent-Length: 1000\r\n\r\n{\"token\":",
		"POST /v1/leases HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer " + c.srv.Bootstrap.AdminToken + "\r\nContent-Length: 1000\r\n\r\n{\"gpus\":",
	} {
		conn, err := rawTLS(t, c.url, c.srv.CAPEM(), "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		// The cap below is only for the failure: the answer comes after
		// the server's 300 ms.
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Errorf("%q: no answer: %v", req[:30], err)
		} else if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("%.30s...: %s, want 408", req, resp.Status)
		}
		conn.Close()
	}
}

// TestBodyLimitsPerRoute: every route bounds its body; the unauthenticated
// join route takes far less than an agent's snapshot.
func TestBodyLimitsPerRoute(t *testing.T) {
	c := newCluster(t, server.Config{})
	anon, _ := api.NewClient(c.url, "", c.srv.CAPEM(), nil)
	big := strings.NewReader(`{"token":"` + strings.Repeat("a", 100<<10) + `"}`)
	if _, err := anon.Raw(context.Background(), "POST", "/v1/join", big); api.StatusOf(err) != http.StatusRequestEntityTooLarge {
		t.Errorf("100 KiB join request: %v, want 413", err)
	}
	big = strings.NewReader(strings.Repeat(" ", 2<<20))
	if _, err := c.admin.Raw(context.Background(), "DELETE", "/v1/tokens/x", big); api.StatusOf(err) != http.StatusRequestEntityTooLarge {
		t.Errorf("2 MiB body on a route that reads none: %v, want 413", err)
	}
}

// clientFrom is an HTTP client whose connections come from the local
// address given (loopback has all of 127/8) and are never reused.
func clientFrom(caPEM []byte, local string) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	d := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
}

func get(cl *http.Client, url, token string) (int, error) {
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestUnauthRateLimited: requests without valid credentials are limited
// per source address (429 with Retry-After); other addresses and
// authenticated callers are served.
func TestUnauthRateLimited(t *testing.T) {
	c := newCluster(t, server.Config{UnauthRate: 0.01, UnauthBurst: 5})
	tok := c.srv.Bootstrap.AdminToken
	from2, from3 := clientFrom(c.srv.CAPEM(), "127.0.0.2"), clientFrom(c.srv.CAPEM(), "127.0.0.3")
	var limited int
	for i := 0; i < 10; i++ {
		code, err := get(from2, c.url+"/healthz", "")
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited != 5 {
		t.Errorf("%d of 10 /healthz from one address limited, want 5 (the burst is 5)", limited)
	}
	for _, p := range []string{"/healthz", "/v1/whoami"} {
		bad := "kiln_0000_wrong"
		if p == "/healthz" {
			bad = ""
		}
		if code, err := get(from2, c.url+p, bad); err != nil || code != http.StatusTooManyRequests {
			t.Errorf("%s from the limited address: %d %v, want 429", p, code, err)
		}
	}
	req, _ := http.NewRequest("POST", c.url+"/v1/join", strings.NewReader(`{}`))
	if resp, err := from2.Do(req); err != nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("join from the limited address: %v %v, want 429 with Retry-After", resp, err)
	}
	if code, err := get(from3, c.url+"/healthz", ""); err != nil || code != http.StatusOK {
		t.Errorf("/healthz from another address: %d %v, want 200", code, err)
	}
	for i := 0; i < 20; i++ {
		if code, err := get(from2, c.url+"/v1/whoami", tok); err != nil || code != http.StatusOK {
			t.Fatalf("an authenticated request from the limited address: %d %v, want 200", code, err)
		}
	}
}

const heldServerEnv = "KILN_TEST_HELD_SERVER"

// runHeldServer is the server process of TestHeldConnections: it serves
// on loopback and prints its address, admin token and CA, until its
// standard input closes.
func runHeldServer(dir string) error {
	srv, err := server.New(context.Background(), server.Config{DataDir: dir, Logger: quietLogger()})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Serve(ctx, ln)
	b, _ := json.Marshal(map[string]string{"url": "https://" + ln.Addr().String(), "token": srv.Bootstrap.AdminToken, "ca": string(srv.CAPEM())})
	fmt.Println(string(b))
	io.Copy(io.Discard, os.Stdin)
	cancel()
	return nil
}

// TestHeldConnections: a server whose descriptor limit is 256 keeps
// answering /healthz and authenticated requests while two other addresses
// hold open, and keep opening, hundreds of connections that never send a
// whole request (no handshake, a handshake and nothing, half a header).
// Without the bound on unproven connections the descriptors run out and
// the server stops accepting.
func TestHeldConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server process and holds hundreds of connections")
	}
	cmd := exec.Command("sh", "-c", `ulimit -n 256 && exec "$0" -test.run='^$'`, os.Args[0])
	cmd.Env = append(os.Environ(), heldServerEnv+"="+t.TempDir())
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	var info struct{ URL, Token, CA string }
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || json.Unmarshal([]byte(line), &info) != nil {
		t.Fatalf("server process: %q %v", line, err)
	}

	// The attackers: 600 connections from 127.0.0.2 and 127.0.0.3, each
	// opened again as soon as the server closes it, at most 500 a second.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var held, opened atomic.Int64
	pace := time.NewTicker(2 * time.Millisecond)
	defer pace.Stop()
	addr := strings.TrimPrefix(info.URL, "https://")
	for i := 0; i < 600; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.0.%d", 2+i%2))}
			for {
				select {
				case <-stop:
					return
				case <-pace.C:
				}
				conn, err := (&net.Dialer{LocalAddr: local, Timeout: time.Second}).Dial("tcp", addr)
				if err != nil {
					continue
				}
				held.Add(1)
				opened.Add(1)
				switch i % 3 {
				case 1:
					tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
					tc.SetDeadline(time.Now().Add(time.Second))
					tc.Handshake()
					tc.SetDeadline(time.Time{})
				case 2:
					tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
					tc.SetDeadline(time.Now().Add(time.Second))
					if tc.Handshake() == nil {
						io.WriteString(tc, "POST /v1/join HTTP/1.1\r\nHost: kiln\r\nX-Slow: ")
					}
					tc.SetDeadline(time.Time{})
				}
				done := make(chan struct{})
				go func() {
					io.Copy(io.Discard, conn) // until the server closes it
					close(done)
				}()
				select {
				case <-done:
				case <-stop:
				}
				conn.Close()
				held.Add(-1)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	// Wait until the attackers opened more connections than the server has
	// descriptors, then ask, each time on a new connection.
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for opened.Load() < 1000 {
		select {
		case <-pace.C:
		case <-deadline.C:
			t.Fatalf("the attackers opened only %d connections", opened.Load())
		}
	}
	t.Logf("the attackers opened %d connections and hold %d", opened.Load(), held.Load())
	cl := clientFrom([]byte(info.CA), "127.0.0.1")
	for i := 0; i < 5; i++ {
		if code, err := get(cl, info.URL+"/healthz", ""); err != nil || code != http.StatusOK {
			t.Fatalf("/healthz while connections are held: %d %v", code, err)
		}
		if code, err := get(cl, info.URL+"/v1/whoami", info.Token); err != nil || code != http.StatusOK {
			t.Fatalf("an authenticated request while connections are held: %d %v", code, err)
		}
	}
}
