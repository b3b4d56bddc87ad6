package server

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/store"
)

// countingStore records the transactions a committer writes: how many
// callers' Writes each one carried.
type countingStore struct {
	mu  sync.Mutex
	txs []int
}

func (c *countingStore) Apply(_ context.Context, ws ...*store.Writes) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.txs = append(c.txs, len(ws))
	return nil
}

func (c *countingStore) transactions() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.txs...)
}

// commitOne hands over one change and waits until it is written.
func commitOne(t *testing.T, c *committer) {
	t.Helper()
	seq, err := c.enqueue(&store.Writes{})
	if err != nil {
		t.Error(err)
		return
	}
	if err := c.wait(seq); err != nil {
		t.Error(err)
	}
}

// TestCommitGapWritesALoneChangeAtOnce: on an idle server a change does
// not wait for the gap (an hour here: the test would hang).
func TestCommitGapWritesALoneChangeAtOnce(t *testing.T) {
	st := &countingStore{}
	c := newCommitter(st, time.Hour, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.close()
	done := make(chan struct{})
	go func() { commitOne(t, c); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a lone change waited for the commit gap")
	}
	if got := st.transactions(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("transactions %v, want one of one change", got)
	}
}

// TestCommitGapGroupsChangesUnderLoad: changes handed over within the gap
// after a transaction share the next one, instead of one each.
func TestCommitGapGroupsChangesUnderLoad(t *testing.T) {
	st := &countingStore{}
	c := newCommitter(st, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.close()
	commitOne(t, c) // the first goes at once, and starts the gap
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); commitOne(t, c) }()
	}
	wg.Wait()
	if got := st.transactions(); len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Fatalf("transactions %v, want [1 3]: the three changes within the gap share one", got)
	}
}
