package capture

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/unwrap"
)

// Part is what one input gave: a file, a directory capture, or one capture
// inside a bundle (a section of an nvidia-bug-report.log, a file of an
// sosreport or of a folder of mixed captures).
type Part struct {
	// Path names the input ("bug.log", "bug.log: /usr/bin/lspci -nn").
	Path string `json:"path"`
	// Kind is the format read; "" when reading failed.
	Kind string `json:"kind,omitempty"`
	// Bundle is the bundle the part came from; parts of one bundle are
	// one machine whatever they say.
	Bundle   string             `json:"bundle,omitempty"`
	Snapshot *snapshot.Snapshot `json:"-"`
	// Err says why the input could not be read.
	Err error `json:"-"`
}

// Load reads each path (a file, a directory, a compressed file or tarball),
// parses it, and merges everything into one Snapshot of one machine. It
// fails on the first input it cannot read; Read reports each input instead.
func Load(ctx context.Context, paths ...string) (*snapshot.Snapshot, error) {
	if len(paths) == 0 {
		return nil, errors.New("no capture given")
	}
	var snaps []*snapshot.Snapshot
	for _, p := range Read(ctx, paths...) {
		if p.Err != nil {
			return nil, p.Err
		}
		snaps = append(snaps, p.Snapshot)
	}
	return snapshot.Merge(snaps...), nil
}

// Read reads each path into the parts it holds. A path that cannot be read
// gives a part with Err set; the others are read all the same.
func Read(ctx context.Context, paths ...string) []Part {
	var out []Part
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			out = append(out, Part{Path: p, Err: err})
			continue
		}
		out = append(out, readPath(ctx, p)...)
	}
	return out
}

// Limits on bundles: an sosreport holds thousands of files, most of them
// no capture.
const (
	maxBundleFiles = 20000
	// maxMemberFile is the largest member of a folder or tarball read.
	maxMemberFile = 64 << 20
	// streamAbove is the size from which a kernel log is read as it
	// streams instead of whole.
	streamAbove = 8 << 20
)

func readPath(ctx context.Context, p string) []Part {
	if p == "-" {
		// Standard input: a capture piped in (kubectl logs | kiln doctor
		// --from -).
		data, err := io.ReadAll(io.LimitReader(os.Stdin, maxFile+1))
		if err != nil {
			return []Part{{Path: "stdin", Err: fmt.Errorf("reading standard input: %w", err)}}
		}
		if len(data) > maxFile {
			return []Part{{Path: "stdin", Err: fmt.Errorf("standard input: more than %d MB", maxFile>>20)}}
		}
		return readData(ctx, "stdin", data, "")
	}
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return []Part{{Path: p, Err: fmt.Errorf("%s: no such file or directory", p)}}
		}
		return []Part{{Path: p, Err: fmt.Errorf("capture: %w", err)}}
	}
	if st.IsDir() {
		return readTree(ctx, os.DirFS(p), p, "")
	}
	if st.Size() > maxFile {
		return []Part{{Path: p, Err: fmt.Errorf("%s: %d bytes is larger than any capture kiln reads (%d MB)", p, st.Size(), maxFile>>20)}}
	}
	f, err := os.Open(p)
	if err != nil {
		return []Part{{Path: p, Err: fmt.Errorf("capture: %w", err)}}
	}
	defer f.Close()
	if st.Size() > streamAbove {
		if part, ok := streamKernelLog(f, p); ok {
			return []Part{part}
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return []Part{{Path: p, Err: fmt.Errorf("capture: %w", err)}}
		}
	}
	// Compressed files and tarballs are unpacked as they stream: a KFD
	// tree holds thousands of small files, and a whole copy of the
	// unpacked tar beside the files read from it doubled the memory.
	br := bufio.NewReaderSize(f, 4<<10)
	head, _ := br.Peek(512)
	var r io.Reader = br
	if isCompressed(head) {
		dr, closeFn, err := decompressor(br, head)
		if err != nil {
			return []Part{{Path: p, Err: fmt.Errorf("%s: %w", p, err)}}
		}
		defer closeFn()
		db := bufio.NewReaderSize(dr, 64<<10)
		r = db
		head, _ = db.Peek(512)
	}
	if isTar(head) {
		fsys, err := untarReader(io.LimitReader(r, maxFile+1))
		if err != nil {
			return []Part{{Path: p, Err: fmt.Errorf("%s: %w", p, err)}}
		}
		return readTree(ctx, fsys, p, "")
	}
	// A plain file is read into a buffer of its size, not one grown by
	// doubling.
	buf := bytes.NewBuffer(make([]byte, 0, min(st.Size(), maxFile)+bytes.MinRead))
	_, err = buf.ReadFrom(io.LimitReader(r, maxFile+1))
	data := buf.Bytes()
	if err != nil {
		return []Part{{Path: p, Err: fmt.Errorf("%s: %w", p, err)}}
	}
	if len(data) > maxFile {
		return []Part{{Path: p, Err: fmt.Errorf("%s: unpacks to more than %d MB", p, maxFile>>20)}}
	}
	return readData(ctx, p, data, "")
}

