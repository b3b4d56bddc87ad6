package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"kiln.dev/kiln/textsafe"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// cacheVersion changes whenever what a Layer holds, or how it is read,
// changes; entries of another version are read again.
const cacheVersion = 2

// Cache keeps what each layer holds, by layer digest: in memory, and on
// disk when it has a directory. Layers are content-addressed, so an entry
// never goes stale; a base layer shared by many images is read once.
type Cache struct {
	dir string
	mu  sync.Mutex
	mem map[string]*Layer
}

// NewCache returns a cache kept in dir; "" keeps it in memory only.
func NewCache(dir string) *Cache {
	return &Cache{dir: dir, mem: map[string]*Layer{}}
}

// DefaultCacheDir is kiln's layer cache: <user cache dir>/kiln/compat
// ($XDG_CACHE_HOME or ~/.cache on Linux). It returns "" when there is no
// user cache directory.
func DefaultCacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "kiln", "compat")
}

type cacheFile struct {
	Version int    `json:"version"`
	Digest  string `json:"digest"`
	Layer   *Layer `json:"layer"`
}

// fileName is <digest>.json with the algorithm's colon made a dash
// ("sha256-<hex>.json"), a name every file system takes.
func (c *Cache) fileName(digest string) string {
	return filepath.Join(c.dir, strings.ReplaceAll(digest, ":", "-")+".json")
}

