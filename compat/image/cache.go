package image

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(cacheFile{Version: cacheVersion, Digest: digest, Layer: l})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.dir, ".tmp-*")
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
	if err := os.Rename(tmp.Name(), c.fileName(digest)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("placing cache entry: %w", err)
	}
	return nil
}