// streamKernelLog reads a large file as a kernel log when its start says it
// is one, without holding it in memory.
func streamKernelLog(f *os.File, name string) (Part, bool) {
	head := make([]byte, detectHead)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if isCompressed(head) || hasBugReportHeader(head) {
		return Part{}, false
	}
	for _, imp := range fileImporters {
		if imp.ParseReader == nil {
			continue
		}
		if !imp.Detect(path.Base(name), head) {
			return Part{}, false
		}
		// Other formats claim their files first.
		for _, o := range fileImporters {
			if o.Kind != imp.Kind && !o.Generic && o.Detect(path.Base(name), head) {
				return Part{}, false
			}
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return Part{Path: name, Err: fmt.Errorf("capture: %w", err)}, true
		}
		s, err := imp.ParseReader(path.Base(name), f)
		if err != nil {
			return Part{Path: name, Err: fmt.Errorf("%s: reading as %s: %w", name, imp.Kind, err)}, true
		}
		stamp(s, imp.Kind, name)
		return Part{Path: name, Kind: imp.Kind, Snapshot: s}, true
	}
	return Part{}, false
}

// readData reads one file's bytes: a compressed file or tarball is opened,
// a bundle is split into its captures, anything else is one capture.
func readData(ctx context.Context, name string, data []byte, bundle string) []Part {
	if isCompressed(data) {
		plain, err := decompress(data)
		if err != nil {
			return []Part{{Path: name, Err: fmt.Errorf("%s: %w", name, err)}}
		}
		data = plain
	}
	if isTar(data) {
		fsys, err := untar(data)
		if err != nil {
			return []Part{{Path: name, Err: fmt.Errorf("%s: %w", name, err)}}
		}
		return readTree(ctx, fsys, name, bundle)
	}
	if hasBugReportHeader(unwrap.Clean(data[:min(len(data), 8192)]).Data) {
		// The head is cleaned first: a report saved by PowerShell is UTF-16.
		return readBugReport(name, data)
	}
	s, err := ParseBytes(name, data)
	if err != nil {
		return []Part{{Path: name, Bundle: bundle, Err: err}}
	}
	return []Part{{Path: name, Kind: s.Sources[0].Kind, Bundle: bundle, Snapshot: s}}
}

