// Package store is kiln's embedded database: SQLite (modernc.org/sqlite,
// pure Go) in WAL mode, with numbered schema migrations. It keeps users,
// projects, hashed API tokens, join tokens, nodes and their devices, leases,
// jobs, per-project usage and an event log. The server keeps its working
// state in memory, encodes its changes into Writes and has Apply write
// those of many requests in one transaction before it answers them.
//
// What is kept as JSON (leases, jobs, nodes, project limits) is kept as
// the store's own row types, mapped to and from package api field by
// field: the API's wire names are not the database's.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store is an open database: one connection writes, a few others read
// (WAL lets readers go on while a write is under way).
type Store struct {
	db  *sql.DB // the writer
	rdb *sql.DB // readers
	// wmu serialises Apply and guards stmts, the prepared write statements.
	wmu   sync.Mutex
	stmts [stmtCount]*sql.Stmt
	// stop ends the background checkpoints.
	stop, stopped chan struct{}
}

// ErrNotFound is returned when a row does not exist.
var ErrNotFound = errors.New("not found")

// ErrDamaged is returned by Open when the database fails SQLite's
// integrity check (or is not a database at all); nothing was written.
var ErrDamaged = errors.New("the database is damaged")

// ErrNoStore is returned by OpenExisting when there is no database file.
var ErrNoStore = errors.New("no database")

// Open opens (creating when missing, mode 0600) the database at path,
// checks it and brings its schema up to date. Writes survive a crash of
// the process once a Tx has returned (WAL, synchronous=NORMAL).
func Open(ctx context.Context, path string) (*Store, error) { return openStore(ctx, path, true) }

// OpenExisting is Open for a database that must exist: it never creates
// one (ErrNoStore).
func OpenExisting(ctx context.Context, path string) (*Store, error) {
	return openStore(ctx, path, false)
}

// dataFiles are the files of the database at path.
func dataFiles(path string) []string { return []string{path, path + "-wal", path + "-shm"} }

func openStore(ctx context.Context, path string, create bool) (*Store, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if !create {
			return nil, fmt.Errorf("store %s: %w", path, ErrNoStore)
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("store %s: %w", path, err)
		}
		f.Close()
	} else if err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	// SQLite gives the WAL and shared-memory files the database's mode.
	if err := restrict(path); err != nil {
		return nil, err
	}
	// The writer does not checkpoint the WAL itself: a checkpoint syncs
	// the files and would stall the commit that happens to trigger it.
	// checkpoints does it in the background instead.
	db, err := openDB(path, 1, "wal_autocheckpoint(0)")
	if err != nil {
		return nil, err
	}
	s := &Store{db: db}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		db.Close()
		if isNotADatabase(err) {
			return nil, fmt.Errorf("store %s: %w: %v", path, ErrDamaged, err)
		}
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	if mode != "wal" {
		db.Close()
		return nil, fmt.Errorf("store %s: journal mode is %q, want wal", path, mode)
	}
	// The check comes before any write, migrations included: a damaged
	// file is left as it was found.
	if err := check(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	if err := restrict(path); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	if s.rdb, err = openDB(path, 4); err != nil {
		db.Close()
		return nil, err
	}
	s.stop = make(chan struct{})
	s.stopped = make(chan struct{})
	go s.checkpoints()
	return s, nil
}

// restrict gives the database's files mode 0600, existing ones too.
func restrict(path string) error {
	for _, p := range dataFiles(path) {
		st, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("store %s: %w", p, err)
		}
		if st.Mode().Perm() != 0o600 {
			if err := os.Chmod(p, 0o600); err != nil {
				return fmt.Errorf("store %s: mode %v, and it cannot be made 0600: %w", p, st.Mode().Perm(), err)
			}
		}
	}
	return nil
}

