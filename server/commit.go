package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"kiln.dev/kiln/store"
)

// committer writes the changes of concurrent requests to the store in one
// transaction (group commit). Requests hand over their changes, already
// encoded, while they hold the server's lock, so the store sees them in the
// order they were made; they answer only once wait says their changes are
// durable. One writer goroutine, woken by each hand-over, writes everything
// queued so far; requests wait for that transaction or the next. The store
// costs one transaction per burst, not per request, and nobody holds the
// server's lock while SQLite writes. The writer is one long-lived goroutine
// rather than whichever request waits first: SQLite needs a deep stack, and
// a request's goroutine would grow one (copying it several times) for every
// transaction it wrote.
//
// While changes keep coming, transactions start at most every gap: the
// writer waits out what is left of it since the last one started, and the
// changes handed over meanwhile go into the next. Under load the store so
// writes a few requests per transaction instead of one (a transaction's
// cost is mostly its pages, which requests share), for at most gap of
// added wait; an idle server writes at once.
//
// A transaction that fails (a full disk) is rolled back whole; its changes
// go back to the head of the queue and the background writer tries again
// every retry interval. Meanwhile waiters get the error (the server answers
// 503) and the server takes no new change; once a write succeeds, the
// store holds everything in the order it was made and the server goes on.
type committer struct {
	st    applier
	log   *slog.Logger
	retry time.Duration
	gap   time.Duration

	mu      sync.Mutex
	more    *sync.Cond // the background writer waits for work
	written *sync.Cond // requests wait for their changes
	queue   []*store.Writes
	queued  uint64                // sequence number of the last change handed over
	done    uint64                // ... and of the last one durable
	writing bool                  // a transaction is under way
	err     error                 // the last transaction failed: the store cannot write now
	failing atomic.Pointer[error] // err, read without the lock
	closed  bool
	last    time.Time // when the last transaction started
	stop    chan struct{}
	exited  chan struct{}
}

// applier writes changes in one transaction (the store).
type applier interface {
	Apply(ctx context.Context, ws ...*store.Writes) error
}

func newCommitter(st applier, gap time.Duration, log *slog.Logger) *committer {
	c := &committer{st: st, log: log, retry: time.Second, gap: gap, stop: make(chan struct{}), exited: make(chan struct{})}
	c.more = sync.NewCond(&c.mu)
	c.written = sync.NewCond(&c.mu)
	go c.run()
	return c
}

// enqueue hands over changes and returns their sequence number; while the
// store cannot write they wait in the queue.
func (c *committer) enqueue(w *store.Writes) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, fmt.Errorf("server closed")
	}
	c.queued++
	c.queue = append(c.queue, w)
	c.more.Signal()
	return c.queued, nil
}

// wait returns once the changes up to seq are durable, or at once with the
// store's error while it cannot write.
func (c *committer) wait(seq uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.done < seq {
		if c.err != nil {
			return c.err
		}
		if c.closed && !c.writing && len(c.queue) == 0 {
			return fmt.Errorf("server closed")
		}
		c.written.Wait()
	}
	return nil
}

// write writes everything queued in one transaction, once the gap since
// the last one passed; c.mu is held and let go meanwhile.
func (c *committer) write() {
	c.writing = true
	if d := time.Until(c.last.Add(c.gap)); d > 0 {
		c.mu.Unlock()
		time.Sleep(d) // what comes meanwhile joins this transaction
		c.mu.Lock()
	}
	c.last = time.Now()
	ws, upto := c.queue, c.queued
	c.queue = nil
	c.mu.Unlock()
	err := c.st.Apply(context.Background(), ws...)
	c.mu.Lock()
	c.writing = false
	if err != nil {
		if c.err == nil {
			c.log.Error("the store cannot write: kiln server answers 503 to changes and tries again every second", "err", err)
		}
		c.err = fmt.Errorf("the store cannot write (is the disk full?); kiln server takes no change until it can, and tries again every %s: %w", c.retry, err)
		failed := c.err
		c.failing.Store(&failed)
		c.queue = append(ws, c.queue...)
	} else {
		if c.err != nil {
			c.log.Warn("the store writes again: kiln server takes changes again")
		}
		c.err = nil
		c.failing.Store(nil)
		c.done = upto
	}
	c.written.Broadcast()
	c.more.Signal() // more may have come meanwhile
}

// failed is the store's error while it cannot write.
func (c *committer) failed() error {
	if p := c.failing.Load(); p != nil {
		return *p
	}
	return nil
}

// run writes the changes handed over, and tries again after a failed
// write.
func (c *committer) run() {
	defer close(c.exited)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for (len(c.queue) == 0 || c.writing) && !c.closed {
			c.more.Wait()
		}
		if c.writing {
			c.written.Wait()
			continue
		}
		if len(c.queue) == 0 {
			return // closed and nothing left
		}
		if c.err != nil {
			c.mu.Unlock()
			t := time.NewTimer(c.retry)
			select {
			case <-t.C:
			case <-c.stop:
			}
			t.Stop()
			c.mu.Lock()
			if c.closed && c.err != nil {
				return // closing while the store cannot write: give up
			}
			if c.writing || len(c.queue) == 0 {
				continue
			}
		}
		c.write()
	}
}

// close writes what is queued and stops the background writer.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	close(c.stop)
	c.more.Signal()
	c.mu.Unlock()
	<-c.exited
	c.mu.Lock()
	if c.err == nil && c.done < c.queued {
		c.err = fmt.Errorf("server closed")
	}
	c.written.Broadcast()
	c.mu.Unlock()
}
