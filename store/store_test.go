package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMigrationsWALAndReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kiln.db")
	s := open(t, path)
	v, err := s.SchemaVersion(ctx)
	if err != nil || v != len(migrations) {
		t.Fatalf("schema version %d (%v), want %d", v, err, len(migrations))
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	ends := now.Add(time.Hour)
	lease := &api.Lease{ID: "l-1", Project: "vision", User: "ana", State: api.LeaseGranted, CreatedAt: now, EndsAt: &ends,
		Request:       api.LeaseRequest{Project: "vision", GPUs: 2, Priority: 5},
		Allocations:   []api.Allocation{{Node: "hgx-1", Devices: []api.DeviceGrant{{ID: "gpu0", Vendor: "nvidia", MilliGPU: 1000}, {ID: "gpu1", Vendor: "nvidia", MilliGPU: 1000}}}},
		QueuePosition: 3}
	err = s.Update(ctx, func(tx *Tx) error {
		if err := tx.PutUser(api.User{ID: "u1", Name: "ana", Role: api.RoleMember, Created: now}); err != nil {
			return err
		}
		if err := tx.PutProject(api.Project{Name: "vision", Weight: 2, MaxGPUs: 4}); err != nil {
			return err
		}
		if err := tx.AddMember("vision", "u1"); err != nil {
			return err
		}
		if err := tx.PutToken(TokenRow{ID: "t1", UserID: "u1", Hash: []byte{1, 2, 3}, Created: now}); err != nil {
			return err
		}
		return tx.AddEvent(api.Event{Kind: "lease.granted", Subject: "l-1", Project: "vision", Message: "2 GPUs on hgx-1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	var w Writes
	if err := w.PutNode(NodeRecord{Node: api.Node{ID: "hgx-1", State: api.NodeReady}, Snapshot: &snapshot.Snapshot{SchemaVersion: 1, GPUs: []snapshot.GPU{{Index: 0, Vendor: "nvidia"}}}}); err != nil {
		t.Fatal(err)
	}
	w.PutDevice("hgx-1", "gpu3", DeviceState{Drained: true, Reason: "doctor: gpu-fallen-off-bus"})
	if err := w.PutLease(lease); err != nil {
		t.Fatal(err)
	}
	w.AddUsage("vision", now, 3600)
	w.AddUsage("vision", now, 1800)
	if err := s.Apply(ctx, &w); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = open(t, path)
	defer s.Close()
	err = s.View(ctx, func(tx *Tx) error {
		var mode string
		if err := tx.tx.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("journal mode %q (%v), want wal", mode, err)
		}
		l, err := tx.Lease("l-1")
		if err != nil {
			return err
		}
		if l.State != api.LeaseGranted || len(l.Allocations) != 1 || l.Allocations[0].Devices[1].ID != "gpu1" || !l.EndsAt.Equal(ends) {
			t.Errorf("lease read back as %+v", l)
		}
		if l.QueuePosition != 0 {
			t.Errorf("queue position is derived and must not be stored, got %d", l.QueuePosition)
		}
		ls, err := tx.Leases(LeaseFilter{Projects: []string{"vision"}, States: []string{api.LeaseGranted}})
		if err != nil || len(ls) != 1 {
			t.Errorf("Leases(vision, granted) = %d leases (%v), want 1", len(ls), err)
		}
		ls, _ = tx.Leases(LeaseFilter{Projects: []string{"other"}})
		if len(ls) != 0 {
			t.Errorf("Leases(other) = %d, want 0", len(ls))
		}
		ps, err := tx.Projects()
		if err != nil || len(ps) != 1 || ps[0].Weight != 2 || ps[0].MaxGPUs != 4 || len(ps[0].Members) != 1 || ps[0].Members[0] != "ana" {
			t.Errorf("projects %+v (%v)", ps, err)
		}
		u, err := tx.UserByName("ana")
		if err != nil || len(u.Projects) != 1 || u.Projects[0] != "vision" {
			t.Errorf("user %+v (%v)", u, err)
		}
		devs, err := tx.Devices("hgx-1")
		if err != nil || !devs["gpu3"].Drained || !strings.Contains(devs["gpu3"].Reason, "fallen") {
			t.Errorf("devices %+v (%v)", devs, err)
		}
		nodes, err := tx.Nodes()
		if err != nil || len(nodes) != 1 || nodes[0].Snapshot == nil || len(nodes[0].Snapshot.GPUs) != 1 {
			t.Errorf("nodes %+v (%v)", nodes, err)
		}
		use, err := tx.Usage("vision", now)
		if err != nil || use != 5400 {
			t.Errorf("usage %v (%v), want 5400", use, err)
		}
		evs, err := tx.Events(0, []string{"vision"}, 10)
		if err != nil || len(evs) != 1 || evs[0].Kind != "lease.granted" {
			t.Errorf("events %+v (%v)", evs, err)
		}
		if _, err := tx.Lease("nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("missing lease: %v, want ErrNotFound", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRollbackChangesNothing(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "kiln.db"))
	defer s.Close()
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx *Tx) error {
		if err := tx.PutUser(api.User{ID: "u2", Name: "bo", Role: api.RoleMember}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	s.View(ctx, func(tx *Tx) error {
		if _, err := tx.UserByName("bo"); !errors.Is(err, ErrNotFound) {
			t.Errorf("rolled back user is there: %v", err)
		}
		return nil
	})
}

func TestConstraintsRejectBadRows(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "kiln.db"))
	defer s.Close()
	if err := s.Update(ctx, func(tx *Tx) error { return tx.PutUser(api.User{ID: "x", Name: "x", Role: "root"}) }); err == nil {
		t.Error("role root accepted")
	}
	if err := s.Update(ctx, func(tx *Tx) error { return tx.AddMember("no-such-project", "no-such-user") }); err == nil {
		t.Error("membership of a missing project accepted (foreign keys off?)")
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "kiln.db")
	s := open(t, path)
	s.Update(ctx, func(tx *Tx) error {
		return tx.exec("INSERT INTO schema_migrations(version,applied_at) VALUES(?,?)", len(migrations)+1, "x")
	})
	s.Close()
	if _, err := Open(ctx, path); err == nil || !strings.Contains(err.Error(), "newer than this kiln") {
		t.Fatalf("Open of a newer schema: %v", err)
	}
}
