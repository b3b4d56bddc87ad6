package lease

import (
	"fmt"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// BenchmarkGrantRelease is the core alone granting and releasing one GPU
// on a fleet of 1,000 8-GPU nodes, idle or with half its GPUs held, the way
// the server calls it (no HTTP, no store):
//
//	go test -run '^$' -bench GrantRelease ./lease
func BenchmarkGrantRelease(b *testing.B) {
	for _, held := range []int{0, 4000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) { grantRelease(b, held) })
	}
}

func grantRelease(b *testing.B, held int) {
	nodes := map[string]*snapshot.Snapshot{}
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("n%04d", i)
		nodes[id] = smallNode(id, 8)
	}
	w := newWorld(&testing.T{}, Config{}, nodes, api.Project{Name: "p"}, api.Project{Name: "q"})
	for i := 0; i < held; i++ {
		w.submit("q", gpus(1))
	}
	sub := Submit{Request: api.LeaseRequest{Project: "p", GPUs: 1}, User: "u", Projects: []string{"p"}, Member: func(string) bool { return true }}
	w.cancel(w.submit("p", gpus(1))) // the placer reads the fleet once
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.now = w.now.Add(time.Millisecond)
		l, _, err := w.c.Submit(w.now, sub)
		if err != nil || l.State != api.LeaseGranted {
			b.Fatalf("%v %s %s", err, l.State, l.Reason)
		}
		if _, _, err := w.c.Cancel(w.now, l.ID, "u", false); err != nil {
			b.Fatal(err)
		}
	}
}
