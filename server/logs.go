package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// logHub keeps each job's output in a file under the data directory, counts
// the bytes kept per job and per project (for their limits), and wakes the
// readers that follow it.
type logHub struct {
	dir   string
	mu    sync.Mutex
	waits map[string]chan struct{}
	// sizes are the bytes kept of each job that wrote since the start (a
	// job's first chunk reads its file's size); byProject those of each
	// project, counted at start from the files; cut are the jobs whose
	// output was cut at a limit.
	sizes     map[string]int64
	byProject map[string]int64
	cut       map[string]bool
}

func newLogHub(dir string) *logHub {
	return &logHub{dir: dir, waits: map[string]chan struct{}{}, sizes: map[string]int64{}, byProject: map[string]int64{}, cut: map[string]bool{}}
}

// count adds up the logs already on disk per project; projects maps jobs
// to their project.
func (h *logHub) count(projects map[string]string) {
	ents, err := os.ReadDir(h.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		job, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok {
			continue
		}
		if info, err := e.Info(); err == nil {
			h.byProject[projects[job]] += info.Size()
		}
	}
}

func (h *logHub) path(job string) string { return filepath.Join(h.dir, filepath.Base(job)+".log") }

// errLogLimit is the answer to output beyond a log limit.
var errLogLimit = errors.New("log limit reached")

// errDiskFull is a write that failed for want of space.
var errDiskFull = errors.New("the server's disk is full")

// append adds output to a job's log, at most up to the job's and the
// project's limits: the part beyond is dropped, a line in the log says so,
// and errLogLimit (wrapped, with the limit) is returned.
func (h *logHub) append(job, project string, b []byte, perJob, perProject int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cut[job] {
		return fmt.Errorf("%w: job %s's output was cut already", errLogLimit, job)
	}
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return err
	}
	size, ok := h.sizes[job]
	if !ok {
		if st, err := os.Stat(h.path(job)); err == nil {
			size = st.Size()
		}
	}
	room := perJob - size
	which := fmt.Sprintf("the job's limit of %d bytes (max_log_bytes_per_job)", perJob)
	if pr := perProject - h.byProject[project]; pr < room {
		room = pr
		which = fmt.Sprintf("project %s's limit of %d bytes for its logs (max_log_bytes)", project, perProject)
	}
	var limitErr error
	if int64(len(b)) > room {
		b = b[:max(room, 0)]
		b = append(b[:len(b):len(b)], fmt.Sprintf("\nkiln: output cut here: %s was reached\n", which)...)
		limitErr = fmt.Errorf("%w: %s", errLogLimit, which)
		h.cut[job] = true // kept after the job ends: late chunks are dropped too
	}
	f, err := os.OpenFile(h.path(job), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return diskErr(err)
	}
	n, err := f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	h.sizes[job] = size + int64(n)
	h.byProject[project] += int64(n)
	h.signalLocked(job)
	if err != nil {
		return diskErr(err)
	}
	return limitErr
}

func diskErr(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %v", errDiskFull, err)
	}
	return err
}

func (h *logHub) signalLocked(job string) {
	if ch, ok := h.waits[job]; ok {
		close(ch)
		delete(h.waits, job)
	}
}

// done wakes the followers of a job that ended and forgets its count.
func (h *logHub) done(job string) {
	h.mu.Lock()
	h.signalLocked(job)
	delete(h.sizes, job)
	h.mu.Unlock()
}

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
