package store

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
)

// A serve test is stored with every field and read back whole; lists
// filter by project and model, newest first; an id is never replaced.
func TestServeTests(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "kiln.db"))
	defer s.Close()
	f := &filler{}
	full := fillNew[api.ServeTest](f)
	full.Project, full.Model = "p", "m"
	older := api.ServeTest{ID: "st-old", LeaseID: "l-1", Project: "p", Model: "m", At: full.At.Add(-time.Hour), Smoke: []api.ServeSmoke{}, Load: []api.ServeLoad{}}
	other := api.ServeTest{ID: "st-q", LeaseID: "l-2", Project: "q", Model: "m", At: full.At}
	otherModel := api.ServeTest{ID: "st-n", LeaseID: "l-3", Project: "p", Model: "n", At: full.At.Add(time.Hour)}
	ctx := context.Background()
	err := s.Update(ctx, func(tx *Tx) error {
		for _, st := range []api.ServeTest{older, full, other, otherModel} {
			if err := tx.PutServeTest(st); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update(ctx, func(tx *Tx) error { return tx.PutServeTest(api.ServeTest{ID: full.ID, Project: "p", Model: "x"}) })
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "unique") {
		t.Errorf("a second test of one id: %v", err)
	}
	err = s.View(ctx, func(tx *Tx) error {
		got, err := tx.ServeTests([]string{"p"}, "m", 0)
		if err != nil {
			return err
		}
		if len(got) != 2 || got[0].ID != full.ID || got[1].ID != "st-old" {
			t.Fatalf("p's tests of m: %+v", got)
		}
		same(t, "serve test", &got[0], &full)
		all, err := tx.ServeTests(nil, "", 0)
		if err != nil {
			return err
		}
		if len(all) != 4 || all[0].ID != "st-n" {
			t.Errorf("every test: %d, first %s", len(all), all[0].ID)
		}
		mine, err := tx.ServeTests([]string{"q"}, "", 0)
		if err != nil {
			return err
		}
		if len(mine) != 1 || mine[0].ID != "st-q" {
			t.Errorf("q's tests: %+v", mine)
		}
		if n, err := tx.ServeTestCount("l-1"); err != nil || n != 1 {
			t.Errorf("lease l-1 keeps %d tests (%v), want 1", n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Usage adds up per project, model and day, and lists by project.
func TestServeUsage(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "kiln.db"))
	defer s.Close()
	ctx := context.Background()
	err := s.Update(ctx, func(tx *Tx) error {
		for _, r := range []api.ServeUsageRow{
			usageRow("p", "m", "2026-12-05", api.ServeUsage{Requests: 2, Errors: 1, PromptTokens: 10, CompletionTokens: 20}),
			usageRow("p", "m", "2026-12-05", api.ServeUsage{Requests: 3, PromptTokens: 5, CompletionTokens: 7}),
			usageRow("p", "m", "2026-12-06", api.ServeUsage{Requests: 1}),
			usageRow("q", "m", "2026-12-06", api.ServeUsage{Requests: 9}),
			usageRow("p", "m", "2026-11-01", api.ServeUsage{Requests: 4}),
		} {
			if err := tx.AddServeUsage(r.Project, r.Model, r.Day, r.Usage); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(ctx, func(tx *Tx) error {
		got, err := tx.ServeUsage([]string{"p"}, "2026-12-01")
		if err != nil {
			return err
		}
		want := []api.ServeUsageRow{
			usageRow("p", "m", "2026-12-06", api.ServeUsage{Requests: 1}),
			usageRow("p", "m", "2026-12-05", api.ServeUsage{Requests: 5, Errors: 1, PromptTokens: 15, CompletionTokens: 27}),
		}
		same(t, "p's usage", got, want)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func usageRow(project, model, day string, u api.ServeUsage) api.ServeUsageRow {
	return api.ServeUsageRow{Project: project, Model: model, Day: day, Usage: u}
}