// check runs SQLite's integrity check and the foreign key check.
func check(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, "PRAGMA integrity_check(8)")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrDamaged, err)
	}
	var problems []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return fmt.Errorf("%w: %v", ErrDamaged, err)
		}
		if s != "ok" {
			problems = append(problems, s)
		}
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrDamaged, err)
	}
	if len(problems) == 0 {
		var table string
		err := db.QueryRowContext(ctx, "PRAGMA foreign_key_check").Scan(&table)
		if err == nil {
			problems = append(problems, "rows of "+table+" refer to rows that do not exist")
		} else if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: %v", ErrDamaged, err)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrDamaged, strings.Join(problems, "; "))
	}
	return nil
}

func isNotADatabase(err error) bool {
	m := strings.ToLower(err.Error())
	return strings.Contains(m, "not a database") || strings.Contains(m, "malformed") || strings.Contains(m, "corrupt")
}

// Backup writes a consistent copy of the database at src to dst (which
// must not exist) while others may write to it: SQLite's VACUUM INTO, in
// one read transaction. The copy is checked before Backup returns.
func Backup(ctx context.Context, src, dst string) error {
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("store %s: %w", src, err)
	}
	db, err := openDB(src, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", dst); err != nil {
		return fmt.Errorf("backing up %s: %w", src, err)
	}
	if err := os.Chmod(dst, 0o600); err != nil {
		return err
	}
	return Check(ctx, dst)
}

// Check opens the database at path, runs the integrity check and closes
// it; it never creates the file nor writes to it.
func Check(ctx context.Context, path string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("store %s: %w", path, err)
	}
	db, err := openDB(path, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("store %s: %w: %v", path, ErrDamaged, err)
	}
	if err := check(ctx, db); err != nil {
		return fmt.Errorf("store %s: %w", path, err)
	}
	return nil
}

// checkpoints copies the WAL into the database file every half second
// (PASSIVE: it never blocks the writer or the readers).
func (s *Store) checkpoints() {
	defer close(s.stopped)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if _, err := s.rdb.Exec("PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
			continue // busy or closing: the next tick tries again
		}
	}
}

// openDB opens a pool of at most conns connections. The writer has one:
// SQLite allows one writer, and the server serialises its writes anyway.
func openDB(path string, conns int, pragmas ...string) (*sql.DB, error) {
	q := url.Values{}
	for _, p := range append([]string{"journal_mode(WAL)", "synchronous(NORMAL)", "busy_timeout(10000)", "foreign_keys(1)"}, pragmas...) {
		q.Add("_pragma", p)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	return db, nil
}

// Close closes the database.
func (s *Store) Close() error {
	if s.stop != nil {
		close(s.stop)
		<-s.stopped
		s.stop = nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for _, st := range s.stmts {
		if st != nil {
			st.Close()
		}
	}
	var rerr error
	if s.rdb != nil {
		rerr = s.rdb.Close()
	}
	if err := s.db.Close(); err != nil {
		return err
	}
	return rerr
}

// Tx is one transaction.
type Tx struct {
	tx  *sql.Tx
	ctx context.Context
}

// Update runs fn in a write transaction and commits it when fn returns nil.
func (s *Store) Update(ctx context.Context, fn func(*Tx) error) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	if err := fn(&Tx{tx: tx, ctx: ctx}); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

// View runs fn in a read transaction; it sees every write that returned
// before it began and does not wait for one under way.
func (s *Store) View(ctx context.Context, fn func(*Tx) error) error {
	tx, err := s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	defer tx.Rollback()
	return fn(&Tx{tx: tx, ctx: ctx})
}

func (t *Tx) exec(query string, args ...any) error {
	_, err := t.tx.ExecContext(t.ctx, query, args...)
	return err
}

// timeText is the stored form of a time: RFC 3339 with nanoseconds, UTC.
func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func parseTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// SchemaVersion returns the highest migration applied.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(version),0) FROM schema_migrations").Scan(&v)
	return v, err
}

// Counts says how many users and nodes the store holds: none of either is
// a store that was never used (or was emptied).
func (s *Store) Counts(ctx context.Context) (users, nodes int, err error) {
	err = s.View(ctx, func(tx *Tx) error {
		if err := tx.tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM users").Scan(&users); err != nil {
			return err
		}
		return tx.tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM nodes").Scan(&nodes)
	})
	return users, nodes, err
}
