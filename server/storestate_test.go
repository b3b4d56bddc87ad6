package server_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/store"
)

func openServer(t *testing.T, dir string) (*server.Server, error) {
	t.Helper()
	return server.New(context.Background(), server.Config{DataDir: dir, Logger: quietLogger()})
}

// usedDataDir is a data directory a server ran in: users, a project, an
// admin configuration beside it (as kiln server writes it), and enough
// events that the store spans many pages.
func usedDataDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	srv, err := openServer(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	tok := srv.Bootstrap.AdminToken
	for i := 0; i < 40; i++ {
		name := fmt.Sprintf("p%02d-%s", i, strings.Repeat("x", 50))
		call(t, srv, tok, "PUT", "/v1/projects/"+name, api.Project{Name: name, Weight: 1}, nil)
	}
	call(t, srv, tok, "POST", "/v1/tokens", api.TokenRequest{User: "ana", Projects: []string{"p00-" + strings.Repeat("x", 50)}}, nil)
	cfg := &api.ClientConfig{Server: "https://127.0.0.1:7443", Token: tok, CAPEM: string(srv.CAPEM())}
	if err := cfg.Save(filepath.Join(dir, "admin-client.json")); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	return dir
}

// call runs one request through the server's handler, in process.
func call(t *testing.T, srv *server.Server, token, method, path string, in, out any) int {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req := httptest.NewRequest(method, path, body)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	if rec.Code >= 300 {
		t.Fatalf("%s %s: %d %s", method, path, rec.Code, rec.Body.String())
	}
	if out != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			t.Fatal(err)
		}
	}
	return rec.Code
}

