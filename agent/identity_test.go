package agent_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/server"
)

// testServer runs a server on loopback for the test.
func testServer(t *testing.T) (*server.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	srv, err := server.New(context.Background(), server.Config{DataDir: t.TempDir(), URL: url, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	return srv, url
}

// TestIdentityPrivate: the identity is written private, and made private
// again when it was widened since.
func TestIdentityPrivate(t *testing.T) {
	srv, url := testServer(t)
	jt, err := srv.CreateJoinToken(context.Background(), time.Hour, 1, "a test")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "agent")
	if _, err := agent.Join(context.Background(), url, jt.Secret, srv.CAFingerprint(), "n1", dir); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for name, want := range map[string]os.FileMode{"": 0o700, "key.pem": 0o600, "cert.pem": 0o600, "agent.json": 0o600} {
			st, err := os.Stat(filepath.Join(dir, name))
			if err != nil || st.Mode().Perm() != want {
				t.Errorf("%s: %q: %v, mode %v, want %v", when, name, err, st.Mode().Perm(), want)
			}
		}
	}
	check("after join")
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Join(dir, "key.pem"), 0o644)
	if _, err := agent.LoadIdentity(dir); err != nil {
		t.Fatal(err)
	}
	check("loaded after the modes were widened")
}
