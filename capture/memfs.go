package capture

import (
	"bytes"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
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
	seen := map[string]bool{}
	add := func(dir string, e fs.DirEntry) {
		key := dir + "\x00" + e.Name()
		if seen[key] {
			return
		}
		seen[key] = true
		m.dirs[dir] = append(m.dirs[dir], e)
	}
	for name, data := range files {
		p := name
		isDir := false
		var size int64 = int64(len(data))
		for p != "." {
			dir := path.Dir(p)
			add(dir, memEntry{name: path.Base(p), dir: isDir, size: size})
			if _, ok := m.dirs[p]; isDir && !ok {
				m.dirs[p] = nil
			}
			p, isDir, size = dir, true, 0
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

// Sub returns the tree below dir.
func (m *memFS) Sub(dir string) (fs.FS, error) {
	files := map[string][]byte{}
	prefix := dir + "/"
	for n, b := range m.files {
		if strings.HasPrefix(n, prefix) {
			files[strings.TrimPrefix(n, prefix)] = b
		}
	}
	return newMemFS(files), nil
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
