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
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"kiln.dev/kiln/kmsg"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/unwrap"
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
	// Generic marks a format that is recognised by its lines' shape
	// rather than by a marker of its own (kernel logs): generic formats
	// are tried after every other one, and only where a kernel log may
	// be (not inside another tool's section of a bundle).
	Generic bool
	// Fallback marks a format tried after the specific ones but before
	// the generic ones: the error output of a tool that failed, which is
	// also a line inside other formats.
	Fallback bool
	// ParseReader, when set, reads a file too large to hold in memory
	// as it streams.
	ParseReader func(name string, r io.Reader) (*snapshot.Snapshot, error)
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
// their Kind's name, generic ones last; Detect functions must therefore not
// overlap.
func RegisterFile(imp FileImporter) {
	fileImporters = append(fileImporters, imp)
	sort.SliceStable(fileImporters, func(i, j int) bool {
		a, b := fileImporters[i], fileImporters[j]
		if a.tier() != b.tier() {
			return a.tier() < b.tier()
		}
		return a.Kind < b.Kind
	})
}

func (f FileImporter) tier() int {
	switch {
	case f.Generic:
		return 2
	case f.Fallback:
		return 1
	}
	return 0
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

// ParseBytes detects the format of one file's contents and parses it. The
// content is found inside whatever wraps it (see package unwrap): encodings,
// colours, prompts, and a prefix in front of every line.
func ParseBytes(name string, data []byte) (*snapshot.Snapshot, error) {
	return parseBytes(name, data, true)
}

func parseBytes(name string, data []byte, allowGeneric bool) (*snapshot.Snapshot, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%s: file is empty", name)
	}
	base := path.Base(filepath.ToSlash(name))
	clean := unwrap.Clean(data)
	cands := []candidate{{data: clean.Data, notes: clean.Notes}}
	if stripped, what, ok := unwrap.StripPrefix(clean.Data); ok {
		c := candidate{data: stripped, notes: append(append([]string(nil), clean.Notes...), what)}
		// A kernel log keeps its own per-line headers (they carry the
		// times); every other format is read without the wrapper first.
		if allowGeneric && kmsg.Sniff(clean.Data) {
			cands = append(cands, c)
		} else {
			cands = append([]candidate{c}, cands...)
		}
	}
	// Formats with markers of their own are tried on every candidate before
	// the generic kernel-log reader: a wrapper's timestamps must not make an
	// lspci listing look like a log.
	var firstErr error
	for _, generic := range []bool{false, true} {
		for _, c := range cands {
			head := c.data[:min(len(c.data), detectHead)]
			for _, imp := range fileImporters {
				if imp.Generic != generic || (imp.Generic && !allowGeneric) {
					continue
				}
				if !imp.Detect(base, head) {
					continue
				}
				s, err := imp.Parse(base, c.data)
				if err != nil {
					if firstErr == nil {
						firstErr = fmt.Errorf("%s: reading as %s: %w", name, imp.Kind, err)
					}
					continue
				}
				stamp(s, imp.Kind, name)
				for _, n := range c.notes {
					s.Notes = append(s.Notes, snapshot.Note{Source: imp.Kind, Message: n})
				}
				return s, nil
			}
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, fmt.Errorf("%s: %w (formats: %s)", name, ErrUnknownFormat, strings.Join(Kinds(), ", "))
}

type candidate struct {
	data  []byte
	notes []string
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

// lazy compiles expr on its first use: most kiln commands read no capture,
// and compiling the package's expressions at start cost every one of them
// (init allocations of the package: 197 KB before).
func lazy(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
