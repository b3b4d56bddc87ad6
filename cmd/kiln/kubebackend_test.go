package main

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
)

func TestBackendURL(t *testing.T) {
	const url = "https://gpu-head.lab:7443"
	for _, c := range []struct{ listen, want string }{
		{"0.0.0.0:7443", "https://127.0.0.1:7443"},
		{"[::]:7443", "https://127.0.0.1:7443"},
		{"127.0.0.1:9000", "https://127.0.0.1:9000"},
		{"[::1]:9000", "https://[::1]:9000"},
		{"10.1.2.3:7443", url}, // the certificate may not name this address
	} {
		addr, err := net.ResolveTCPAddr("tcp", c.listen)
		if err != nil {
			t.Fatal(err)
		}
		if got := backendURL(addr, url); got != c.want {
			t.Errorf("listening on %s: backend reaches %s, want %s", c.listen, got, c.want)
		}
	}
}

// The backend gets none of the users' credentials the server's environment
// may hold.
func TestBackendEnvDropsUserCredentials(t *testing.T) {
	got := backendEnv([]string{"PATH=/bin", "KILN_TOKEN=kiln_u_secret", "KILN_CONFIG=/root/c.json", "KILN_JOIN_TOKEN=x", "KUBERNETES_SERVICE_HOST=10.0.0.1", "KILN_TOKENS=keep"})
	want := []string{"PATH=/bin", "KUBERNETES_SERVICE_HOST=10.0.0.1", "KILN_TOKENS=keep"}
	if !slices.Equal(got, want) {
		t.Errorf("backend environment %v, want %v", got, want)
	}
}

type fakeTokens struct {
	n    int
	fail bool
}

func (f *fakeTokens) CreateJoinToken(ctx context.Context, ttl time.Duration, uses int, by string) (api.JoinToken, error) {
	if f.fail {
		return api.JoinToken{}, errors.New("store closed")
	}
	f.n++
	return api.JoinToken{Secret: "kiln_join_" + strings.Repeat("x", f.n)}, nil
}

func (f *fakeTokens) CAFingerprint() string { return "ab" }

// The token file is replaced whole, readable by the server's user alone,
// and a failure leaves the last token in place.
func TestBackendTokenFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "join-token")
	src := &fakeTokens{}
	b := &kubeBackend{srv: src}
	for i := 1; i <= 2; i++ {
		if err := b.writeToken(context.Background(), path); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != "kiln_join_"+strings.Repeat("x", i)+"\n" {
			t.Fatalf("token file %q %v", got, err)
		}
		if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
			t.Errorf("token file mode %v, want 0600", st.Mode().Perm())
		}
	}
	src.fail = true
	if err := b.writeToken(context.Background(), path); err == nil {
		t.Fatal("a token the server could not make was written")
	}
	if got, _ := os.ReadFile(path); string(got) != "kiln_join_xx\n" {
		t.Errorf("after a failure the file holds %q, want the last token", got)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".join-token-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
