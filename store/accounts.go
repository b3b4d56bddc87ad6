package store

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"kiln.dev/kiln/server/api"
)

// TokenRow is a stored API token: only the hash of its secret is kept.
type TokenRow struct {
	ID      string
	UserID  string
	Name    string
	Hash    []byte
	Created time.Time
	Expires time.Time // zero: never
}

// PutUser creates or updates a user.
func (t *Tx) PutUser(u api.User) error {
	if u.Role != api.RoleAdmin && u.Role != api.RoleMember {
		return fmt.Errorf("user %s: role %q: want admin or member", u.Name, u.Role)
	}
	return t.exec(`INSERT INTO users(id,name,role,created_at) VALUES(?,?,?,?)
ON CONFLICT(id) DO UPDATE SET name=excluded.name, role=excluded.role`, u.ID, u.Name, u.Role, timeText(u.Created))
}

// Users lists users with the projects they belong to.
func (t *Tx) Users() ([]api.User, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT id,name,role,created_at FROM users ORDER BY name`)
	if err != nil {
		return nil, err
	}
	var out []api.User
	for rows.Next() {
		var u api.User
		var created string
		if err := rows.Scan(&u.ID, &u.Name, &u.Role, &created); err != nil {
			rows.Close()
			return nil, err
		}
		u.Created = parseTime(created)
		out = append(out, u)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		ps, err := t.strings(`SELECT project FROM members WHERE user_id=? ORDER BY project`, out[i].ID)
		if err != nil {
			return nil, err
		}
		out[i].Projects = ps
	}
	return out, nil
}

// UserByName finds a user.
func (t *Tx) UserByName(name string) (api.User, error) {
	users, err := t.Users()
	if err != nil {
		return api.User{}, err
	}
	for _, u := range users {
		if u.Name == name {
			return u, nil
		}
	}
	return api.User{}, fmt.Errorf("user %q: %w", name, ErrNotFound)
}

func (t *Tx) strings(query string, args ...any) ([]string, error) {
	rows, err := t.tx.QueryContext(t.ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// PutProject creates or updates a project (not its members).
func (t *Tx) PutProject(p api.Project) error {
	if p.Weight <= 0 {
		p.Weight = 1
	}
	if p.PeriodSeconds <= 0 {
		p.PeriodSeconds = 30 * 24 * 3600
	}
	return t.exec(`INSERT INTO projects(name,weight,max_gpus,gpu_hours,period_s,created_at) VALUES(?,?,?,?,?,?)
ON CONFLICT(name) DO UPDATE SET weight=excluded.weight, max_gpus=excluded.max_gpus, gpu_hours=excluded.gpu_hours, period_s=excluded.period_s`,
		p.Name, p.Weight, p.MaxGPUs, p.GPUHours, p.PeriodSeconds, timeText(time.Now()))
}

// Projects lists projects with their members' names.
func (t *Tx) Projects() ([]api.Project, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT name,weight,max_gpus,gpu_hours,period_s FROM projects ORDER BY name`)
	if err != nil {
		return nil, err
	}
	var out []api.Project
	for rows.Next() {
		var p api.Project
		if err := rows.Scan(&p.Name, &p.Weight, &p.MaxGPUs, &p.GPUHours, &p.PeriodSeconds); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		ms, err := t.strings(`SELECT u.name FROM members m JOIN users u ON u.id=m.user_id WHERE m.project=? ORDER BY u.name`, out[i].Name)
		if err != nil {
			return nil, err
		}
		out[i].Members = ms
	}
	return out, nil
}

// AddMember puts a user in a project.
func (t *Tx) AddMember(project, userID string) error {
	return t.exec(`INSERT OR IGNORE INTO members(project,user_id) VALUES(?,?)`, project, userID)
}

// PutToken stores an API token's hash.
func (t *Tx) PutToken(r TokenRow) error {
	exp := ""
	if !r.Expires.IsZero() {
		exp = timeText(r.Expires)
	}
	return t.exec(`INSERT INTO tokens(id,user_id,name,hash,created_at,expires_at) VALUES(?,?,?,?,?,?)`,
		r.ID, r.UserID, r.Name, r.Hash, timeText(r.Created), exp)
}

// Tokens lists every token (hashes only).
func (t *Tx) Tokens() ([]TokenRow, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT id,user_id,name,hash,created_at,expires_at FROM tokens ORDER BY created_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TokenRow
	for rows.Next() {
		var r TokenRow
		var created, exp string
		if err := rows.Scan(&r.ID, &r.UserID, &r.Name, &r.Hash, &created, &exp); err != nil {
			return nil, err
		}
		r.Created = parseTime(created)
		if exp != "" {
			r.Expires = parseTime(exp)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteToken removes a token; ErrNotFound when there was none.
func (t *Tx) DeleteToken(id string) error {
	res, err := t.tx.ExecContext(t.ctx, `DELETE FROM tokens WHERE id=?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("token %s: %w", id, ErrNotFound)
	}
	return nil
}

// PutJoinToken stores a join token's hash.
func (t *Tx) PutJoinToken(id string, hash []byte, created, expires time.Time) error {
	return t.exec(`INSERT INTO join_tokens(id,hash,created_at,expires_at) VALUES(?,?,?,?)`, id, hash, timeText(created), timeText(expires))
}

// JoinToken returns a join token's hash and expiry.
func (t *Tx) JoinToken(id string) (hash []byte, expires time.Time, err error) {
	var exp string
	err = t.tx.QueryRowContext(t.ctx, `SELECT hash,expires_at FROM join_tokens WHERE id=?`, id).Scan(&hash, &exp)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, time.Time{}, fmt.Errorf("join token %s: %w", id, ErrNotFound)
	}
	return hash, parseTime(exp), err
}
