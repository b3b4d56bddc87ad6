package modelstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Cache is a node's model cache: blobs/sha256/HEX holds each file once,
// by its digest, read-only; models/HEX (the artifact's digest) is a model
// laid out as its folder, its files hard links to the blobs. A model is
// complete once its folder exists: it is made aside and renamed into
// place.
type Cache struct {
	Root string
	// MaxBytes bounds the blobs; models in use are never evicted, so the
	// cache may hold more while they run. 0: no bound.
	MaxBytes int64
	// Options reach the registry (their Progress is each pull's own).
	Options Options
	// Registries are the registries (host[:port]) the node pulls from; a
	// job's model elsewhere is refused, so that no member makes the node
	// fetch from wherever they say.
	Registries []string

	mu sync.Mutex
	// pulling counts the pulls under way that need each blob (by hex
	// digest): eviction leaves those, which no model holds yet.
	pulling map[string]int
	// using counts the jobs that use each model (by hex digest), from
	// PullPinned to Release: eviction leaves those.
	using map[string]int
}

// Release says a job that PullPinned a model is done with it.
func (c *Cache) Release(digest string) {
	h, err := v1.NewHash(digest)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.using[h.Hex]--; c.using[h.Hex] <= 0 {
		delete(c.using, h.Hex)
	}
}

func (c *Cache) use(digest string) {
	h, err := v1.NewHash(digest)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.using == nil {
		c.using = map[string]int{}
	}
	c.using[h.Hex]++
}

// hold marks the blobs a pull needs, until the returned func is called.
func (c *Cache) hold(files []File) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pulling == nil {
		c.pulling = map[string]int{}
	}
	var hexes []string
	for _, f := range files {
		if h, err := v1.NewHash(f.Digest); err == nil {
			c.pulling[h.Hex]++
			hexes = append(hexes, h.Hex)
		}
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, h := range hexes {
			if c.pulling[h]--; c.pulling[h] <= 0 {
				delete(c.pulling, h)
			}
		}
	}
}

// PullPinned is Pull of the model ref names at digest, as an agent's
// ModelPuller: a ref that names another digest is refused. The model is in
// use, and kept, until Release.
func (c *Cache) PullPinned(ctx context.Context, ref, digest string, progress func(done, total int64)) (string, string, error) {
	r, err := c.Options.ref(ref)
	if err != nil {
		return "", "", err
	}
	if reg := r.Context().RegistryStr(); !slices.Contains(c.Registries, reg) {
		if len(c.Registries) == 0 {
			return "", "", fmt.Errorf("this node pulls models from no registry: its admin names the lab's with kiln agent --model-registry HOST (the model is on %s)", reg)
		}
		return "", "", fmt.Errorf("this node pulls models only from %s, not from %s", strings.Join(c.Registries, ", "), reg)
	}
	pinned := ref
	if !strings.Contains(ref, "@") {
		pinned = r.Context().String() + "@" + digest
	}
	o := c.Options
	o.Progress = func(_ string, done, total int64) {
		if progress != nil {
			progress(done, total)
		}
	}
	c.use(digest) // before the pull, so its own eviction keeps it
	p, err := c.Pull(ctx, pinned, o)
	if err == nil && p.Digest != digest {
		err = fmt.Errorf("%s is %s, not the %s the job was given", ref, p.Digest, digest)
	}
	if err != nil {
		c.Release(digest)
		return "", "", err
	}
	return p.Dir, p.File, nil
}

// Pulled is a model present in the cache.
type Pulled struct {
	Digest string
	// Dir is the model's folder; File its weights file (GGUF), else "".
	Dir, File string
	// Fetched is the bytes downloaded (0 when every file was there).
	Fetched int64
}

