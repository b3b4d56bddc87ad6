package main

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

func quietServer(t *testing.T, data string) *server.Server {
	t.Helper()
	srv, err := server.New(context.Background(), server.Config{DataDir: data, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestResetAdmin: with the admin token lost, kiln server --reset-admin on
// the host makes a new one that works as admin; it refuses while a server
// runs on the data directory.
func TestResetAdmin(t *testing.T) {
	data := t.TempDir()
	srv := quietServer(t, data)
	_, stderr, code := kiln(t, "server", "--data", data, "--reset-admin")
	if code != 3 || !strings.Contains(stderr, "in use") {
		t.Errorf("--reset-admin while the server runs: exit %d, %s", code, stderr)
	}
	srv.Close()

	os.Remove(filepath.Join(data, "admin-client.json")) // the token is lost
	out, stderr, code := kiln(t, "server", "--data", data, "--reset-admin", "--url", "https://127.0.0.1:1")
	if code != 0 {
		t.Fatalf("--reset-admin: exit %d: %s", code, stderr)
	}
	cfg, err := api.LoadClientConfig(filepath.Join(data, "admin-client.json"))
	if err != nil || !strings.Contains(string(out), cfg.Token) {
		t.Fatalf("admin-client.json: %v; output %s", err, out)
	}
	if st, err := os.Stat(filepath.Join(data, "admin-client.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("admin-client.json: %v, mode %v, want 0600", err, st.Mode())
	}

	srv = quietServer(t, data)
	defer srv.Close()
	req := httptest.NewRequest("GET", "/v1/whoami", nil)
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"role":"admin"`) {
		t.Errorf("whoami with the new token: %d %s", rec.Code, rec.Body.String())
	}
}

// TestCLIRefusesNaN: NaN and infinities given to flags are refused before
// anything is sent (a range check alone lets NaN through).
func TestCLIRefusesNaN(t *testing.T) {
	data := t.TempDir()
	srv := quietServer(t, data)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(ca, srv.CAPEM(), 0o600)
	srv.Close()
	conn := []string{"--server", "https://127.0.0.1:1", "--ca", ca, "--token", "kiln_x_y"}
	for _, args := range [][]string{
		{"lease", "--fraction", "NaN"},
		{"lease", "--fraction", "+Inf"},
		{"run", "--fraction", "nan", "--", "true"}, // the connection flags go before --
		{"token", "project", "p", "--weight", "NaN"},
		{"token", "project", "p", "--max-gpus", "Inf"},
	} {
		full := append([]string{args[0]}, conn...)
		full = append(full, args[1:]...)
		_, stderr, code := kiln(t, full...)
		if code != 3 || !strings.Contains(stderr, "want a number") {
			t.Errorf("%v: exit %d, %s", args, code, stderr)
		}
	}
}

// TestBackupRestoreCommands: kiln backup and kiln restore, end to end on
// a data directory.
func TestBackupRestoreCommands(t *testing.T) {
	data := t.TempDir()
	srv := quietServer(t, data)
	fp := srv.CAFingerprint()
	out := filepath.Join(t.TempDir(), "b.tar.gz")
	if _, stderr, code := kiln(t, "backup", out, "--data", data); code != 0 {
		t.Fatalf("kiln backup while the server runs: exit %d: %s", code, stderr)
	}
	if _, stderr, code := kiln(t, "restore", out, "--data", data); code != 3 || !strings.Contains(stderr, "in use") {
		t.Errorf("kiln restore while the server runs: exit %d: %s", code, stderr)
	}
	srv.Close()
	os.Remove(filepath.Join(data, "kiln.db"))
	if _, stderr, code := kiln(t, "server", "--data", data, "--listen", "127.0.0.1:0"); code != 3 || !strings.Contains(stderr, "kiln restore") {
		t.Errorf("kiln server with the store gone: exit %d: %s", code, stderr)
	}
	stdout, stderr, code := kiln(t, "restore", out, "--data", data)
	if code != 0 {
		t.Fatalf("kiln restore: exit %d: %s", code, stderr)
	}
	if !strings.Contains(string(stdout), "replaced-") {
		t.Errorf("kiln restore does not say where the replaced files went: %s", stdout)
	}
	srv = quietServer(t, data)
	defer srv.Close()
	if srv.CAFingerprint() != fp || srv.Bootstrap != nil {
		t.Error("after the restore the server is not the one backed up")
	}
}
