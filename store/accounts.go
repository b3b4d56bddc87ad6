package store

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"kiln.dev/kiln/api"
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

// DeleteUser removes a user with its tokens and memberships;
// ErrNotFound when there was none.
func (t *Tx) DeleteUser(id string) error {
	if err := t.exec(`DELETE FROM tokens WHERE user_id=?`, id); err != nil {
		return err
	}
	if err := t.exec(`DELETE FROM members WHERE user_id=?`, id); err != nil {
		return err
	}
	res, err := t.tx.ExecContext(t.ctx, `DELETE FROM users WHERE id=?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("user %s: %w", id, ErrNotFound)
	}
	return nil
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
	limits, err := json.Marshal(limitsToRow(p.Limits))
	if err != nil {
		return err
	}
	return t.exec(`INSERT INTO projects(name,weight,max_gpus,gpu_hours,period_s,created_at,limits) VALUES(?,?,?,?,?,?,?)
ON CONFLICT(name) DO UPDATE SET weight=excluded.weight, max_gpus=excluded.max_gpus, gpu_hours=excluded.gpu_hours, period_s=excluded.period_s, limits=excluded.limits`,
		p.Name, p.Weight, p.MaxGPUs, p.GPUHours, p.PeriodSeconds, timeText(time.Now()), string(limits))
}

// Projects lists projects with their members' names.
func (t *Tx) Projects() ([]api.Project, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT name,weight,max_gpus,gpu_hours,period_s,limits FROM projects ORDER BY name`)
	if err != nil {
		return nil, err
	}
	var out []api.Project
	for rows.Next() {
		var p api.Project
		var limits string
		if err := rows.Scan(&p.Name, &p.Weight, &p.MaxGPUs, &p.GPUHours, &p.PeriodSeconds, &limits); err != nil {
			rows.Close()
			return nil, err
		}
		var lr limitsRow
		if err := json.Unmarshal([]byte(limits), &lr); err != nil {
			rows.Close()
			return nil, fmt.Errorf("project %s: limits: %w", p.Name, err)
		}
		p.Limits = limitsFromRow(lr)
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

// JoinTokenRow is a stored join token: only the hash of its secret is
// kept. It joins Uses nodes at most, until Expires.
type JoinTokenRow struct {
	ID      string
	Hash    []byte
	Created time.Time
	Expires time.Time
	Uses    int
	Used    int
	Revoked time.Time // zero: not revoked
}

// PutJoinToken stores a join token.
func (t *Tx) PutJoinToken(r JoinTokenRow) error {
	if r.Uses < 1 {
		r.Uses = 1
	}
	return t.exec(`INSERT INTO join_tokens(id,hash,created_at,expires_at,uses,used) VALUES(?,?,?,?,?,0)`, r.ID, r.Hash, timeText(r.Created), timeText(r.Expires), r.Uses)
}

const joinCols = `id,hash,created_at,expires_at,uses,used,revoked_at`

func scanJoinToken(sc interface{ Scan(...any) error }) (JoinTokenRow, error) {
	var r JoinTokenRow
	var created, exp, revoked string
	if err := sc.Scan(&r.ID, &r.Hash, &created, &exp, &r.Uses, &r.Used, &revoked); err != nil {
		return r, err
	}
	r.Created, r.Expires, r.Revoked = parseTime(created), parseTime(exp), parseTime(revoked)
	return r, nil
}

// JoinToken reads a join token.
func (t *Tx) JoinToken(id string) (JoinTokenRow, error) {
	r, err := scanJoinToken(t.tx.QueryRowContext(t.ctx, `SELECT `+joinCols+` FROM join_tokens WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("join token %s: %w", id, ErrNotFound)
	}
	return r, err
}

// JoinTokens lists the join tokens, newest first.
func (t *Tx) JoinTokens() ([]JoinTokenRow, error) {
	rows, err := t.tx.QueryContext(t.ctx, `SELECT `+joinCols+` FROM join_tokens ORDER BY created_at DESC, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []JoinTokenRow
	for rows.Next() {
		r, err := scanJoinToken(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// UseJoinToken takes one use of a join token that is valid at now; false
// when it is used up, revoked or expired (or does not exist).
func (t *Tx) UseJoinToken(id string, now time.Time) (bool, error) {
	res, err := t.tx.ExecContext(t.ctx, `UPDATE join_tokens SET used=used+1 WHERE id=? AND used<uses AND revoked_at='' AND expires_at>?`, id, timeText(now))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// RevokeJoinToken ends a join token; ErrNotFound when there is none.
func (t *Tx) RevokeJoinToken(id string, now time.Time) error {
	res, err := t.tx.ExecContext(t.ctx, `UPDATE join_tokens SET revoked_at=? WHERE id=? AND revoked_at=''`, timeText(now), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("join token %s: %w", id, ErrNotFound)
	}
	return nil
}
