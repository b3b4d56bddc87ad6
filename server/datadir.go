package server

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/store"
)

// dirLock is the data directory's lock: one kiln server (or one host-local
// command such as --reset-admin or restore) at a time.
type dirLock struct{ f *os.File }

// lockDataDir takes the lock file of a data directory, or says who holds it.
func lockDataDir(dir string) (*dirLock, error) {
	p := filepath.Join(dir, "lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(p)
		f.Close()
		who := strings.TrimSpace(string(b))
		if who == "" {
			who = "another process"
		} else {
			who = "process " + who
		}
		return nil, fmt.Errorf("data directory %s is in use by %s (a running kiln server?): stop it first", dir, who)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &dirLock{f}, nil
}

func (l *dirLock) release() {
	if l != nil && l.f != nil {
		_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
		l.f.Close()
		l.f = nil
	}
}

// ResetAdmin is the host-local recovery when no admin can log in (its
// token lost, or every admin demoted by a mistake): it makes the user
// "admin" an admin again (creating it when missing) and gives it a new
// token, which it returns with the CA certificate. It needs the data
// directory and refuses while a server runs on it.
func ResetAdmin(ctx context.Context, dataDir string) (token string, caPEM []byte, err error) {
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return "", nil, err
	}
	defer lock.release()
	st, ca, err := openState(ctx, dataDir, false)
	if err != nil {
		return "", nil, err
	}
	defer st.Close()
	now := time.Now().UTC()
	tokID := randHex(6)
	secret, hash := newSecret()
	err = st.Update(ctx, func(tx *store.Tx) error {
		u, err := tx.UserByName("admin")
		if errors.Is(err, store.ErrNotFound) {
			u = api.User{ID: "u-" + randHex(6), Name: "admin", Created: now}
		} else if err != nil {
			return err
		}
		u.Role = api.RoleAdmin
		if err := tx.PutUser(u); err != nil {
			return err
		}
		if ps, err := tx.Projects(); err == nil {
			for _, p := range ps {
				if p.Name == "default" {
					if err := tx.AddMember("default", u.ID); err != nil {
						return err
					}
				}
			}
		}
		if err := tx.PutToken(store.TokenRow{ID: tokID, UserID: u.ID, Name: "reset-admin", Hash: hash, Created: now}); err != nil {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "admin.reset", Subject: "admin", Message: "kiln server --reset-admin on the server's host made admin an admin with a new token " + tokID})
	})
	if err != nil {
		return "", nil, fmt.Errorf("resetting the admin: %w", err)
	}
	return apiTokenPrefix + tokID + "_" + secret, ca.pem, nil
}

// The files of a data directory. kiln.db is the store (with its -wal and
// -shm), ca.crt and ca.key the CA agents pinned, admin-client.json the
// admin's client configuration; kiln up keeps its agents' identities in
// agents/, and the server job output in logs/.
const (
	dbFile         = "kiln.db"
	caCertFile     = "ca.crt"
	caKeyFile      = "ca.key"
	adminCfgFile   = "admin-client.json"
	agentsDir      = "agents"
	logsDir        = "logs"
	recoverySteps  = "kiln changed nothing on disk. To recover: stop kiln, keep a copy of the data directory, then restore the last backup with 'kiln restore FILE --data %s'"
	startOverSteps = "; to start over with nothing, move the data directory away"
)

// priorState lists what in dir shows that a server ran there before,
// besides the store.
func priorState(dir string) []string {
	var found []string
	for _, name := range []string{caCertFile, caKeyFile, adminCfgFile, dbFile + "-wal"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err == nil && (st.Size() > 0 || name != dbFile+"-wal") {
			found = append(found, name)
		}
	}
	for _, name := range []string{agentsDir, logsDir} {
		if ents, err := os.ReadDir(filepath.Join(dir, name)); err == nil && len(ents) > 0 {
			found = append(found, name+"/")
		}
	}
	return found
}

