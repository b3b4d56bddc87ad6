package discover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/snapshot"
)

// Bundle layout. A record bundle is a directory holding:
//
//	kiln-record.json  the manifest (recordManifest)
//	sysfs/            a copy of exactly the files discovery read, under
//	                  their paths from the root ("sysfs/sys/bus/pci/...",
//	                  "sysfs/proc/meminfo", "sysfs/etc/os-release"); the
//	                  /sys/bus/pci/devices entries stay relative symlinks
//	                  into sysfs/sys/devices/pci...
//	nvml.json         NVML readings, when NVML was available
//	kernel.log        the kernel log records read, one per line
const (
	bundleManifest  = "kiln-record.json"
	bundleSysfs     = "sysfs"
	bundleNVML      = "nvml.json"
	bundleKernelLog = "kernel.log"
	// keepFile marks a recorded directory that would otherwise be empty.
	keepFile = ".keep"
	// bundleFormat is the version of the bundle layout.
	bundleFormat = 1
)

// recordManifest is kiln-record.json.
type recordManifest struct {
	// Format is the bundle layout version.
	Format int `json:"kiln_record"`
	// SchemaVersion is the snapshot schema of the kiln that recorded.
	SchemaVersion int       `json:"schema_version"`
	RecordedAt    time.Time `json:"recorded_at"`
	Hostname      string    `json:"hostname,omitempty"`
	// Arch is the machine architecture when it was not readable as a file.
	Arch string `json:"arch,omitempty"`
	// Live is true when the recording read this machine's own root ("/").
	Live bool `json:"live"`
	// Files, Links and Dirs count what sysfs/ holds.
	Files int `json:"files"`
	Links int `json:"links"`
	Dirs  int `json:"dirs"`
	// NVML and KernelLog say whether nvml.json and kernel.log were written.
	NVML      bool `json:"nvml"`
	KernelLog bool `json:"kernel_log"`
	// Notes are the notes discovery made while recording.
	Notes []string `json:"notes,omitempty"`
}

// Record runs discovery as Run does and writes a bundle to dir that
// Replay turns back into the same snapshot. dir is created; existing files
// in it are overwritten.
func Record(ctx context.Context, opts Options, dir string) error {
	rec := newRecording()
	s, extra, err := run(ctx, opts, rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	sysDir := filepath.Join(dir, bundleSysfs)
	if err := os.RemoveAll(sysDir); err != nil {
		return fmt.Errorf("record: clearing %s: %w", sysDir, err)
	}
	if err := rec.write(sysDir); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	m := recordManifest{
		Format:        bundleFormat,
		SchemaVersion: snapshot.SchemaVersion,
		RecordedAt:    s.CollectedAt,
		Hostname:      s.Host.Hostname,
		Live:          opts.root() == "/",
		Files:         len(rec.files),
		Links:         len(rec.links),
		Dirs:          len(rec.dirs),
	}
	if extra.archNotFromFile {
		m.Arch = s.Host.Arch
	}
	for _, n := range s.Notes {
		m.Notes = append(m.Notes, n.Source+": "+n.Message)
	}
	nvmlPath := filepath.Join(dir, bundleNVML)
	_ = os.Remove(nvmlPath)
	if extra.nvml != nil {
		b, err := json.MarshalIndent(extra.nvml, "", "  ")
		if err != nil {
			return fmt.Errorf("record: NVML readings: %w", err)
		}
		if err := os.WriteFile(nvmlPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("record: %w", err)
		}
		m.NVML = true
	}
	logPath := filepath.Join(dir, bundleKernelLog)
	_ = os.Remove(logPath)
	if extra.kernelLogRead {
		data := strings.Join(extra.kernelLog, "\n")
		if data != "" {
			data += "\n"
		}
		if err := os.WriteFile(logPath, []byte(data), 0o644); err != nil {
			return fmt.Errorf("record: %w", err)
		}
		m.KernelLog = true
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("record: manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, bundleManifest), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	return nil
}

// IsBundle says whether dir holds a record bundle written by Record.
func IsBundle(dir string) bool {
	m, err := readManifest(dir)
	if err != nil || m.Format < 1 {
		return false
	}
	st, err := os.Stat(filepath.Join(dir, bundleSysfs))
	return err == nil && st.IsDir()
}

func readManifest(dir string) (*recordManifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, bundleManifest))
	if err != nil {
		return nil, err
	}
	var m recordManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", bundleManifest, err)
	}
	return &m, nil
}

