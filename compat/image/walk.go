package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// Layer is what one layer contributes: the facts read from its files and
// the deletions (whiteouts) it makes in the layers below it. It is what the
// cache keeps per layer digest.
type Layer struct {
	Facts []Fact `json:"facts,omitempty"`
	// Whiteouts are paths this layer deletes from lower layers (a
	// ".wh.NAME" entry deletes NAME and everything under it).
	Whiteouts []string `json:"whiteouts,omitempty"`
	// Opaque are directories whose lower-layer content this layer hides
	// (a ".wh..wh..opq" entry in the directory).
	Opaque []string `json:"opaque,omitempty"`
	// Files counts the tar entries; Bytes is the uncompressed tar size.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
)

// cleanPath turns a tar entry name into the image path kiln uses: no
// leading "/" or "./", no "..", no trailing slash. It returns "" for the
// root or a name that leaves it.
func cleanPath(name string) string {
	p := path.Clean("/" + strings.ReplaceAll(name, "\\", "/"))
	p = strings.TrimPrefix(p, "/")
	if p == "." {
		return ""
	}
	return p
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// WalkLayer reads one layer's uncompressed tar stream to its end, asking
// ex about every regular file, and records whiteouts. Only the files ex
// wants are read, each through a bounded reader; the rest are skipped as
// the stream passes.
func WalkLayer(r io.Reader, ex *Extractor) (*Layer, error) {
	cr := &countReader{r: r}
	tr := tar.NewReader(cr)
	l := &Layer{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return l, fmt.Errorf("reading layer tar after %d entries: %w", l.Files, err)
		}
		l.Files++
		p := cleanPath(h.Name)
		if p == "" {
			continue
		}
		dir, base := path.Split(p)
		dir = strings.TrimSuffix(dir, "/")
		switch {
		case base == opaqueMarker:
			l.Opaque = append(l.Opaque, dir)
			continue
		case strings.HasPrefix(base, whiteoutPrefix):
			name := base[len(whiteoutPrefix):]
			if name == "" || name == "." || name == ".." {
				continue
			}
			l.Whiteouts = append(l.Whiteouts, path.Join(dir, name))
			continue
		}
		if h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeSymlink && h.Typeflag != tar.TypeLink {
			continue
		}
		facts, err := ex.file(p, h, tr)
		if err != nil {
			return l, fmt.Errorf("reading %s: %w", p, err)
		}
		l.Facts = append(l.Facts, facts...)
	}
	// Read what follows the tar's end marker so the byte count covers the
	// whole stream (and a digest check on it can complete).
	_, _ = io.Copy(io.Discard, cr)
	l.Bytes = cr.n
	return l, nil
}

// Merge applies layers bottom to top, as a container's root file system is
// assembled: each layer first deletes what its whiteouts and opaque
// directories hide in the layers below, then adds its own facts (a file in
// an upper layer replaces the same path below). The result is sorted by
// path, then kind.
func Merge(layers []*Layer) []Fact {
	cur := map[string][]Fact{}
	drop := func(p string) {
		if p == "" {
			clear(cur)
			return
		}
		for k := range cur {
			if k == p || strings.HasPrefix(k, p+"/") {
				delete(cur, k)
			}
		}
	}
	for _, l := range layers {
		if l == nil {
			continue
		}
		for _, d := range l.Opaque {
			drop(d)
		}
		for _, w := range l.Whiteouts {
			drop(w)
		}
		seen := map[string]bool{}
		for _, f := range l.Facts {
			if !seen[f.Path] {
				// The layer's facts for a path replace those below.
				cur[f.Path] = nil
				seen[f.Path] = true
			}
			cur[f.Path] = append(cur[f.Path], f)
		}
	}
	var out []Fact
	for _, fs := range cur {
		out = append(out, fs...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}
