package server

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"kiln.dev/kiln/lease"
	"kiln.dev/kiln/store"
)

// flush hands the batch to the store's writer and returns its sequence
// number. It is called with s.mu held, so the store sees the changes in the
// order they were made; the caller answers only once durable(seq) says they
// are written, after it let go of the lock. A store that fails stops the
// server from changing anything more.
func (s *Server) flush(b *lease.Changes) (uint64, error) {
	if s.broken != nil {
		return 0, s.broken
	}
	// While the store cannot write (its disk is full), the changes are
	// queued all the same: they are in memory already, and the store gets
	// them in order once it writes again. The caller's durable() answers
	// the error (503) meanwhile; handlers refuse new changes (down).
	if b.Empty() {
		// Nothing new, but the answer may show changes still being written.
		return s.wseq, nil
	}
	w := &store.Writes{}
	err := func() error {
		for _, n := range b.Nodes {
			if err := w.PutNode(nodeToStore(n.Record())); err != nil {
				return err
			}
		}
		for _, d := range b.Drains {
			w.PutDevice(d.Node, d.Device, store.DeviceState{Drained: d.State.Drained, Reason: d.State.Reason})
		}
		for _, l := range b.Leases {
			if err := w.PutLease(l); err != nil {
				return err
			}
		}
		for _, j := range b.Jobs {
			if err := w.PutJob(j); err != nil {
				return err
			}
		}
		for _, u := range b.Usage {
			w.AddUsage(u.Project, u.Period, u.Seconds)
		}
		for _, e := range b.Events {
			w.AddEvent(e)
		}
		return nil
	}()
	var seq uint64
	if err == nil {
		seq, err = s.cm.enqueue(w)
	}
	if err != nil {
		s.broken = fmt.Errorf("the server's changes cannot be encoded, it changes nothing more until restarted: %w", err)
		s.log.Error("store write failed", "err", err)
		return 0, s.broken
	}
	s.wseq = seq
	s.metrics.observe(b)
	for _, id := range b.Ended {
		s.logs.done(id)
		s.tunnels.endJob(id)
		s.proxies.endJob(id)
	}
	s.notify()
	return seq, nil
}

// down says why the server takes no change now: it is closed or broken,
// or its store cannot write (that passes); nil when it takes them. s.mu is
// held.
func (s *Server) down() error {
	if s.broken != nil {
		return s.broken
	}
	if s.cm != nil {
		return s.cm.failed()
	}
	return nil
}

// durable waits until the changes up to seq are written.
func (s *Server) durable(seq uint64) error {
	if seq == 0 {
		return nil
	}
	return s.cm.wait(seq)
}

// flushWait is flush and durable in one, for rare calls that may wait with
// the lock held (the writer never takes it).
func (s *Server) flushWait(b *lease.Changes) error {
	seq, err := s.flush(b)
	if err != nil {
		return err
	}
	return s.durable(seq)
}

// lockForChange takes s.mu for a call that changes state, or answers 503
// (and leaves it) while the server takes no change.
func (s *Server) lockForChange(w http.ResponseWriter) bool {
	s.mu.Lock()
	if err := s.down(); err != nil {
		s.mu.Unlock()
		writeErr(w, http.StatusServiceUnavailable, err)
		return false
	}
	return true
}

// change is answer for a call that changes state: refused (503) while the
// server takes no change.
func (s *Server) change(w http.ResponseWriter, status int, fn func() (any, uint64, error)) {
	s.answer(w, status, func() (any, uint64, error) {
		if err := s.down(); err != nil {
			return nil, 0, withStatus(http.StatusServiceUnavailable, err)
		}
		return fn()
	})
}

// commit hands changes to the store and answers v once they are durable
// (a 503 when the store cannot take them); s.mu is held.
func (s *Server) commit(b *lease.Changes, v any) (any, uint64, error) {
	seq, err := s.flush(b)
	if err != nil {
		return nil, 0, withStatus(http.StatusServiceUnavailable, err)
	}
	return v, seq, nil
}

// written answers a core call's refusal, or writes its changes and waits
// until they are durable (a 503 when they cannot be); true when the caller
// may answer. s.mu is held.
func (s *Server) written(w http.ResponseWriter, b *lease.Changes, err error) bool {
	if err != nil {
		writeErr(w, 0, err)
		return false
	}
	if err := s.flushWait(b); err != nil {
		writeErr(w, http.StatusServiceUnavailable, err)
		return false
	}
	return true
}

// waitFor waits until ch is signalled or d passed; false when ctx ended
// first (the caller went away).
func waitFor(ctx context.Context, ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}