// Replay runs discovery over a bundle written by Record: the files under
// dir/sysfs stand for the machine's root, NVML readings come from
// nvml.json and the kernel log from kernel.log.
func Replay(ctx context.Context, dir string) (*snapshot.Snapshot, error) {
	m, err := readManifest(dir)
	if err != nil {
		return nil, fmt.Errorf("replay %s: not a kiln record bundle: %w", dir, err)
	}
	if m.Format > bundleFormat {
		return nil, fmt.Errorf("replay %s: bundle format %d is newer than this kiln understands (%d): upgrade kiln", dir, m.Format, bundleFormat)
	}
	opts := Options{
		Root:        filepath.Join(dir, bundleSysfs),
		SkipNVML:    true,
		replay:      true,
		arch:        m.Arch,
		collected:   m.RecordedAt,
		noKernelLog: !m.KernelLog,
	}
	if m.KernelLog {
		opts.KernelLog = filepath.Join(dir, bundleKernelLog)
	}
	if m.NVML {
		b, err := os.ReadFile(filepath.Join(dir, bundleNVML))
		if err != nil {
			return nil, fmt.Errorf("replay %s: %w", dir, err)
		}
		var r NVMLReadings
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("replay %s: %s: %w", dir, bundleNVML, err)
		}
		opts.nvml = &r
	}
	s, _, err := run(ctx, opts, nil)
	if err != nil {
		return nil, err
	}
	s.Sources = append(s.Sources, snapshot.Source{Kind: "record", Path: dir})
	return s, nil
}

// reader reads files under a root directory and, when recording, keeps a
// copy of every file, link and directory it touched.
type reader struct {
	root string
	rec  *recording
}

func (r *reader) abs(rel string) string {
	return filepath.Join(r.root, filepath.FromSlash(strings.TrimPrefix(rel, "/")))
}

// readFile reads a file; files larger than maxFile are cut.
func (r *reader) readFile(rel string) ([]byte, error) {
	b, err := os.ReadFile(r.abs(rel))
	if err != nil {
		return nil, err
	}
	if len(b) > maxFile {
		b = b[:maxFile]
	}
	r.rec.addFile(rel, b)
	return b, nil
}

// maxFile bounds any one file kiln reads (sysfs attributes are at most a
// page; config space is 4 KiB; /proc/cpuinfo of a large host is ~1 MiB).
const maxFile = 8 << 20

// readString reads a small text file and trims it. ok is false when the
// file is absent or unreadable.
func (r *reader) readString(rel string) (string, bool) {
	b, err := r.readFile(rel)
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

func (r *reader) readLink(rel string) (string, error) {
	t, err := os.Readlink(r.abs(rel))
	if err != nil {
		return "", err
	}
	r.rec.addLink(rel, t)
	return t, nil
}

func (r *reader) readDir(rel string) ([]fs.DirEntry, error) {
	es, err := os.ReadDir(r.abs(rel))
	if err != nil {
		return nil, err
	}
	r.rec.addDir(rel)
	return es, nil
}

// exists says whether a path exists. When recording, a directory is kept
// as a directory and anything else as an empty file: kiln only looked at
// its presence.
func (r *reader) exists(rel string) bool {
	st, err := os.Stat(r.abs(rel))
	if err != nil {
		return false
	}
	if st.IsDir() {
		r.rec.addDir(rel)
	} else {
		r.rec.addFile(rel, nil)
	}
	return true
}

// markDir keeps a directory in the recording whose name kiln used.
func (r *reader) markDir(rel string) { r.rec.addDir(rel) }

// recording is the set of paths a discovery run read.
type recording struct {
	mu    sync.Mutex
	files map[string][]byte
	links map[string]string
	dirs  map[string]bool
}

func newRecording() *recording {
	return &recording{files: map[string][]byte{}, links: map[string]string{}, dirs: map[string]bool{}}
}

func cleanRel(rel string) string {
	return strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(rel)), "/")
}

