package server

import (
	"io"
	"os"
	"path/filepath"
	"sync"
)

// logHub keeps each job's output in a file under the data directory and
// wakes the readers that follow it.
type logHub struct {
	dir   string
	mu    sync.Mutex
	waits map[string]chan struct{}
}

func newLogHub(dir string) *logHub {
	return &logHub{dir: dir, waits: map[string]chan struct{}{}}
}

func (h *logHub) path(job string) string { return filepath.Join(h.dir, filepath.Base(job)+".log") }

// append adds output to a job's log.
func (h *logHub) append(job string, b []byte) error {
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(h.path(job), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	h.signal(job)
	return err
}

func (h *logHub) signal(job string) {
	h.mu.Lock()
	if ch, ok := h.waits[job]; ok {
		close(ch)
		delete(h.waits, job)
	}
	h.mu.Unlock()
}

// done wakes the followers of a job that ended.
func (h *logHub) done(job string) { h.signal(job) }

// wait returns a channel closed at the next change of the job's log.
func (h *logHub) wait(job string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch, ok := h.waits[job]
	if !ok {
		ch = make(chan struct{})
		h.waits[job] = ch
	}
	return ch
}

// copy writes the log from off to w and returns the bytes written.
func (h *logHub) copy(w io.Writer, job string, off int64) (int64, error) {
	f, err := os.Open(h.path(job))
	if err != nil {
		if os.IsNotExist(err) {
			return 0, nil
		}
		return 0, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	return io.Copy(w, f)
}
