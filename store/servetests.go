package store

import (
	"encoding/json"
	"fmt"
	"time"

	"kiln.dev/kiln/api"
)

// serveTestRow is a stored kiln serve test.
type serveTestRow struct {
	ID       string          `json:"id"`
	LeaseID  string          `json:"lease_id"`
	Project  string          `json:"project"`
	User     string          `json:"user"`
	Model    string          `json:"model"`
	Engine   string          `json:"engine"`
	Image    string          `json:"image,omitempty"`
	Node     string          `json:"node"`
	GPUs     int             `json:"gpus"`
	GPUModel string          `json:"gpu_model,omitempty"`
	At       time.Time       `json:"at"`
	Smoke    []serveSmokeRow `json:"smoke"`
	Load     []serveLoadRow  `json:"load"`
}

type serveSmokeRow struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

type serveLoadRow struct {
	Concurrency           int     `json:"concurrency"`
	Requests              int     `json:"requests"`
	Errors                int     `json:"errors"`
	Seconds               float64 `json:"seconds"`
	RequestsPerSecond     float64 `json:"requests_per_s"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_s"`
	TTFTP50MS             float64 `json:"ttft_p50_ms"`
	TTFTP99MS             float64 `json:"ttft_p99_ms"`
	ITLP50MS              float64 `json:"itl_p50_ms"`
	ITLP99MS              float64 `json:"itl_p99_ms"`
	LatencyP50MS          float64 `json:"latency_p50_ms"`
	LatencyP99MS          float64 `json:"latency_p99_ms"`
	FirstError            string  `json:"first_error,omitempty"`
}

func serveTestToRow(t api.ServeTest) serveTestRow {
	return serveTestRow{ID: t.ID, LeaseID: t.LeaseID, Project: t.Project, User: t.User, Model: t.Model, Engine: t.Engine,
		Image: t.Image, Node: t.Node, GPUs: t.GPUs, GPUModel: t.GPUModel, At: t.At.UTC(),
		Smoke: mapSlice(t.Smoke, func(s api.ServeSmoke) serveSmokeRow { return serveSmokeRow(s) }),
		Load:  mapSlice(t.Load, func(l api.ServeLoad) serveLoadRow { return serveLoadRow(l) })}
}

func serveTestFromRow(r serveTestRow) api.ServeTest {
	return api.ServeTest{ID: r.ID, LeaseID: r.LeaseID, Project: r.Project, User: r.User, Model: r.Model, Engine: r.Engine,
		Image: r.Image, Node: r.Node, GPUs: r.GPUs, GPUModel: r.GPUModel, At: r.At,
		Smoke: mapSlice(r.Smoke, func(s serveSmokeRow) api.ServeSmoke { return api.ServeSmoke(s) }),
		Load:  mapSlice(r.Load, func(l serveLoadRow) api.ServeLoad { return api.ServeLoad(l) })}
}

// PutServeTest stores a kiln serve test; a test of the same id is refused,
// never replaced.
func (t *Tx) PutServeTest(st api.ServeTest) error {
	b, err := json.Marshal(serveTestToRow(st))
	if err != nil {
		return err
	}
	return t.exec(`INSERT INTO serve_tests(id,lease_id,project,model,at,data) VALUES(?,?,?,?,?,?)`,
		st.ID, st.LeaseID, st.Project, st.Model, timeText(st.At), string(b))
}

// ServeTests lists stored tests of the projects (empty: all), of one model
// when model is not "", newest first, at most limit.
func (t *Tx) ServeTests(projects []string, model string, limit int) ([]api.ServeTest, error) {
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	q, args := inClause(`SELECT id,data FROM serve_tests WHERE 1=1`, nil, "project", projects)
	if model != "" {
		q += ` AND model=?`
		args = append(args, model)
	}
	rows, err := t.tx.QueryContext(t.ctx, q+` ORDER BY at DESC, id DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []api.ServeTest{}
	for rows.Next() {
		var id, data string
		if err := rows.Scan(&id, &data); err != nil {
			return nil, err
		}
		var r serveTestRow
		if err := json.Unmarshal([]byte(data), &r); err != nil {
			return nil, fmt.Errorf("serve test %s: %w", id, err)
		}
		out = append(out, serveTestFromRow(r))
	}
	return out, rows.Err()
}

// ServeTestCount is how many tests a lease keeps.
func (t *Tx) ServeTestCount(leaseID string) (int, error) {
	var n int
	err := t.tx.QueryRowContext(t.ctx, `SELECT COUNT(*) FROM serve_tests WHERE lease_id=?`, leaseID).Scan(&n)
	return n, err
}

// AddServeUsage adds what the endpoint routed for a project's model on a
// day (YYYY-MM-DD, UTC) to what is kept.
func (t *Tx) AddServeUsage(project, model, day string, u api.ServeUsage) error {
	return t.exec(`INSERT INTO serve_usage(project,model,day,requests,errors,prompt_tokens,completion_tokens) VALUES(?,?,?,?,?,?,?)
ON CONFLICT(project,model,day) DO UPDATE SET requests=requests+excluded.requests, errors=errors+excluded.errors,
prompt_tokens=prompt_tokens+excluded.prompt_tokens, completion_tokens=completion_tokens+excluded.completion_tokens`,
		project, model, day, u.Requests, u.Errors, u.PromptTokens, u.CompletionTokens)
}

// ServeUsage lists what the endpoint routed per project, model and day,
// from day since on, of the projects (empty: all); newest day first.
func (t *Tx) ServeUsage(projects []string, since string) ([]api.ServeUsageRow, error) {
	q, args := inClause(`SELECT project,model,day,requests,errors,prompt_tokens,completion_tokens FROM serve_usage WHERE day>=?`, []any{since}, "project", projects)
	rows, err := t.tx.QueryContext(t.ctx, q+` ORDER BY day DESC, project, model LIMIT 10000`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []api.ServeUsageRow{}
	for rows.Next() {
		var r api.ServeUsageRow
		if err := rows.Scan(&r.Project, &r.Model, &r.Day, &r.Usage.Requests, &r.Usage.Errors, &r.Usage.PromptTokens, &r.Usage.CompletionTokens); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
