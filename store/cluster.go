package store

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// NodeRecord is a node as the store keeps it: the API view, its last
// snapshot, the fingerprint of the certificate it joined with and of the
// key that first joined it (the name is bound to that key until an admin
// replaces it). It is stored as a nodeRow.
type NodeRecord struct {
	Node       api.Node
	Snapshot   *snapshot.Snapshot
	CertSHA256 string
	KeySHA256  string
	// Replacing is set by an admin: the next join with a valid token may
	// bind the name to a new key.
	Replacing bool
}

// DeleteNode removes a node and its devices' states.
func (t *Tx) DeleteNode(id string) error {
	if err := t.exec(`DELETE FROM devices WHERE node=?`, id); err != nil {
		return err
	}
	return t.exec(`DELETE FROM nodes WHERE id=?`, id)
}

// Nodes reads every node.
func (t *Tx) Nodes() ([]NodeRecord, error) {
	datas, err := t.strings(`SELECT data FROM nodes ORDER BY id`)
	if err != nil {
		return nil, err
	}
	out := make([]NodeRecord, 0, len(datas))
	for _, data := range datas {
		var r nodeRow
		if err := json.Unmarshal([]byte(data), &r); err != nil {
			return nil, fmt.Errorf("node row: %w", err)
		}
		out = append(out, nodeFromRow(r))
	}
	return out, nil
}

// DeviceState is the part of a device the server must remember across
// restarts and re-registrations: whether it is drained and why.
type DeviceState struct {
	Drained bool
	Reason  string
}

// Devices reads the drain states of a node's devices.
func (t *Tx) Devices(node string) (map[string]DeviceState, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT id,drained,drain_reason FROM devices WHERE node=?`, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]DeviceState{}
	for rows.Next() {
		var id, reason string
		var d int
		if err := rows.Scan(&id, &d, &reason); err != nil {
			return nil, err
		}
		out[id] = DeviceState{Drained: d != 0, Reason: reason}
	}
	return out, rows.Err()
}

// Lease reads one lease.
func (t *Tx) Lease(id string) (*api.Lease, error) {
	var data string
	err := t.tx.QueryRowContext(t.ctx, `SELECT data FROM leases WHERE id=?`, id).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("lease %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	l, err := decodeLease(data)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", id, err)
	}
	return l, nil
}

// LeaseFilter selects leases.
type LeaseFilter struct {
	Projects []string // empty: all
	States   []string // empty: all
	Limit    int      // 0: 1000
}

// Leases lists leases, newest first.
func (t *Tx) Leases(f LeaseFilter) ([]*api.Lease, error) {
	q := `SELECT data FROM leases WHERE 1=1`
	var args []any
	q, args = inClause(q, args, "project", f.Projects)
	q, args = inClause(q, args, "state", f.States)
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, f.Limit)
	rows, err := t.tx.QueryContext(t.ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*api.Lease
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		l, err := decodeLease(data)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

func inClause(q string, args []any, col string, vals []string) (string, []any) {
	if len(vals) == 0 {
		return q, args
	}
	q += " AND " + col + " IN ("
	for i, v := range vals {
		if i > 0 {
			q += ","
		}
		q += "?"
		args = append(args, v)
	}
	return q + ")", args
}

// Job reads one job.
func (t *Tx) Job(id string) (*api.Job, error) {
	var data string
	err := t.tx.QueryRowContext(t.ctx, `SELECT data FROM jobs WHERE id=?`, id).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	j, err := decodeJob(data)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	return j, nil
}

// Jobs lists jobs in the given states (all when none).
func (t *Tx) Jobs(states ...string) ([]*api.Job, error) {
	q, args := inClause(`SELECT data FROM jobs WHERE 1=1`, nil, "state", states)
	rows, err := t.tx.QueryContext(t.ctx, q+" ORDER BY id", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*api.Job
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		j, err := decodeJob(data)
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	return out, rows.Err()
}

// decodeLease reads a leaseRow.
func decodeLease(data string) (*api.Lease, error) {
	var r leaseRow
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return nil, fmt.Errorf("lease row: %w", err)
	}
	return leaseFromRow(r), nil
}

// decodeJob reads a jobRow.
func decodeJob(data string) (*api.Job, error) {
	var r jobRow
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return nil, fmt.Errorf("job row: %w", err)
	}
	return jobFromRow(r), nil
}

// JobProjects maps every job to its project (the "project" of jobRow).
func (t *Tx) JobProjects() (map[string]string, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT id, COALESCE(json_extract(data,'$.project'),'') FROM jobs`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, p string
		if err := rows.Scan(&id, &p); err != nil {
			return nil, err
		}
		out[id] = p
	}
	return out, rows.Err()
}

// Usage returns a project's GPU-seconds in a period.
func (t *Tx) Usage(project string, periodStart time.Time) (float64, error) {
	var v float64
	err := t.tx.QueryRowContext(t.ctx, `SELECT gpu_seconds FROM usage WHERE project=? AND period_start=?`, project, timeText(periodStart)).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return v, err
}

// AddEvent appends to the event log.
func (t *Tx) AddEvent(e api.Event) error {
	return t.exec(writeSQL[stmtAddEvent], eventArgs(e)...)
}

// Events reads the log after seq, oldest first; projects limits it (empty: all).
func (t *Tx) Events(after int64, projects []string, limit int) ([]api.Event, error) {
	if limit <= 0 || limit > 10000 {
		limit = 1000
	}
	q, args := inClause(`SELECT seq,at,kind,subject,project,message FROM events WHERE seq>?`, []any{after}, "project", projects)
	rows, err := t.tx.QueryContext(t.ctx, q+" ORDER BY seq LIMIT ?", append(args, limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []api.Event
	for rows.Next() {
		var e api.Event
		var at string
		if err := rows.Scan(&e.Seq, &at, &e.Kind, &e.Subject, &e.Project, &e.Message); err != nil {
			return nil, err
		}
		e.At = parseTime(at)
		out = append(out, e)
	}
	return out, rows.Err()
}
