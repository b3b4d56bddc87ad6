package capture

import (
	"bytes"
	"io"
	"io/fs"
	"path"
	"sort"
	"time"
)

// memFS is a read-only in-memory file system for unpacked tarballs. Unlike
// testing/fstest.MapFS it indexes directories once, so walking a KFD tree of
// hundreds of small files stays linear.
type memFS struct {
	files map[string][]byte
	dirs  map[string][]fs.DirEntry
}

func newMemFS(files map[string][]byte) *memFS {
	m := &memFS{files: files, dirs: map[string][]fs.DirEntry{".": nil}}
	registered := map[string]bool{".": true}
	for name, data := range files {
		dir := path.Dir(name)
		m.dirs[dir] = append(m.dirs[dir], memEntry{name: path.Base(name), size: int64(len(data))})
		// Register the directories up the chain, each once.
		for dir != "." && !registered[dir] {
			registered[dir] = true
			parent := path.Dir(dir)
			if _, ok := m.dirs[dir]; !ok {
				m.dirs[dir] = nil
			}
			m.dirs[parent] = append(m.dirs[parent], memEntry{name: path.Base(dir), dir: true})
			dir = parent
		}
	}
	for _, es := range m.dirs {
		sort.Slice(es, func(i, j int) bool { return es[i].Name() < es[j].Name() })
	}
	return m
}

func (m *memFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if b, ok := m.files[name]; ok {
		return &memFile{memEntry: memEntry{name: path.Base(name), size: int64(len(b))}, r: bytes.NewReader(b)}, nil
	}
	if es, ok := m.dirs[name]; ok {
		return &memFile{memEntry: memEntry{name: path.Base(name), dir: true}, entries: es}, nil
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

func (m *memFS) ReadFile(name string) ([]byte, error) {
	if b, ok := m.files[name]; ok {
		return append([]byte(nil), b...), nil
	}
	return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
}

func (m *memFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if es, ok := m.dirs[name]; ok {
		return append([]fs.DirEntry(nil), es...), nil
	}
	return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
}

type memEntry struct {
	name string
	dir  bool
	size int64
}

func (e memEntry) Name() string { return e.name }
func (e memEntry) IsDir() bool  { return e.dir }
func (e memEntry) Type() fs.FileMode {
	if e.dir {
		return fs.ModeDir
	}
	return 0
}
func (e memEntry) Info() (fs.FileInfo, error) { return e, nil }
func (e memEntry) Size() int64                { return e.size }
func (e memEntry) Mode() fs.FileMode {
	if e.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
func (e memEntry) ModTime() time.Time { return time.Time{} }
func (e memEntry) Sys() any           { return nil }

type memFile struct {
	memEntry
	r       *bytes.Reader
	entries []fs.DirEntry
	off     int
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.memEntry, nil }
func (f *memFile) Close() error               { return nil }
func (f *memFile) Read(b []byte) (int, error) {
	if f.r == nil {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrInvalid}
	}
	return f.r.Read(b)
}

// ReadDir implements fs.ReadDirFile.
func (f *memFile) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := f.entries[f.off:]
	if n <= 0 {
		f.off = len(f.entries)
		return append([]fs.DirEntry(nil), rest...), nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(rest))
	f.off += n
	return append([]fs.DirEntry(nil), rest[:n]...), nil
}
