// Package capture imports the files admins already produce on GPU servers
// (nvidia-smi, lspci, rocm-smi, amd-smi, KFD topology copies, kernel logs,
// fabric manager logs) into Snapshots, so that a machine can be audited
// without reaching it. Several captures of one machine merge into one
// Snapshot.
//
// Each format lives in its own file and registers itself in init, like
// node_exporter's collectors. An importer is a pure function of the bytes it
// is given: it returns a clear error on input it cannot read and never
// panics (each has a fuzz test).
package capture

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// FileImporter reads one capture file.
type FileImporter struct {
	// Kind names the format ("nvidia-smi-q"); it is the Source.Kind of
	// the snapshots it returns.
	Kind string
	// Detect says whether data (the first 64 KiB of the file) is in this
	// format. name is the file's base name, a hint only: detection must
	// work on content.
	Detect func(name string, data []byte) bool
	// Parse turns the file into a Snapshot. It must not panic.
	Parse func(name string, data []byte) (*snapshot.Snapshot, error)
}

// TreeImporter reads a directory capture (a copy of a sysfs subtree).
type TreeImporter struct {
	Kind   string
	Detect func(fsys fs.FS) bool
	Parse  func(fsys fs.FS, name string) (*snapshot.Snapshot, error)
}

var (
	fileImporters []FileImporter
	treeImporters []TreeImporter
)

// RegisterFile adds a file importer. Importers are tried in the order of
// their Kind's name; Detect functions must therefore not overlap.
func RegisterFile(imp FileImporter) {
	fileImporters = append(fileImporters, imp)
	sort.SliceStable(fileImporters, func(i, j int) bool { return fileImporters[i].Kind < fileImporters[j].Kind })
}

// RegisterTree adds a directory importer.
func RegisterTree(imp TreeImporter) {
	treeImporters = append(treeImporters, imp)
	sort.SliceStable(treeImporters, func(i, j int) bool { return treeImporters[i].Kind < treeImporters[j].Kind })
}

// Kinds lists the registered formats.
func Kinds() []string {
	var ks []string
	for _, f := range fileImporters {
		ks = append(ks, f.Kind)
	}
	for _, t := range treeImporters {
		ks = append(ks, t.Kind+" (directory)")
	}
	return ks
}

// detectHead is how much of a file importers see when they detect its
// format: every format kiln reads says what it is in its first lines.
const detectHead = 64 << 10

// maxFile bounds what one capture file may be; real captures are a few MB.
const maxFile = 256 << 20

// ErrUnknownFormat is returned for a file no importer recognises.
var ErrUnknownFormat = errors.New("not a capture format kiln reads")

// ParseBytes detects the format of one file's contents and parses it.
func ParseBytes(name string, data []byte) (*snapshot.Snapshot, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%s: file is empty", name)
	}
	base := path.Base(filepath.ToSlash(name))
	head := data[:min(len(data), detectHead)]
	for _, imp := range fileImporters {
		if imp.Detect(base, head) {
			s, err := imp.Parse(base, data)
			if err != nil {
				return nil, fmt.Errorf("%s: reading as %s: %w", name, imp.Kind, err)
			}
			stamp(s, imp.Kind, name)
			return s, nil
		}
	}
	return nil, fmt.Errorf("%s: %w (formats: %s)", name, ErrUnknownFormat, strings.Join(Kinds(), ", "))
}

// ParseTree detects the format of a directory capture and parses it.
func ParseTree(fsys fs.FS, name string) (*snapshot.Snapshot, error) {
	for _, imp := range treeImporters {
		if imp.Detect(fsys) {
			s, err := imp.Parse(fsys, name)
			if err != nil {
				return nil, fmt.Errorf("%s: reading as %s: %w", name, imp.Kind, err)
			}
			stamp(s, imp.Kind, name)
			return s, nil
		}
	}
	return nil, fmt.Errorf("%s: directory is %w (directory formats: KFD topology copy)", name, ErrUnknownFormat)
}

func stamp(s *snapshot.Snapshot, kind, name string) {
	s.SchemaVersion = snapshot.SchemaVersion
	if len(s.Sources) == 0 {
		s.Sources = []snapshot.Source{{Kind: kind, Path: name}}
	}
	for i := range s.Sources {
		if s.Sources[i].Path == "" {
			s.Sources[i].Path = name
		}
	}
}

// Load reads each path (a file, a directory, or a .tar.gz of a directory),
// parses it, and merges everything into one Snapshot of one machine.
func Load(ctx context.Context, paths ...string) (*snapshot.Snapshot, error) {
	if len(paths) == 0 {
		return nil, errors.New("no capture given")
	}
	var parts []*snapshot.Snapshot
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s, err := loadPath(p)
		if err != nil {
			return nil, err
		}
		parts = append(parts, s)
	}
	return snapshot.Merge(parts...), nil
}

func loadPath(p string) (*snapshot.Snapshot, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	if st.IsDir() {
		return ParseTree(os.DirFS(p), p)
	}
	if st.Size() > maxFile {
		return nil, fmt.Errorf("%s: %d bytes is larger than any capture kiln reads (%d MB)", p, st.Size(), maxFile>>20)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	if isGzip(data) {
		fsys, err := untarGz(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		return ParseTree(fsys, p)
	}
	return ParseBytes(p, data)
}

func isGzip(b []byte) bool { return len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b }

// untarGz unpacks a gzip'd tar into memory. When every entry sits under one
// top folder, that folder becomes the root.
func untarGz(data []byte) (fs.FS, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("not a gzip file: %w", err)
	}
	tr := tar.NewReader(io.LimitReader(zr, maxFile))
	m := map[string][]byte{}
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading tar: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if !fs.ValidPath(name) {
			return nil, fmt.Errorf("tar entry %q: unsafe path", h.Name)
		}
		total += h.Size
		if total > maxFile {
			return nil, fmt.Errorf("tar unpacks to more than %d MB", maxFile>>20)
		}
		// A KFD tree has thousands of small files: each is read into one
		// buffer of its size. Sizes from the header are trusted only up to
		// 1 MB; a larger entry is read as its bytes come.
		var b []byte
		if h.Size <= 1<<20 {
			b = make([]byte, h.Size)
			_, err = io.ReadFull(tr, b)
		} else {
			b, err = io.ReadAll(tr)
		}
		if err != nil {
			return nil, fmt.Errorf("reading tar entry %s: %w", h.Name, err)
		}
		m[name] = b
	}
	if len(m) == 0 {
		return nil, errors.New("tar holds no files")
	}
	// Strip a common top-level folder.
	top := ""
	for name := range m {
		first, _, _ := strings.Cut(name, "/")
		if !strings.Contains(name, "/") || (top != "" && top != first) {
			return newMemFS(m), nil
		}
		top = first
	}
	trimmed := make(map[string][]byte, len(m))
	for name, b := range m {
		trimmed[name[len(top)+1:]] = b
	}
	return newMemFS(trimmed), nil
}