func validDigest(d string) bool {
	alg, hex, ok := strings.Cut(d, ":")
	if !ok || alg == "" || hex == "" || len(d) > 200 {
		return false
	}
	for _, r := range d {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == ':' || r == '+' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// Get returns the cached layer of a digest.
func (c *Cache) Get(digest string) (*Layer, bool) {
	if c == nil || !validDigest(digest) {
		return nil, false
	}
	c.mu.Lock()
	l, ok := c.mem[digest]
	c.mu.Unlock()
	if ok || c.dir == "" {
		return l, ok
	}
	b, err := os.ReadFile(c.fileName(digest))
	if err != nil {
		return nil, false
	}
	var f cacheFile
	if err := json.Unmarshal(b, &f); err != nil || f.Version != cacheVersion || f.Digest != digest || f.Layer == nil {
		return nil, false
	}
	c.mu.Lock()
	c.mem[digest] = f.Layer
	c.mu.Unlock()
	return f.Layer, true
}

// Put stores a layer. A disk write that fails is logged, not returned: the
// cache only saves time.
func (c *Cache) Put(digest string, l *Layer) {
	if c == nil || !validDigest(digest) || l == nil {
		return
	}
	c.mu.Lock()
	c.mem[digest] = l
	c.mu.Unlock()
	if c.dir == "" {
		return
	}
	if err := c.write(digest, l); err != nil {
		slog.Debug("compat: layer cache not written", "digest", digest, "err", err)
	}
}

func (c *Cache) write(digest string, l *Layer) error {
	b, err := json.Marshal(cacheFile{Version: cacheVersion, Digest: digest, Layer: l})
	if err != nil {
		return err
	}
	return writeFileAtomic(c.dir, c.fileName(digest), b)
}

// writeFileAtomic writes path through a temporary file in dir (made if
// need be) renamed over it, so that a reader never sees half a file.
func writeFileAtomic(dir, path string, b []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("placing cache entry: %w", err)
	}
	return nil
}

// imageRecordVersion changes whenever ImageRecord changes.
const imageRecordVersion = 1

// Bounds on the image records read back: a cache directory is outside data
// (another user may share it), so neither a huge file nor a flood of files
// makes kiln read without end.
const (
	maxImageRecordBytes = 1 << 20
	maxImageRecords     = 1000
)

// ImageRecord is an image kiln compat read: its reference, platform,
// config and the digests of its layers, whose contents the layer cache
// keeps. With it, what kiln read of the image can be had again without
// the registry (Cache.Result), as an air-gapped server needs.
type ImageRecord struct {
	Version  int               `json:"version"`
	Ref      string            `json:"ref"`
	Source   string            `json:"source,omitempty"`
	Digest   string            `json:"digest,omitempty"`
	Platform string            `json:"platform,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Layers   []string          `json:"layers"`
	ReadAt   time.Time         `json:"read_at"`
}

// imageFileName is images/<sha256 of reference and platform>.json: one
// record per image and platform, the latest read replacing the one before.
func (c *Cache) imageFileName(ref, platform string) string {
	sum := sha256.Sum256([]byte(ref + "\x00" + platform))
	return filepath.Join(c.dir, "images", hex.EncodeToString(sum[:])+".json")
}

// PutImage records a scanned image whose layers are all in the cache. As
// with layers, a disk write that fails is logged, not returned.
func (c *Cache) PutImage(res *Result, at time.Time) {
	if c == nil || c.dir == "" || res == nil || res.Ref == "" {
		return
	}
	rec := ImageRecord{Version: imageRecordVersion, Ref: res.Ref, Source: res.Source, Digest: res.Digest, Platform: res.Platform,
		Env: res.Env, Labels: res.Labels, ReadAt: at.UTC()}
	for _, l := range res.Layers {
		rec.Layers = append(rec.Layers, l.Digest)
	}
	b, err := json.Marshal(rec)
	if err == nil && len(b) > maxImageRecordBytes {
		err = fmt.Errorf("the record is %d bytes, above %d", len(b), maxImageRecordBytes)
	}
	if err == nil {
		err = writeFileAtomic(filepath.Join(c.dir, "images"), c.imageFileName(rec.Ref, rec.Platform), b)
	}
	if err != nil {
		slog.Debug("compat: image record not written", "image", res.Ref, "err", err)
	}
}

// ParseImageRecord reads one image record; it refuses a record of another
// version and one whose fields are out of bounds.
func ParseImageRecord(b []byte) (ImageRecord, error) {
	var rec ImageRecord
	if len(b) > maxImageRecordBytes {
		return rec, fmt.Errorf("image record of %d bytes, above %d", len(b), maxImageRecordBytes)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("image record: %w", err)
	}
	switch {
	case rec.Version != imageRecordVersion:
		return rec, fmt.Errorf("image record of version %d, want %d", rec.Version, imageRecordVersion)
	case rec.Ref == "" || len(rec.Ref) > 1024:
		return rec, fmt.Errorf("image record without a reference of at most 1024 bytes")
	case textsafe.Printable(rec.Ref) != rec.Ref || textsafe.Printable(rec.Platform) != rec.Platform || len(rec.Platform) > 64:
		// The reference is shown on the web page and in logs: a record
		// whose reference holds control bytes was not written by kiln.
		return rec, fmt.Errorf("image record with a reference or platform that holds control characters")
	case len(rec.Layers) == 0 || len(rec.Layers) > 1000:
		return rec, fmt.Errorf("image record of %s with %d layers (want 1 to 1000)", rec.Ref, len(rec.Layers))
	}
	for _, d := range rec.Layers {
		if !validDigest(d) {
			return rec, fmt.Errorf("image record of %s: %q is not a layer digest", rec.Ref, d)
		}
	}
	return rec, nil
}

// Images lists the images recorded in the cache, the latest read first;
// records that cannot be read are left out and counted in skipped.
func (c *Cache) Images() (recs []ImageRecord, skipped int, err error) {
	if c == nil || c.dir == "" {
		return nil, 0, nil
	}
	dir := filepath.Join(c.dir, "images")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("compat cache: %w", err)
	}
	for _, e := range entries {
		if len(recs) >= maxImageRecords {
			skipped++
			continue
		}
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := readBoundedFile(filepath.Join(dir, e.Name()), maxImageRecordBytes)
		if err != nil {
			skipped++
			continue
		}
		rec, err := ParseImageRecord(b)
		if err != nil {
			skipped++
			continue
		}
		recs = append(recs, rec)
	}
	sort.SliceStable(recs, func(i, j int) bool {
		if !recs[i].ReadAt.Equal(recs[j].ReadAt) {
			return recs[i].ReadAt.After(recs[j].ReadAt)
		}
		return recs[i].Ref < recs[j].Ref
	})
	return recs, skipped, nil
}

// Result is what kiln read of a recorded image, made again from the cached
// layers; false when one of them is no longer in the cache.
func (c *Cache) Result(rec ImageRecord) (*Result, bool) {
	res := &Result{Ref: rec.Ref, Source: rec.Source, Digest: rec.Digest, Platform: rec.Platform, Env: rec.Env, Labels: rec.Labels}
	layers := make([]*Layer, 0, len(rec.Layers))
	for _, d := range rec.Layers {
		l, ok := c.Get(d)
		if !ok {
			return nil, false
		}
		layers = append(layers, l)
		res.Layers = append(res.Layers, LayerInfo{Digest: d, Cached: true, Files: len(l.Facts)})
	}
	res.Facts = Merge(layers)
	return res, true
}

// readBoundedFile reads a regular file of at most limit bytes.
func readBoundedFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is above %d bytes", path, limit)
	}
	return b, nil
}
