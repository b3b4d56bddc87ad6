package process

import (
	"fmt"
	"io"
	"sync"
)

// logBuffer keeps a job's output for any number of readers, each from the
// start; readers block for more until the buffer is closed.
type logBuffer struct {
	mu      sync.Mutex
	cond    *sync.Cond
	buf     []byte
	max     int
	dropped int
	closed  bool
}

func newLogBuffer(max int) *logBuffer {
	if max <= 0 {
		max = 64 << 20
	}
	b := &logBuffer{max: max}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := b.max - len(b.buf)
	switch {
	case room >= len(p):
		b.buf = append(b.buf, p...)
	case room > 0:
		b.buf = append(b.buf, p[:room]...)
		b.dropped += len(p) - room
	default:
		b.dropped += len(p)
	}
	b.cond.Broadcast()
	return len(p), nil
}

func (b *logBuffer) Close() {
	b.mu.Lock()
	if b.dropped > 0 {
		b.buf = append(b.buf, fmt.Sprintf("\nkiln: %d bytes of output dropped past the %d-byte limit\n", b.dropped, b.max)...)
	}
	b.closed = true
	b.cond.Broadcast()
	b.mu.Unlock()
}

func (b *logBuffer) reader() io.ReadCloser { return &logReader{b: b} }

type logReader struct {
	b      *logBuffer
	off    int
	closed bool
}

func (r *logReader) Read(p []byte) (int, error) {
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	for r.off >= len(b.buf) && !b.closed && !r.closed {
		b.cond.Wait()
	}
	if r.closed {
		return 0, io.ErrClosedPipe
	}
	if r.off >= len(b.buf) {
		return 0, io.EOF
	}
	n := copy(p, b.buf[r.off:])
	r.off += n
	return n, nil
}

func (r *logReader) Close() error {
	r.b.mu.Lock()
	r.closed = true
	r.b.cond.Broadcast()
	r.b.mu.Unlock()
	return nil
}
