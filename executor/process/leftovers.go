package process

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kiln.dev/kiln/executor"
)

// record is what the executor keeps of a running job in its StateDir, so
// that the jobs of an agent that crashed can be found and stopped when it
// starts again.
type record struct {
	Job   string `json:"job"`
	Lease string `json:"lease,omitempty"`
	// PID is the job's process, also its process group.
	PID int `json:"pid"`
	// Start is the process's start time in clock ticks since boot
	// (/proc/<pid>/stat field 22): a PID the kernel gave to another
	// process since has another start time.
	Start uint64 `json:"start"`
}

// recordPath is the file of a job's record.
func (e *Executor) recordPath(job string) string {
	return filepath.Join(e.StateDir, filepath.Base(job)+".json")
}

// writeRecord notes a started job (atomically: a crash leaves the old file
// or the new one).
func (e *Executor) writeRecord(r record) error {
	if err := os.MkdirAll(e.StateDir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(e.StateDir, 0o700); err != nil { // also when it was made wider
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p := e.recordPath(r.Job)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// procStart reads a process's start time, in clock ticks since boot.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStatStart(b)
}

// parseStatStart reads field 22 (starttime) of /proc/<pid>/stat. The
// command (field 2) is in parentheses and may hold spaces and
// parentheses itself: the fields are counted from the last ')'.
func parseStatStart(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("stat: no command field")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return 0, fmt.Errorf("stat: %d fields after the command, want 20 or more", len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// procState is a process's state letter ("Z" for a zombie), "" when it is
// gone.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

var _ executor.Reaper = (*Executor)(nil)

// Reap finds the jobs a previous run left running (the agent crashed or
// was killed: its jobs, each in its own process group, outlived it) and
// stops them: SIGTERM to each job's process group, SIGKILL after grace. It
// returns once they are gone, so that their GPUs are free when the agent
// tells the server what runs. A PID that now belongs to another process
// (its start time differs) is left alone. Without a StateDir there is
// nothing to find.
func (e *Executor) Reap(ctx context.Context, grace time.Duration) ([]executor.Leftover, error) {
	out, err := e.reapRecords(ctx, grace)
	if e.Sandbox != nil {
		// What escaped its process group (and, without a PID namespace,
		// outlived its init) still runs under a job uid: nothing of a
		// previous run may keep a GPU or a uid the next lease gets.
		if sb := e.sandboxDefaults(); sb.Users != UsersFixed {
			// Not those another executor of this process gave out.
			for uid := range uidsOfProcesses() {
				if uid >= sb.FirstUID && uid <= sb.LastUID && !jobUsers.has(uid) {
					killUID(uid)
				}
			}
			if ents, rerr := os.ReadDir(sb.WorkRoot); rerr == nil {
				for _, ent := range ents {
					_ = os.RemoveAll(filepath.Join(sb.WorkRoot, ent.Name()))
				}
			}
		}
	}
	return out, err
}

func (e *Executor) reapRecords(ctx context.Context, grace time.Duration) ([]executor.Leftover, error) {
	if e.StateDir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(e.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the job records in %s: %w", e.StateDir, err)
	}
	var recs []record
	var errs []error
	for _, ent := range ents {
		name := ent.Name()
		p := filepath.Join(e.StateDir, name)
		if strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(p)
			continue
		}
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r record
		if err := json.Unmarshal(b, &r); err != nil || r.PID <= 1 {
			errs = append(errs, fmt.Errorf("job record %s cannot be read; removed", p))
			_ = os.Remove(p)
			continue
		}
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Job < recs[j].Job })
	var out []executor.Leftover
	var live []record
	for _, r := range recs {
		lo := executor.Leftover{Job: r.Job, Lease: r.Lease}
		start, err := procStart(r.PID)
		switch {
		case err != nil:
			// The leader is gone; members of its group may be left (a
			// pgid is not reused while any member lives).
			if syscall.Kill(-r.PID, syscall.SIGKILL) == nil {
				lo.Stopped = true
			}
		case start != r.Start:
			// The PID is another process's now: not ours to stop.
		default:
			lo.Stopped = true
			_ = syscall.Kill(-r.PID, syscall.SIGTERM)
			live = append(live, r)
		}
		out = append(out, lo)
	}
	deadline := time.Now().Add(grace)
	killed := false
	for len(live) > 0 {
		var still []record
		for _, r := range live {
			if s, err := procStart(r.PID); err == nil && s == r.Start && procState(r.PID) != "Z" {
				still = append(still, r)
			} else {
				_ = syscall.Kill(-r.PID, syscall.SIGKILL) // what it left in its group
			}
		}
		live = still
		if len(live) == 0 {
			break
		}
		if !killed && time.Now().After(deadline) {
			for _, r := range live {
				_ = syscall.Kill(-r.PID, syscall.SIGKILL)
			}
			killed = true
			deadline = time.Now().Add(10 * time.Second)
		} else if killed && time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("%d leftover jobs did not end after SIGKILL", len(live)))
			break
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	gone := map[string]bool{}
	for _, r := range recs {
		gone[r.Job] = true
	}
	for _, r := range live {
		gone[r.Job] = false
	}
	for job, g := range gone {
		if g {
			_ = os.Remove(e.recordPath(job))
		}
	}
	return out, errors.Join(errs...)
}
