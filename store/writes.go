package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"kiln.dev/kiln/api"
)

// Writes is a set of changes encoded when they are added, so the values
// they came from may change afterwards. Apply writes the Writes of many
// callers in one transaction (group commit): the server encodes its
// changes while it holds its lock and waits for the transaction without it.
type Writes struct {
	ops []op
}

type op struct {
	stmt int
	args []any
}

// The statements Apply runs, prepared once on the writing connection.
const (
	stmtPutNode = iota
	stmtPutDevice
	stmtPutLease
	stmtPutJob
	stmtAddUsage
	stmtAddEvent
	stmtCount
)

var writeSQL = [stmtCount]string{
	stmtPutNode: `INSERT INTO nodes(id,cert_sha256,state,data,updated_at) VALUES(?,?,?,?,?)
ON CONFLICT(id) DO UPDATE SET cert_sha256=excluded.cert_sha256, state=excluded.state, data=excluded.data, updated_at=excluded.updated_at`,
	stmtPutDevice: `INSERT INTO devices(node,id,drained,drain_reason) VALUES(?,?,?,?)
ON CONFLICT(node,id) DO UPDATE SET drained=excluded.drained, drain_reason=excluded.drain_reason`,
	stmtPutLease: `INSERT INTO leases(id,project,state,created_at,data) VALUES(?,?,?,?,?)
ON CONFLICT(id) DO UPDATE SET state=excluded.state, data=excluded.data`,
	stmtPutJob: `INSERT INTO jobs(id,lease_id,state,data) VALUES(?,?,?,?)
ON CONFLICT(id) DO UPDATE SET state=excluded.state, data=excluded.data`,
	stmtAddUsage: `INSERT INTO usage(project,period_start,gpu_seconds) VALUES(?,?,?)
ON CONFLICT(project,period_start) DO UPDATE SET gpu_seconds=gpu_seconds+excluded.gpu_seconds`,
	stmtAddEvent: `INSERT INTO events(at,kind,subject,project,message) VALUES(?,?,?,?,?)`,
}

func (w *Writes) add(stmt int, args ...any) { w.ops = append(w.ops, op{stmt, args}) }

// PutNode adds a node.
func (w *Writes) PutNode(r NodeRecord) error {
	args, err := nodeArgs(r)
	if err != nil {
		return err
	}
	w.add(stmtPutNode, args...)
	return nil
}

// PutDevice adds a device's drain state.
func (w *Writes) PutDevice(node, id string, st DeviceState) {
	w.add(stmtPutDevice, deviceArgs(node, id, st)...)
}

// PutLease adds a lease.
func (w *Writes) PutLease(l *api.Lease) error {
	args, err := leaseArgs(l)
	if err != nil {
		return err
	}
	w.add(stmtPutLease, args...)
	return nil
}

// PutJob adds a job.
func (w *Writes) PutJob(j *api.Job) error {
	args, err := jobArgs(j)
	if err != nil {
		return err
	}
	w.add(stmtPutJob, args...)
	return nil
}

// AddUsage adds GPU-seconds to a project's usage in a period.
func (w *Writes) AddUsage(project string, periodStart time.Time, gpuSeconds float64) {
	w.add(stmtAddUsage, project, timeText(periodStart), gpuSeconds)
}

// AddEvent appends to the event log.
func (w *Writes) AddEvent(e api.Event) {
	w.add(stmtAddEvent, eventArgs(e)...)
}

func nodeArgs(r NodeRecord) ([]any, error) {
	b, err := json.Marshal(nodeToRow(r))
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", r.Node.ID, err)
	}
	return []any{r.Node.ID, r.CertSHA256, r.Node.State, string(b), timeText(time.Now())}, nil
}

func deviceArgs(node, id string, st DeviceState) []any {
	d := 0
	if st.Drained {
		d = 1
	}
	return []any{node, id, d, st.Reason}
}

func leaseArgs(l *api.Lease) ([]any, error) {
	b, err := json.Marshal(leaseToRow(l))
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", l.ID, err)
	}
	return []any{l.ID, l.Project, l.State, timeText(l.CreatedAt), string(b)}, nil
}

func jobArgs(j *api.Job) ([]any, error) {
	b, err := json.Marshal(jobToRow(j))
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", j.ID, err)
	}
	return []any{j.ID, j.LeaseID, j.State, string(b)}, nil
}

func eventArgs(e api.Event) []any {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	return []any{timeText(e.At), e.Kind, e.Subject, e.Project, e.Message}
}

// Apply writes every change of ws, in order, in one transaction; when it
// returns nil all of them survive a crash of the process.
func (s *Store) Apply(ctx context.Context, ws ...*Writes) error {
	n := 0
	for _, w := range ws {
		if w != nil {
			n += len(w.ops)
		}
	}
	if n == 0 {
		return nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.prepare(ctx); err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	var stmts [stmtCount]*sql.Stmt
	for _, w := range ws {
		if w == nil {
			continue
		}
		for _, o := range w.ops {
			st := stmts[o.stmt]
			if st == nil {
				st = tx.StmtContext(ctx, s.stmts[o.stmt])
				stmts[o.stmt] = st
			}
			if _, err := st.ExecContext(ctx, o.args...); err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("store: write: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}

// prepare readies the write statements once; s.wmu is held.
func (s *Store) prepare(ctx context.Context) error {
	if s.stmts[0] != nil {
		return nil
	}
	for i, q := range writeSQL {
		st, err := s.db.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("store: prepare: %w", err)
		}
		s.stmts[i] = st
	}
	return nil
}
