package server

import (
	"context"
	"fmt"
	"sync"

	"kiln.dev/kiln/store"
)

// committer writes the changes of concurrent requests to the store in one
// transaction (group commit). Requests hand over their changes, already
// encoded, while they hold the server's lock, so the store sees them in the
// order they were made; they answer only once wait says their changes are
// durable. Whoever waits first while no transaction is under way writes
// everything queued so far (a background writer does it for changes nobody
// waits for); the others wait for that transaction or the next. The store
// costs one transaction per burst, not per request, and nobody holds the
// server's lock while SQLite writes.
type committer struct {
	st *store.Store

	mu      sync.Mutex
	more    *sync.Cond // the background writer waits for work
	written *sync.Cond // requests wait for their changes
	queue   []*store.Writes
	queued  uint64 // sequence number of the last change handed over
	done    uint64 // ... and of the last one durable
	writing bool   // a transaction is under way
	err     error  // the store failed: nothing more is written
	closed  bool
	exited  chan struct{}
}

func newCommitter(st *store.Store) *committer {
	c := &committer{st: st, exited: make(chan struct{})}
	c.more = sync.NewCond(&c.mu)
	c.written = sync.NewCond(&c.mu)
	go c.run()
	return c
}

// enqueue hands over changes and returns their sequence number.
func (c *committer) enqueue(w *store.Writes) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.closed {
		return 0, fmt.Errorf("server closed")
	}
	c.queued++
	c.queue = append(c.queue, w)
	c.more.Signal()
	return c.queued, nil
}

// wait returns once the changes up to seq are durable, or the store failed.
func (c *committer) wait(seq uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.done < seq && c.err == nil {
		if !c.writing && len(c.queue) > 0 {
			c.write()
			continue
		}
		c.written.Wait()
	}
	if c.done >= seq {
		return nil
	}
	return c.err
}

// write writes everything queued in one transaction; c.mu is held and let
// go meanwhile.
func (c *committer) write() {
	c.writing = true
	ws, upto := c.queue, c.queued
	c.queue = nil
	c.mu.Unlock()
	err := c.st.Apply(context.Background(), ws...)
	c.mu.Lock()
	c.writing = false
	if err != nil {
		c.err = fmt.Errorf("the store failed, kiln server changes nothing more until restarted: %w", err)
		c.queue = nil
	} else {
		c.done = upto
	}
	c.written.Broadcast()
	c.more.Signal() // more may have come meanwhile
}

// failed is the store's error, if it failed.
func (c *committer) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// run writes the changes nobody waits for (the ticker's).
func (c *committer) run() {
	defer close(c.exited)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for (len(c.queue) == 0 || c.writing) && !c.closed && c.err == nil {
			c.more.Wait()
		}
		if c.err != nil {
			return
		}
		if len(c.queue) == 0 && !c.writing {
			return // closed and nothing left
		}
		if c.writing {
			c.written.Wait()
			continue
		}
		c.write()
	}
}

// close writes what is queued and stops the background writer.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
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
