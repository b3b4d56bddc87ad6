package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/api"
)

// filled makes a closed database with some rows, several pages long.
func filled(t *testing.T, path string) {
	t.Helper()
	s := open(t, path)
	err := s.Update(context.Background(), func(tx *Tx) error {
		for i := 0; i < 300; i++ {
			if err := tx.AddEvent(api.Event{Kind: "test", Subject: fmt.Sprint(i), Message: string(bytes.Repeat([]byte("m"), 200))}); err != nil {
				return err
			}
		}
		return tx.PutUser(api.User{ID: "u1", Name: "ana", Role: api.RoleAdmin, Created: time.Now()})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// dirState is every file of a directory with its bytes.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

// TestOpenRefusesDamage: a damaged file, or one that is no database, is
// refused by the integrity check with ErrDamaged and left as it was.
func TestOpenRefusesDamage(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"page headers overwritten": func(b []byte) []byte {
			// Pages 2 to 5 (the first holds the file header): their
			// b-tree page headers.
			for p := 1; p < 5; p++ {
				copy(b[p*4096:], bytes.Repeat([]byte{0xa5}, 12))
			}
			return b
		},
		"data pages overwritten": func(b []byte) []byte {
			// The last pages hold events: nothing reads them at start.
			for p := len(b)/4096 - 4; p < len(b)/4096; p++ {
				copy(b[p*4096:], bytes.Repeat([]byte{0xa5}, 12))
			}
			return b
		},
		"not a database": func(b []byte) []byte { return bytes.Repeat([]byte("kiln"), 4096) },
		"cut short":      func(b []byte) []byte { return b[:len(b)/3] },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "kiln.db")
			filled(t, path)
			b, _ := os.ReadFile(path)
			if err := os.WriteFile(path, damage(b), 0o600); err != nil {
				t.Fatal(err)
			}
			before := dirState(t, dir)
			s, err := Open(context.Background(), path)
			if err == nil {
				s.Close()
				t.Fatal("a damaged database was opened")
			}
			if !errors.Is(err, ErrDamaged) {
				t.Errorf("error %v, want ErrDamaged", err)
			}
			if err := Check(context.Background(), path); !errors.Is(err, ErrDamaged) {
				t.Errorf("Check: %v, want ErrDamaged", err)
			}
			after := dirState(t, dir)
			if fmt.Sprint(before) != fmt.Sprint(after) {
				t.Errorf("opening the damaged database changed the directory: %d files before, %d after", len(before), len(after))
			}
		})
	}
}

// TestOpenModes: a new database is 0600, and an existing one with a wider
// mode is made 0600.
func TestOpenModes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kiln.db")
	s := open(t, path)
	for _, p := range dataFiles(path) {
		if st, err := os.Stat(p); err == nil && st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, st.Mode().Perm())
		}
	}
	s.Close()
	os.Chmod(path, 0o644)
	s = open(t, path)
	s.Close()
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("existing database: mode %v, want 0600", st.Mode().Perm())
	}
	if _, err := OpenExisting(context.Background(), filepath.Join(t.TempDir(), "none.db")); !errors.Is(err, ErrNoStore) {
		t.Errorf("OpenExisting of a missing file: %v, want ErrNoStore", err)
	}
}

// TestBackupWhileWriting: a backup taken while a writer goes on is a
// consistent database that passes the check and holds every row
// committed before it began.
func TestBackupWhileWriting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kiln.db")
	s := open(t, path)
	defer s.Close()
	ctx := context.Background()
	add := func(i int) error {
		return s.Update(ctx, func(tx *Tx) error {
			return tx.AddEvent(api.Event{Kind: "test", Subject: fmt.Sprint(i), Message: "x"})
		})
	}
	for i := 0; i < 100; i++ {
		if err := add(i); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 100; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := add(i); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	out := filepath.Join(dir, "backup.db")
	err := Backup(ctx, path, out)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v, mode %v, want 0600", err, st.Mode())
	}
	b, err := OpenExisting(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var evs []api.Event
	b.View(ctx, func(tx *Tx) error { evs, err = tx.Events(0, nil, 10000); return err })
	if len(evs) < 100 {
		t.Errorf("the backup holds %d events, want the 100 written before it at least", len(evs))
	}
	for i, e := range evs {
		if e.Subject != fmt.Sprint(i) {
			t.Fatalf("event %d is %s: the backup is not a prefix of the writes", i, e.Subject)
		}
	}
}
