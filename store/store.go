// Package store is kiln's embedded database: SQLite (modernc.org/sqlite,
// pure Go) in WAL mode, with numbered schema migrations. It keeps users,
// projects, hashed API tokens, join tokens, nodes and their devices, leases,
// jobs, per-project usage and an event log. The server keeps its working
// state in memory, encodes its changes into Writes and has Apply write
// those of many requests in one transaction before it answers them.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
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

// Open opens (creating when missing) the database at path and brings its
// schema up to date. Writes survive a crash of the process once a Tx has
// returned (WAL, synchronous=NORMAL).
func Open(ctx context.Context, path string) (*Store, error) {
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
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	if mode != "wal" {
		db.Close()
		return nil, fmt.Errorf("store %s: journal mode is %q, want wal", path, mode)
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

// Meta reads a key of the meta table ("" when missing).
func (t *Tx) Meta(key string) (string, error) {
	var v string
	err := t.tx.QueryRowContext(t.ctx, "SELECT value FROM meta WHERE key=?", key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

// SetMeta writes a key of the meta table.
func (t *Tx) SetMeta(key, value string) error {
	return t.exec("INSERT INTO meta(key,value) VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", key, value)
}
