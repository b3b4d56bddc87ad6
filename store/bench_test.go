package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"kiln.dev/kiln/api"
)

// BenchmarkApplyGrantRelease writes what the server writes for a lease
// granted and released (the lease twice, three events, the project's
// usage), with the grants of batch requests in one transaction and then
// their releases in another, as the server's group commit does when that
// many requests arrive together. ns/op is per lease:
//
//	go test -run '^$' -bench ApplyGrantRelease ./store
func BenchmarkApplyGrantRelease(b *testing.B) {
	for _, batch := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { applyGrantRelease(b, batch) })
	}
}

func applyGrantRelease(b *testing.B, batch int) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "kiln.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	start := time.Now().UTC().Truncate(time.Millisecond)
	grants, releases := make([]*Writes, batch), make([]*Writes, batch)
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		for k := range batch {
			grants[k], releases[k] = grantReleaseWrites(b, start, i+k)
		}
		if err := s.Apply(ctx, grants...); err != nil {
			b.Fatal(err)
		}
		if err := s.Apply(ctx, releases...); err != nil {
			b.Fatal(err)
		}
	}
}

// grantReleaseWrites are the server's writes for lease i's grant and its
// release.
func grantReleaseWrites(b *testing.B, start time.Time, i int) (grant, release *Writes) {
	now := start.Add(time.Duration(i) * time.Millisecond)
	ends := now.Add(24 * time.Hour)
	id := fmt.Sprintf("l-%09d", i)
	l := &api.Lease{ID: id, Project: "default", User: "u-admin", State: api.LeaseGranted,
		Request: api.LeaseRequest{Project: "default", GPUs: 1}, Isolation: "exclusive",
		Allocations: []api.Allocation{{Node: "n0042", Devices: []api.DeviceGrant{{ID: "gpu3", Vendor: "nvidia", Index: 3,
			PCIAddress: "0000:1b:00.0", Model: "NVIDIA H100 80GB HBM3", MilliGPU: 1000, MemoryBytes: 85899345920, Isolation: "exclusive"}}}},
		CreatedAt: now, GrantedAt: &now, EndsAt: &ends, GPUs: 1}
	grant, release = &Writes{}, &Writes{}
	if err := grant.PutLease(l); err != nil {
		b.Fatal(err)
	}
	grant.AddEvent(api.Event{At: now, Kind: "lease.created", Subject: id, Project: "default", Message: "u-admin asks for 1 GPU"})
	grant.AddEvent(api.Event{At: now, Kind: "lease.granted", Subject: id, Project: "default", Message: "granted n0042:gpu3 (isolation exclusive)"})
	l.State, l.EndedAt, l.Reason = api.LeaseDone, &now, "released by u-admin"
	if err := release.PutLease(l); err != nil {
		b.Fatal(err)
	}
	release.AddEvent(api.Event{At: now, Kind: "lease.done", Subject: id, Project: "default", Message: "done: released by u-admin"})
	release.AddUsage("default", start, 0.001)
	return grant, release
}
