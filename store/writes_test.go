package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/api"
)

// TestApplyGroupsWrites writes the Writes of several callers in one
// transaction and checks that every change is there, in order (a later
// change of the same lease wins), and that a Writes keeps what it was
// given even when the value changes afterwards.
func TestApplyGroupsWrites(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "kiln.db"))
	defer s.Close()
	now := time.Now().UTC().Truncate(time.Millisecond)
	l := &api.Lease{ID: "l-1", Project: "vision", State: api.LeaseQueued, CreatedAt: now, Request: api.LeaseRequest{GPUs: 1}}
	var a, b Writes
	if err := a.PutLease(l); err != nil {
		t.Fatal(err)
	}
	a.AddEvent(api.Event{Kind: "lease.created", Subject: "l-1", Project: "vision", Message: "asks for 1 GPU"})
	l.State = api.LeaseGranted // after encoding: a must keep "queued"
	if err := b.PutLease(l); err != nil {
		t.Fatal(err)
	}
	b.AddEvent(api.Event{Kind: "lease.granted", Subject: "l-1", Project: "vision", Message: "granted"})
	b.AddUsage("vision", now, 90)
	if len(a.ops) != 2 || len(b.ops) != 3 {
		t.Fatalf("lengths %d and %d, want 2 and 3", len(a.ops), len(b.ops))
	}
	if err := s.Apply(ctx, &a, nil, &b); err != nil {
		t.Fatal(err)
	}
	err := s.View(ctx, func(tx *Tx) error {
		got, err := tx.Lease("l-1")
		if err != nil {
			return err
		}
		if got.State != api.LeaseGranted {
			t.Errorf("lease state %s, want granted (the later write)", got.State)
		}
		ev, err := tx.Events(0, []string{"vision"}, 10)
		if err != nil {
			return err
		}
		if len(ev) != 2 || ev[0].Kind != "lease.created" || ev[1].Kind != "lease.granted" {
			t.Errorf("events %+v, want created then granted", ev)
		}
		u, err := tx.Usage("vision", now)
		if u != 90 {
			t.Errorf("usage %g, want 90", u)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// A queued encoding applied alone still says queued: the value was
	// copied when added.
	if err := s.Apply(ctx, &a); err != nil {
		t.Fatal(err)
	}
	_ = s.View(ctx, func(tx *Tx) error {
		got, err := tx.Lease("l-1")
		if err != nil || got.State != api.LeaseQueued {
			t.Errorf("lease %+v (%v), want the queued copy", got, err)
		}
		return nil
	})
}

// TestApplyConcurrentWithReads runs writers and readers at once: readers
// never wait for a write and never see a half-written transaction.
func TestApplyConcurrentWithReads(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "kiln.db"))
	defer s.Close()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := s.View(ctx, func(tx *Tx) error {
					ls, err := tx.Leases(LeaseFilter{})
					if err != nil {
						return err
					}
					// Each transaction writes a pair: the count is even.
					if len(ls)%2 != 0 {
						t.Errorf("a reader saw %d leases: half a transaction", len(ls))
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	now := time.Now().UTC()
	for i := 0; i < 100; i++ {
		var w Writes
		for k := 0; k < 2; k++ {
			if err := w.PutLease(&api.Lease{ID: fmt.Sprintf("l-%d-%d", i, k), Project: "p", State: api.LeaseGranted, CreatedAt: now}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Apply(ctx, &w); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

// BenchmarkApply is one group commit of a lease grant and release: two
// lease writes, a job and three events.
func BenchmarkApply(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "kiln.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	now := time.Now().UTC()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var w Writes
		l := &api.Lease{ID: fmt.Sprintf("l-%d", i), Project: "default", User: "admin", State: api.LeaseGranted, CreatedAt: now,
			Request: api.LeaseRequest{Project: "default", GPUs: 1}, Allocations: []api.Allocation{{Node: "sim-0001", Devices: []api.DeviceGrant{{ID: "gpu0", Vendor: "nvidia", MilliGPU: 1000, Isolation: "exclusive"}}}}}
		_ = w.PutLease(l)
		w.AddEvent(api.Event{Kind: "lease.created", Subject: l.ID, Project: "default", Message: "admin asks for 1 GPU"})
		w.AddEvent(api.Event{Kind: "lease.granted", Subject: l.ID, Project: "default", Message: "granted sim-0001:gpu0 (isolation exclusive)"})
		l.State = api.LeaseDone
		_ = w.PutLease(l)
		w.AddEvent(api.Event{Kind: "lease.done", Subject: l.ID, Project: "default", Message: "done: released by admin"})
		if err := s.Apply(ctx, &w); err != nil {
			b.Fatal(err)
		}
	}
}