func (rc *recording) addFile(rel string, b []byte) {
	if rc == nil {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.files[cleanRel(rel)] = append([]byte(nil), b...)
}

func (rc *recording) addLink(rel, target string) {
	if rc == nil {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rel = cleanRel(rel)
	if path.IsAbs(target) {
		// Keep the bundle self-contained: an absolute target becomes
		// relative to the link's directory within the root.
		if t, err := filepath.Rel(path.Dir("/"+rel), path.Clean(target)); err == nil {
			target = filepath.ToSlash(t)
		}
	}
	rc.links[rel] = target
}

func (rc *recording) addDir(rel string) {
	if rc == nil {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.dirs[cleanRel(rel)] = true
}

// write lays the recording out under dir: directories, then files, then
// symbolic links (so that links into recorded directories resolve).
func (rc *recording) write(dir string) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	under := func(rel string) string { return filepath.Join(dir, filepath.FromSlash(rel)) }
	// A path read through a recorded link would be written twice; the
	// walker reads devices through their resolved paths, so this only
	// guards against surprises.
	throughLink := func(rel string) bool {
		for p := path.Dir(rel); p != "." && p != "/"; p = path.Dir(p) {
			if _, ok := rc.links[p]; ok {
				return true
			}
		}
		return false
	}
	for _, d := range sortedKeys(rc.dirs) {
		if _, isLink := rc.links[d]; isLink || throughLink(d) {
			continue
		}
		if err := os.MkdirAll(under(d), 0o755); err != nil {
			return err
		}
	}
	defer func() {
		// Version control keeps no empty directories, yet an empty
		// directory kiln listed (net/eth0, /proc) is data: give each one
		// a marker file that no reader takes for an entry.
		for _, d := range sortedKeys(rc.dirs) {
			if es, err := os.ReadDir(under(d)); err == nil && len(es) == 0 {
				_ = os.WriteFile(filepath.Join(under(d), keepFile), nil, 0o644)
			}
		}
	}()
	for _, f := range sortedKeys(rc.files) {
		if throughLink(f) || rc.dirs[f] {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(under(f)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(under(f), rc.files[f], 0o644); err != nil {
			return err
		}
	}
	for _, l := range sortedKeys(rc.links) {
		if throughLink(l) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(under(l)), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(filepath.FromSlash(rc.links[l]), under(l)); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readUnrecorded reads a file without keeping it in a recording (for
// probes such as every /proc/<pid>/comm, of which only a match is kept).
func readUnrecorded(r *reader, rel string) ([]byte, error) {
	return os.ReadFile(r.abs(rel))
}

// recordTree keeps every file under dir in a recording, skipping
// directories named in skip. It serves readers that take an fs.FS (the
// KFD topology), whose reads the recording cannot see one by one.
func recordTree(r *reader, dir string, skip map[string]bool) {
	const maxEntries = 1 << 16
	n := 0
	var walk func(d string, depth int)
	walk = func(d string, depth int) {
		if depth > 8 {
			return
		}
		es, err := r.readDir(d)
		if err != nil {
			return
		}
		for _, e := range es {
			if n++; n > maxEntries {
				return
			}
			p := d + "/" + e.Name()
			switch {
			case e.IsDir():
				if !skip[e.Name()] {
					walk(p, depth+1)
				}
			case e.Type().IsRegular():
				_, _ = r.readFile(p)
			}
		}
	}
	walk(dir, 0)
}