// treeState is every file under dir (but the lock file) with its mode and
// the hash of its bytes.
func treeState(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "lock" {
			return nil
		}
		info, _ := d.Info()
		line := fmt.Sprintf("%s %v", rel, info.Mode())
		if !d.IsDir() {
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		lines = append(lines, line)
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestStoreRefusesDamage: a damaged, emptied or half-missing data
// directory makes the server refuse to start, with the reason and the way
// to recover, and changes nothing on disk; before, an empty or missing
// store was taken for a first start (new admin, the admin configuration
// overwritten) and a missing CA key made a new CA.
func TestStoreRefusesDamage(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   []string
	}{
		{"store damaged", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "kiln.db")
			b, _ := os.ReadFile(p)
			for pg := len(b)/4096 - 3; pg < len(b)/4096; pg++ {
				copy(b[pg*4096:], bytes.Repeat([]byte{0xa5}, 12))
			}
			os.WriteFile(p, b, 0o600)
		}, []string{"damaged", "kiln restore", "recover"}},
		{"store emptied to 0 bytes", func(t *testing.T, dir string) {
			os.Truncate(filepath.Join(dir, "kiln.db"), 0)
		}, []string{"empty", "ca.crt", "no first start", "kiln restore"}},
		{"store missing", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "kiln.db"))
		}, []string{"missing", "admin-client.json", "kiln restore"}},
		{"store replaced by a new one", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "kiln.db")
			os.Remove(p)
			st, err := store.Open(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			st.Close()
		}, []string{"holds no user", "emptied", "kiln restore"}},
		{"CA key missing", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "ca.key"))
		}, []string{"ca.key is missing", "never makes a new CA"}},
		{"CA missing", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "ca.key"))
			os.Remove(filepath.Join(dir, "ca.crt"))
		}, []string{"CA", "gone", "lock them all out"}},
		{"CA key of another CA", func(t *testing.T, dir string) {
			other := t.TempDir()
			srv, err := openServer(t, other)
			if err != nil {
				t.Fatal(err)
			}
			srv.Close()
			b, _ := os.ReadFile(filepath.Join(other, "ca.key"))
			os.WriteFile(filepath.Join(dir, "ca.key"), b, 0o600)
		}, []string{"not the key of ca.crt"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := usedDataDir(t)
			c.damage(t, dir)
			before := treeState(t, dir)
			srv, err := openServer(t, dir)
			if err == nil {
				srv.Close()
				t.Fatal("the server started")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q lacks %q", err, w)
				}
			}
			if after := treeState(t, dir); after != before {
				t.Errorf("the refused start changed the data directory:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	// And a directory that holds nothing of a server is a first start.
	for _, dir := range []string{t.TempDir(), filepath.Join(t.TempDir(), "new")} {
		srv, err := openServer(t, dir)
		if err != nil {
			t.Fatalf("first start in %s: %v", dir, err)
		}
		if srv.Bootstrap == nil {
			t.Error("a first start made no admin")
		}
		srv.Close()
	}
}

// TestModesEnforced: the data directory, the store, the CA key, the admin
// configuration and the logs are private, also when they were not.
func TestModesEnforced(t *testing.T) {
	dir := usedDataDir(t)
	os.MkdirAll(filepath.Join(dir, "logs"), 0o755)
	os.WriteFile(filepath.Join(dir, "logs", "j-1.log"), []byte("out"), 0o644)
	for p, m := range map[string]os.FileMode{"": 0o755, "kiln.db": 0o644, "ca.key": 0o644, "admin-client.json": 0o666, "logs": 0o777} {
		os.Chmod(filepath.Join(dir, p), m)
	}
	srv, err := openServer(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for p, want := range map[string]os.FileMode{"": 0o700, "kiln.db": 0o600, "ca.key": 0o600, "admin-client.json": 0o600, "logs": 0o700, "logs/j-1.log": 0o600, "lock": 0o600} {
		st, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
		} else if st.Mode().Perm() != want {
			t.Errorf("%q: mode %v, want %v", p, st.Mode().Perm(), want)
		}
	}
}

// TestBackupRestore: a backup taken while the server runs restores the
// store and the CA as they were; what it replaces is kept aside; a damaged
// backup, one of another server and a restore under a running server are
// refused and change nothing.
func TestBackupRestore(t *testing.T) {
	ctx := context.Background()
	dir := usedDataDir(t)
	srv, err := openServer(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	fp := srv.CAFingerprint()
	var cfg api.ClientConfig
	b, _ := os.ReadFile(filepath.Join(dir, "admin-client.json"))
	json.Unmarshal(b, &cfg)
	backup := filepath.Join(t.TempDir(), "kiln-backup.tar.gz")
	if err := server.Backup(ctx, dir, backup); err != nil {
		t.Fatalf("backup while the server runs: %v", err)
	}
	if st, err := os.Stat(backup); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v %v, want mode 0600", err, st.Mode())
	}
	call(t, srv, cfg.Token, "POST", "/v1/tokens", api.TokenRequest{User: "late"}, nil)
	if _, err := server.Restore(ctx, dir, backup); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("restore under a running server: %v, want refused", err)
	}
	srv.Close()

	// Refused backups change nothing.
	damaged := filepath.Join(t.TempDir(), "damaged.tar.gz")
	os.WriteFile(damaged, []byte("not a backup"), 0o600)
	other := t.TempDir()
	if s, err := openServer(t, other); err == nil {
		s.Close()
	}
	otherBackup := filepath.Join(t.TempDir(), "other.tar.gz")
	if err := server.Backup(ctx, other, otherBackup); err != nil {
		t.Fatal(err)
	}
	before := treeState(t, dir)
	for name, in := range map[string]string{"damaged": damaged, "another server's": otherBackup} {
		if _, err := server.Restore(ctx, dir, in); err == nil {
			t.Errorf("restoring a %s backup: accepted", name)
		}
		if after := treeState(t, dir); after != before {
			t.Errorf("the refused %s restore changed the data directory", name)
		}
	}

	moved, err := server.Restore(ctx, dir, backup)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(moved, "kiln.db")); err != nil {
		t.Errorf("the replaced store was not kept: %v", err)
	}
	srv, err = openServer(t, dir)
	if err != nil {
		t.Fatalf("start after restore: %v", err)
	}
	defer srv.Close()
	if srv.CAFingerprint() != fp {
		t.Error("the restore changed the CA")
	}
	var users struct{ Users []api.User }
	call(t, srv, cfg.Token, "GET", "/v1/users", nil, &users)
	var names []string
	for _, u := range users.Users {
		names = append(names, u.Name)
	}
	if got := strings.Join(names, ","); got != "admin,ana" {
		t.Errorf("users after restore: %s, want admin,ana (late came after the backup)", got)
	}
}