// openState opens the store and the CA of a data directory and checks that
// they belong together; only mayCreate lets it make them, and only when
// the directory holds nothing of an earlier server (a first start). It
// refuses, changing nothing, a damaged store, a store that is missing,
// empty or emptied while the rest of the state is there, and a CA with a
// half missing: a new CA would lock every agent out, a new store would drop
// every account and overwrite the admin configuration.
func openState(ctx context.Context, dir string, mayCreate bool) (*store.Store, *authority, error) {
	dbPath := filepath.Join(dir, dbFile)
	prior := priorState(dir)
	recovery := fmt.Sprintf(recoverySteps, dir)
	fresh := false
	st, err := os.Stat(dbPath)
	switch {
	case errors.Is(err, os.ErrNotExist) || err == nil && st.Size() == 0:
		what := "missing"
		if err == nil {
			what = "empty"
		}
		if !mayCreate {
			return nil, nil, fmt.Errorf("%s: the store %s is %s: no kiln server ran here (is --data right?)", dir, dbFile, what)
		}
		if len(prior) > 0 {
			return nil, nil, fmt.Errorf("%s: the store %s is %s, but %s of an earlier server are there: this is no first start, and starting anew would drop every account and overwrite the admin configuration. %s%s",
				dir, dbFile, what, strings.Join(prior, ", "), recovery, startOverSteps)
		}
		fresh = true
	case err != nil:
		return nil, nil, fmt.Errorf("%s: %w", dbPath, err)
	}
	var s *store.Store
	if fresh {
		s, err = store.Open(ctx, dbPath)
	} else {
		s, err = store.OpenExisting(ctx, dbPath)
	}
	if errors.Is(err, store.ErrDamaged) {
		return nil, nil, fmt.Errorf("%w. %s, or salvage what SQLite can read with 'sqlite3 %s .recover | sqlite3 recovered.db' and put recovered.db in its place", err, recovery, dbPath)
	}
	if err != nil {
		return nil, nil, err
	}
	users, nodes, err := s.Counts(ctx)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	if !fresh && users == 0 && nodes == 0 {
		// A store with no account: it never finished its first start,
		// or it was emptied (or replaced by a new one).
		if !mayCreate || len(prior) > 0 {
			s.Close()
			return nil, nil, fmt.Errorf("%s: the store %s holds no user and no node, but %s of an earlier server are there: it was emptied or replaced. %s%s",
				dir, dbFile, strings.Join(prior, ", "), recovery, startOverSteps)
		}
		fresh = true
	}
	ca, err := openCA(dir, fresh, users, nodes, recovery)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	if err := enforceModes(dir); err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, ca, nil
}