// Pull makes the model at ref present in the cache, each file downloaded
// once and checked against its digest, and gives its folder. inUse are the
// digests of models running jobs use, kept when the cache is evicted.
func (c *Cache) Pull(ctx context.Context, ref string, o Options, inUse ...string) (*Pulled, error) {
	a, err := Inspect(ctx, ref, o)
	if err != nil {
		return nil, err
	}
	h, _ := v1.NewHash(a.Digest)
	dir := filepath.Join(c.Root, "models", h.Hex)
	out := &Pulled{Digest: a.Digest, Dir: dir}
	if a.Config.Model.File != "" {
		out.File = filepath.Join(dir, filepath.FromSlash(a.Config.Model.File))
	}
	if _, err := os.Stat(dir); err == nil {
		now := time.Now()
		_ = os.Chtimes(dir, now, now) // used: evicted last
		return out, nil
	}
	blobs := filepath.Join(c.Root, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return nil, err
	}
	if c.MaxBytes > 0 && a.Size > c.MaxBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than this node's model cache holds (%d; kiln agent --model-cache-gib)", ref, a.Size, c.MaxBytes)
	}
	var need int64
	for _, f := range a.Config.Files {
		fh, _ := v1.NewHash(f.Digest)
		if fi, err := os.Stat(filepath.Join(blobs, fh.Hex)); err != nil || fi.Size() != f.Size {
			need += f.Size
		}
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(blobs, &fs); err == nil && int64(fs.Bavail)*int64(fs.Bsize) < need {
		return nil, fmt.Errorf("%s needs %d bytes more on the node, and %s has %d free", ref, need, c.Root, int64(fs.Bavail)*int64(fs.Bsize))
	}
	defer c.hold(a.Config.Files)()
	r, _ := o.ref(ref)
	pinned, err := name.NewDigest(r.Context().String()+"@"+a.Digest, name.WeakValidation)
	if err != nil {
		return nil, err
	}
	img, err := remote.Image(pinned, o.remote(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	var done int64
	for _, f := range a.Config.Files {
		fh, _ := v1.NewHash(f.Digest)
		blob := filepath.Join(blobs, fh.Hex)
		if fi, err := os.Stat(blob); err == nil && fi.Size() == f.Size {
			done += f.Size
			o.progress("downloading", done, a.Size)
			continue
		}
		l, err := img.LayerByDigest(fh)
		if err != nil {
			return nil, fmt.Errorf("%s: file %s: %w", ref, f.Path, err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, fmt.Errorf("%s: file %s: %w", ref, f.Path, err)
		}
		base := done
		n, err := fetchBlob(ctx, rc, blob, fh.Hex, f.Size, func(k int64) { o.progress("downloading", base+k, a.Size) })
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: file %s: %w", ref, f.Path, err)
		}
		done += f.Size
		out.Fetched += n
	}
	// The folder, made aside and renamed into place.
	models := filepath.Join(c.Root, "models")
	if err := os.MkdirAll(models, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(models, ".pull-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, f := range a.Config.Files {
		fh, _ := v1.NewHash(f.Digest)
		p := filepath.Join(tmp, filepath.FromSlash(f.Path))
		if !strings.HasPrefix(p, tmp+string(filepath.Separator)) {
			return nil, fmt.Errorf("%s: file path %q leaves the model", ref, f.Path)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.Link(filepath.Join(blobs, fh.Hex), p); err != nil {
			return nil, fmt.Errorf("%s: file %s: %w", ref, f.Path, err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, os.ErrExist) && !isNotEmpty(err) {
		return nil, err
	}
	if c.MaxBytes > 0 {
		if _, err := c.Evict(append(inUse, a.Digest)...); err != nil {
			return out, fmt.Errorf("evicting the model cache: %w", err)
		}
	}
	return out, nil
}

func isNotEmpty(err error) bool {
	var le *os.LinkError
	return errors.As(err, &le) && errors.Is(le.Err, syscall.ENOTEMPTY)
}

// fetchBlob writes a download to a temporary file beside blob, checks its
// size and digest, and renames it into place read-only.
func fetchBlob(ctx context.Context, r io.Reader, blob, hexDigest string, size int64, progress func(int64)) (int64, error) {
	f, err := os.CreateTemp(filepath.Dir(blob), ".fetch-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, rerr := r.Read(buf)
		if n+int64(k) > size {
			return n, fmt.Errorf("the registry sent more than the %d bytes the model lists", size)
		}
		if _, err := f.Write(buf[:k]); err != nil {
			return n, err
		}
		h.Write(buf[:k])
		n += int64(k)
		progress(n)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return n, rerr
		}
	}
	if n != size {
		return n, fmt.Errorf("the registry sent %d of %d bytes", n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != hexDigest {
		return n, fmt.Errorf("the download's digest is sha256:%s, not the sha256:%s the model lists", got, hexDigest)
	}
	if err := f.Sync(); err != nil {
		return n, err
	}
	if err := f.Chmod(0o444); err != nil {
		return n, err
	}
	if err := f.Close(); err != nil {
		return n, err
	}
	return n, os.Rename(f.Name(), blob)
}

// Evict removes the least recently used models, and the blobs no model
// holds any more, until the blobs fit MaxBytes; the models keep names (by
// digest) and those in use (PullPinned, not yet Released) stay. It returns
// the bytes freed.
func (c *Cache) Evict(keep ...string) (int64, error) {
	kept := map[string]bool{}
	for _, d := range keep {
		if h, err := v1.NewHash(d); err == nil {
			kept[h.Hex] = true
		}
	}
	blobs := filepath.Join(c.Root, "blobs", "sha256")
	models := filepath.Join(c.Root, "models")
	used := func() (int64, error) {
		es, err := os.ReadDir(blobs)
		if err != nil && !os.IsNotExist(err) {
			return 0, err
		}
		var n int64
		for _, e := range es {
			if fi, err := e.Info(); err == nil && !strings.HasPrefix(e.Name(), ".") {
				n += fi.Size()
			}
		}
		return n, nil
	}
	total, err := used()
	if err != nil {
		return 0, err
	}
	start := total
	es, err := os.ReadDir(models)
	if err != nil && !os.IsNotExist(err) {
		return 0, err
	}
	type model struct {
		name string
		used time.Time
	}
	var ms []model
	c.mu.Lock()
	for _, e := range es {
		if fi, err := e.Info(); err == nil && fi.IsDir() && !strings.HasPrefix(e.Name(), ".") && !kept[e.Name()] && c.using[e.Name()] == 0 {
			ms = append(ms, model{e.Name(), fi.ModTime()})
		}
	}
	c.mu.Unlock()
	sort.Slice(ms, func(i, j int) bool { return ms[i].used.Before(ms[j].used) })
	for _, m := range ms {
		if c.MaxBytes <= 0 || total <= c.MaxBytes {
			break
		}
		if err := os.RemoveAll(filepath.Join(models, m.name)); err != nil {
			return start - total, err
		}
		if err := c.dropUnheld(); err != nil {
			return start - total, err
		}
		if total, err = used(); err != nil {
			return 0, err
		}
	}
	return start - total, nil
}

// dropUnheld removes the blobs no model's folder links to and no pull
// under way needs.
func (c *Cache) dropUnheld() error {
	blobs := filepath.Join(c.Root, "blobs", "sha256")
	es, err := os.ReadDir(blobs)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range es {
		fi, err := e.Info()
		if err != nil || strings.HasPrefix(e.Name(), ".") || c.pulling[e.Name()] > 0 {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink <= 1 {
			if err := os.Remove(filepath.Join(blobs, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
