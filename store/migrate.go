package store

import (
	"context"
	"fmt"
	"time"
)

// migrations are applied in order, each once, in its own transaction. Never
// edit one that has shipped: add a new one.
var migrations = []string{
	// 1: the first schema.
	`CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE users (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	role TEXT NOT NULL CHECK (role IN ('admin','member')),
	created_at TEXT NOT NULL
);
CREATE TABLE projects (
	name TEXT PRIMARY KEY,
	weight REAL NOT NULL DEFAULT 1 CHECK (weight > 0),
	max_gpus REAL NOT NULL DEFAULT 0 CHECK (max_gpus >= 0),
	gpu_hours REAL NOT NULL DEFAULT 0 CHECK (gpu_hours >= 0),
	period_s INTEGER NOT NULL DEFAULT 2592000 CHECK (period_s > 0),
	created_at TEXT NOT NULL
);
CREATE TABLE members (
	project TEXT NOT NULL REFERENCES projects(name) ON DELETE CASCADE,
	user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	PRIMARY KEY (project, user_id)
);
CREATE TABLE tokens (
	id TEXT PRIMARY KEY,
	user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	name TEXT NOT NULL DEFAULT '',
	hash BLOB NOT NULL,
	created_at TEXT NOT NULL,
	expires_at TEXT NOT NULL DEFAULT ''
);
CREATE TABLE join_tokens (
	id TEXT PRIMARY KEY,
	hash BLOB NOT NULL,
	created_at TEXT NOT NULL,
	expires_at TEXT NOT NULL
);
CREATE TABLE nodes (
	id TEXT PRIMARY KEY,
	cert_sha256 TEXT NOT NULL DEFAULT '',
	state TEXT NOT NULL,
	data TEXT NOT NULL,
	updated_at TEXT NOT NULL
);
CREATE TABLE devices (
	node TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
	id TEXT NOT NULL,
	drained INTEGER NOT NULL DEFAULT 0,
	drain_reason TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (node, id)
);
CREATE TABLE leases (
	id TEXT PRIMARY KEY,
	project TEXT NOT NULL,
	state TEXT NOT NULL,
	created_at TEXT NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX leases_state ON leases(state);
CREATE INDEX leases_project ON leases(project, created_at);
CREATE TABLE jobs (
	id TEXT PRIMARY KEY,
	lease_id TEXT NOT NULL,
	state TEXT NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX jobs_lease ON jobs(lease_id);
CREATE INDEX jobs_state ON jobs(state);
CREATE TABLE usage (
	project TEXT NOT NULL,
	period_start TEXT NOT NULL,
	gpu_seconds REAL NOT NULL DEFAULT 0,
	PRIMARY KEY (project, period_start)
);
CREATE TABLE events (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	at TEXT NOT NULL,
	kind TEXT NOT NULL,
	subject TEXT NOT NULL,
	project TEXT NOT NULL DEFAULT '',
	message TEXT NOT NULL
);
CREATE INDEX events_project ON events(project, seq);`,
	// 2: per-project limits (JSON, a limitsRow).
	`ALTER TABLE projects ADD COLUMN limits TEXT NOT NULL DEFAULT '{}';`,
	// 3: join tokens with a number of uses, revocable.
	`ALTER TABLE join_tokens ADD COLUMN uses INTEGER NOT NULL DEFAULT 1;
ALTER TABLE join_tokens ADD COLUMN used INTEGER NOT NULL DEFAULT 0;
ALTER TABLE join_tokens ADD COLUMN revoked_at TEXT NOT NULL DEFAULT '';`,
	// 4: kiln serve test's results (JSON, a serveTestRow), kept with the
	// deployment's lease, listed by project and model.
	`CREATE TABLE serve_tests (
	id TEXT PRIMARY KEY,
	lease_id TEXT NOT NULL,
	project TEXT NOT NULL,
	model TEXT NOT NULL,
	at TEXT NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX serve_tests_project ON serve_tests(project, model, at);`,
	// 5: what the OpenAI-compatible endpoint routed, per project, model
	// and day (UTC).
	`CREATE TABLE serve_usage (
	project TEXT NOT NULL,
	model TEXT NOT NULL,
	day TEXT NOT NULL,
	requests INTEGER NOT NULL DEFAULT 0,
	errors INTEGER NOT NULL DEFAULT 0,
	prompt_tokens INTEGER NOT NULL DEFAULT 0,
	completion_tokens INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (project, model, day)
);`,
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)`); err != nil {
		return fmt.Errorf("schema_migrations: %w", err)
	}
	have, err := s.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if have > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this kiln (knows %d): upgrade kiln", have, len(migrations))
	}
	for v := have + 1; v <= len(migrations); v++ {
		err := s.Update(ctx, func(t *Tx) error {
			if err := t.exec(migrations[v-1]); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
			return t.exec("INSERT INTO schema_migrations(version, applied_at) VALUES(?,?)", v, timeText(time.Now()))
		})
		if err != nil {
			return err
		}
	}
	return nil
}