// readTree reads a directory capture (a KFD topology copy) or, when no
// directory format claims it, every capture in it: an sosreport, a bundle
// of mixed captures. Files in no format kiln reads are left out with a
// note.
func readTree(ctx context.Context, fsys fs.FS, name, bundle string) []Part {
	for _, imp := range treeImporters {
		if !mixedFolder(fsys) && imp.Detect(fsys) {
			s, err := imp.Parse(fsys, name)
			if err != nil {
				return []Part{{Path: name, Bundle: bundle, Err: fmt.Errorf("%s: reading as %s: %w", name, imp.Kind, err)}}
			}
			stamp(s, imp.Kind, name)
			return []Part{{Path: name, Kind: imp.Kind, Bundle: bundle, Snapshot: s}}
		}
	}
	sos := isSOSReport(fsys)
	if sos && bundle == "" {
		bundle = name
	}
	var files []string
	var trees []Part
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable entries are skipped
		}
		if d.IsDir() {
			if p != "." && strings.HasPrefix(d.Name(), ".") {
				return fs.SkipDir
			}
			// A directory capture inside the bundle (a KFD topology copy
			// among other files) is read as one.
			if p != "." && mayBeTree(fsys, p) {
				if sub, err := fs.Sub(fsys, p); err == nil {
					for _, imp := range treeImporters {
						if imp.Detect(sub) {
							trees = append(trees, readTree(ctx, sub, name+": "+p, bundle)...)
							return fs.SkipDir
						}
					}
				}
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if len(files) >= maxBundleFiles {
			return fs.SkipAll
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return []Part{{Path: name, Err: fmt.Errorf("%s: %w", name, err)}}
	}
	sort.Strings(files)
	out := trees
	skipped := 0
	host := ""
	for _, f := range files {
		if ctx.Err() != nil {
			break
		}
		if sos && !sosCandidate(f) {
			if f == "hostname" || f == "etc/hostname" || f == "sos_commands/host/hostname" {
				if b, err := fs.ReadFile(fsys, f); err == nil {
					host = firstWord(string(b))
				}
			}
			continue
		}
		b, err := readMember(fsys, f)
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			skipped++
			continue
		}
		member := name + ": " + f
		if sos && !sosKernelLog(f) {
			// Only log files may be read as kernel logs in an sosreport:
			// its other files are full of timestamped lines.
			s, err := parseBytes(member, b, false)
			if err != nil {
				skipped++
				continue
			}
			out = append(out, Part{Path: member, Kind: s.Sources[0].Kind, Bundle: bundle, Snapshot: s})
			continue
		}
		parts := readData(ctx, member, b, bundle)
		for _, p := range parts {
			if p.Err != nil && errors.Is(p.Err, ErrUnknownFormat) {
				skipped++
				continue
			}
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return []Part{{Path: name, Err: fmt.Errorf("%s: %w: no file in it is a capture kiln reads (%d files looked at)", name, ErrUnknownFormat, len(files))}}
	}
	if host != "" {
		for _, p := range out {
			if p.Snapshot != nil && p.Snapshot.Host.Hostname == "" {
				p.Snapshot.Host.Hostname = host
			}
		}
	}
	if skipped > 0 && out[0].Snapshot != nil {
		out[0].Snapshot.Notes = append(out[0].Snapshot.Notes, snapshot.Note{Source: "bundle",
			Message: fmt.Sprintf("%s: %d files are in no capture format kiln reads and were left out", name, skipped)})
	}
	return out
}

func readMember(fsys fs.FS, p string) ([]byte, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > maxMemberFile {
		return nil, fmt.Errorf("%s: larger than %d MB", p, maxMemberFile>>20)
	}
	return io.ReadAll(io.LimitReader(f, maxMemberFile))
}

func firstWord(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// mixedFolder: files of other kinds lie at the top beside a subfolder (a
// "topology" copy next to a kernel log): the folder is a bundle, and the
// subfolder one capture of it.
func mixedFolder(fsys fs.FS) bool {
	if st, err := fs.Stat(fsys, "nodes"); err == nil && st.IsDir() {
		return false // the tree itself
	}
	ents, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.Type().IsRegular() && e.Name() != "generation_id" && e.Name() != "system_properties" && !strings.HasPrefix(e.Name(), ".") {
			return true
		}
	}
	return false
}

// mayBeTree: a directory that could be a directory capture (a KFD topology
// copy is a "topology" folder or has "nodes" in it); a cheap test before the
// tree importers look.
func mayBeTree(fsys fs.FS, dir string) bool {
	if path.Base(dir) == "topology" {
		return true
	}
	st, err := fs.Stat(fsys, path.Join(dir, "nodes"))
	return err == nil && st.IsDir()
}

// isSOSReport: sos (sosreport) trees have sos_commands/ and a version file.
func isSOSReport(fsys fs.FS) bool {
	if st, err := fs.Stat(fsys, "sos_commands"); err == nil && st.IsDir() {
		return true
	}
	_, err := fs.Stat(fsys, "sos_reports")
	return err == nil
}

// sosCandidate: the files of an sosreport that can hold a capture kiln
// reads: command outputs and logs.
func sosCandidate(p string) bool {
	switch {
	case strings.HasPrefix(p, "sos_commands/kernel/"), strings.HasPrefix(p, "sos_commands/pci/"),
		strings.HasPrefix(p, "sos_commands/nvidia/"), strings.HasPrefix(p, "sos_commands/logs/"),
		strings.HasPrefix(p, "sos_commands/amd/"), strings.HasPrefix(p, "sos_commands/rocm/"),
		strings.HasPrefix(p, "sos_commands/gpu/"), strings.HasPrefix(p, "sos_commands/hardware/"):
		return true
	}
	return sosKernelLog(p)
}

// sosKernelLog: files of an sosreport that are kernel logs or journals.
func sosKernelLog(p string) bool {
	base := path.Base(p)
	switch {
	case strings.HasPrefix(p, "var/log/"):
		for _, n := range []string{"dmesg", "messages", "syslog", "kern.log"} {
			if base == n || strings.HasPrefix(base, n+".") || strings.HasPrefix(base, n+"-") {
				return true
			}
		}
		return false
	case strings.HasPrefix(p, "sos_commands/kernel/"):
		return strings.HasPrefix(base, "dmesg")
	case strings.HasPrefix(p, "sos_commands/logs/"):
		return strings.HasPrefix(base, "journalctl")
	}
	return false
}

// Compressed files: gzip, bzip2, xz and zstd (sosreport uses xz by default,
// logrotate gzip).
func isCompressed(b []byte) bool {
	switch {
	case len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b:
		return true
	case len(b) > 3 && b[0] == 'B' && b[1] == 'Z' && b[2] == 'h':
		return true
	case len(b) > 6 && bytes.Equal(b[:6], []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return true
	case len(b) > 4 && bytes.Equal(b[:4], []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return true
	}
	return false
}

// decompressor opens a decompressing reader of r, whose first bytes are
// head; closeFn releases it.
func decompressor(r io.Reader, head []byte) (io.Reader, func(), error) {
	none := func() {}
	if len(head) == 0 {
		return nil, none, fmt.Errorf("empty input: not a compressed file")
	}
	switch {
	case head[0] == 0x1f:
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, none, fmt.Errorf("not a gzip file: %w", err)
		}
		return z, func() { z.Close() }, nil
	case head[0] == 'B':
		return bzip2.NewReader(r), none, nil
	case head[0] == 0xfd:
		x, err := xz.NewReader(r)
		if err != nil {
			return nil, none, fmt.Errorf("not an xz file: %w", err)
		}
		return x, none, nil
	}
	d, err := zstd.NewReader(r, zstd.WithDecoderMaxMemory(maxFile))
	if err != nil {
		return nil, none, fmt.Errorf("not a zstd file: %w", err)
	}
	return d, d.Close, nil
}

// decompress unpacks a compressed file into memory, up to maxFile bytes.
func decompress(data []byte) ([]byte, error) {
	r, closeFn, err := decompressor(bytes.NewReader(data), data)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	plain, err := io.ReadAll(io.LimitReader(r, maxFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading compressed data: %w", err)
	}
	if len(plain) > maxFile {
		return nil, fmt.Errorf("unpacks to more than %d MB", maxFile>>20)
	}
	return plain, nil
}

// isTar: a POSIX tar header has "ustar" at offset 257.
func isTar(b []byte) bool {
	return len(b) >= 262 && bytes.Equal(b[257:262], []byte("ustar"))
}

// untar unpacks a tar into memory (see untarReader).
func untar(data []byte) (fs.FS, error) { return untarReader(bytes.NewReader(data)) }

// untarReader unpacks a tar into memory as it streams. When every entry
// sits under one top folder, that folder becomes the root.
func untarReader(r io.Reader) (fs.FS, error) {
	tr := tar.NewReader(r)
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
		if len(m) >= maxBundleFiles*4 {
			return nil, fmt.Errorf("tar holds more than %d files", maxBundleFiles*4)
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