// openCA loads the CA; it makes one only on a first start. An existing CA
// certificate is never replaced.
func openCA(dir string, fresh bool, users, nodes int, recovery string) (*authority, error) {
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	_, cerr := os.Stat(certPath)
	_, kerr := os.Stat(keyPath)
	switch {
	case cerr == nil && kerr == nil:
		ca, err := loadCA(certPath, keyPath)
		if err != nil {
			return nil, fmt.Errorf("certificate authority in %s: %w. %s", dir, err, recovery)
		}
		return ca, nil
	case cerr == nil:
		return nil, fmt.Errorf("%s: %s is there but %s is missing: kiln never makes a new CA over one that agents pinned. Put %s back from a backup. %s", dir, caCertFile, caKeyFile, caKeyFile, recovery)
	case kerr == nil:
		return nil, fmt.Errorf("%s: %s is there but %s is missing: put %s back from a backup. %s", dir, caKeyFile, caCertFile, caCertFile, recovery)
	case !errors.Is(cerr, os.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", certPath, cerr)
	case !fresh:
		return nil, fmt.Errorf("%s: the store knows %d users and %d nodes but the CA (%s, %s) is gone: agents pinned it, a new one would lock them all out. %s", dir, users, nodes, caCertFile, caKeyFile, recovery)
	}
	ca, err := createCA(dir)
	if err != nil {
		return nil, fmt.Errorf("certificate authority in %s: %w", dir, err)
	}
	return ca, nil
}

// enforceModes makes the data directory and what it keeps private: 0700
// for directories, 0600 for keys, configuration, the store and logs,
// existing ones too.
func enforceModes(dir string) error {
	fix := func(p string, want os.FileMode) error {
		st, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if st.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symbolic link: kiln keeps its state in plain files", p)
		}
		if st.Mode().Perm() != want {
			if err := os.Chmod(p, want); err != nil {
				return fmt.Errorf("%s has mode %v and cannot be made %v: %w", p, st.Mode().Perm(), want, err)
			}
		}
		return nil
	}
	if err := fix(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []string{caKeyFile, adminCfgFile, dbFile, dbFile + "-wal", dbFile + "-shm", "lock"} {
		if err := fix(filepath.Join(dir, f), 0o600); err != nil {
			return err
		}
	}
	if err := fix(filepath.Join(dir, caCertFile), 0o644); err != nil {
		return err
	}
	for _, d := range []string{logsDir, agentsDir} {
		p := filepath.Join(dir, d)
		if err := fix(p, 0o700); err != nil {
			return err
		}
		ents, _ := os.ReadDir(p)
		for _, e := range ents {
			q := filepath.Join(p, e.Name())
			if e.IsDir() {
				if err := fix(q, 0o700); err != nil {
					return err
				}
				sub, _ := os.ReadDir(q)
				for _, f := range sub {
					if !f.IsDir() {
						if err := fix(filepath.Join(q, f.Name()), 0o600); err != nil {
							return err
						}
					}
				}
			} else if err := fix(q, 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}

// backupFiles are what a backup holds: the store (a consistent copy), the
// CA and the admin configuration.
var backupFiles = []string{dbFile, caCertFile, caKeyFile, adminCfgFile}

// Backup writes a backup of the data directory to out (a gzipped tar, mode
// 0600): a consistent copy of the store taken while the server may run
// (SQLite's VACUUM INTO), the CA certificate and key, and the admin
// configuration. out must not exist.
func Backup(ctx context.Context, dataDir, out string) error {
	tmp, err := os.MkdirTemp(dataDir, ".backup-")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer os.RemoveAll(tmp)
	db := filepath.Join(tmp, dbFile)
	if err := store.Backup(ctx, filepath.Join(dataDir, dbFile), db); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	err = writeBackup(f, func(name string) string {
		if name == dbFile {
			return db
		}
		return filepath.Join(dataDir, name)
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
		return fmt.Errorf("backup: %w", err)
	}
	return nil
}

func writeBackup(w io.Writer, path func(string) string) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, name := range backupFiles {
		b, err := os.ReadFile(path(name))
		if errors.Is(err, os.ErrNotExist) && name == adminCfgFile {
			continue
		}
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(b)), ModTime: time.Now(), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// Restore puts a backup made by Backup in place in dataDir, with the
// server stopped. The backup is checked first (the store's integrity, the
// CA's key against its certificate); what it replaces is moved into
// dataDir/replaced-<time>/, not deleted. A backup whose CA differs from the
// one in dataDir is refused: agents pinned that one.
func Restore(ctx context.Context, dataDir, in string) (moved string, err error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return "", err
	}
	defer lock.release()
	tmp, err := os.MkdirTemp(dataDir, ".restore-")
	if err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := readBackup(in, tmp); err != nil {
		return "", fmt.Errorf("restore: %s: %w", in, err)
	}
	if err := store.Check(ctx, filepath.Join(tmp, dbFile)); err != nil {
		return "", fmt.Errorf("restore: the backup's store: %w", err)
	}
	ca, err := loadCA(filepath.Join(tmp, caCertFile), filepath.Join(tmp, caKeyFile))
	if err != nil {
		return "", fmt.Errorf("restore: the backup's CA: %w", err)
	}
	if cur, err := os.ReadFile(filepath.Join(dataDir, caCertFile)); err == nil && !bytes.Equal(cur, ca.pem) {
		return "", fmt.Errorf("restore: the backup's CA is not the one in %s, which agents pinned: restore into an empty data directory, or move %s and %s out of it first", dataDir, caCertFile, caKeyFile)
	}
	moved = filepath.Join(dataDir, "replaced-"+time.Now().UTC().Format("20060102T150405Z"))
	movedAny := false
	for _, name := range append(backupFiles, dbFile+"-wal", dbFile+"-shm") {
		p := filepath.Join(dataDir, name)
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if !movedAny {
			if err := os.Mkdir(moved, 0o700); err != nil {
				return "", fmt.Errorf("restore: %w", err)
			}
			movedAny = true
		}
		if err := os.Rename(p, filepath.Join(moved, name)); err != nil {
			return "", fmt.Errorf("restore: moving %s aside: %w", p, err)
		}
	}
	for _, name := range backupFiles {
		p := filepath.Join(tmp, name)
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := os.Rename(p, filepath.Join(dataDir, name)); err != nil {
			return "", fmt.Errorf("restore: %w", err)
		}
	}
	if !movedAny {
		moved = ""
	}
	return moved, enforceModes(dataDir)
}

// readBackup unpacks a backup into dir: only the files a backup holds,
// each at most 1 GiB (the store) or 1 MiB.
func readBackup(in, dir string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("not a kiln backup: %w", err)
	}
	tr := tar.NewReader(zr)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("not a kiln backup: %w", err)
		}
		known := false
		for _, n := range backupFiles {
			known = known || h.Name == n
		}
		if !known || h.Typeflag != tar.TypeReg || seen[h.Name] {
			return fmt.Errorf("not a kiln backup: it holds %q", h.Name)
		}
		seen[h.Name] = true
		limit := int64(1 << 20)
		if h.Name == dbFile {
			limit = 1 << 30
		}
		if h.Size > limit {
			return fmt.Errorf("%s: %d bytes, more than a kiln backup holds", h.Name, h.Size)
		}
		out, err := os.OpenFile(filepath.Join(dir, h.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, io.LimitReader(tr, limit))
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	for _, n := range []string{dbFile, caCertFile, caKeyFile} {
		if !seen[n] {
			return fmt.Errorf("not a kiln backup: %s is missing", n)
		}
	}
	return nil
}
