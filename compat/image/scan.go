package image

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// ScanOptions tune a scan.
type ScanOptions struct {
	// Cache keeps layer results; nil reads every layer.
	Cache *Cache
	// Workers is how many layers are read at once; 0 means one per CPU.
	Workers int
}

// LayerInfo is one layer of a scanned image.
type LayerInfo struct {
	Digest string `json:"digest"`
	// CompressedBytes were read from the source (0 for a cached layer).
	CompressedBytes int64 `json:"compressed_bytes,omitempty"`
	Cached          bool  `json:"cached"`
	Files           int   `json:"files"`
}

// Result is what kiln read of an image.
type Result struct {
	Ref      string `json:"ref"`
	Source   string `json:"source"`
	Digest   string `json:"digest,omitempty"`
	Platform string `json:"platform,omitempty"`
	// Env and Labels are the image config's environment and labels.
	Env    map[string]string `json:"env,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Facts are the files kiln read, after whiteouts, sorted by path.
	Facts  []Fact      `json:"facts,omitempty"`
	Layers []LayerInfo `json:"layers"`
	// CompressedBytes is what this scan read from the source; Elapsed its time.
	CompressedBytes int64         `json:"compressed_bytes"`
	Elapsed         time.Duration `json:"elapsed_ns"`
}

// Scan reads an image's config and layers. Layers found in the cache are
// not read; the others are decompressed and walked as streams, several at
// once.
func Scan(ctx context.Context, img *Image, o ScanOptions) (*Result, error) {
	start := time.Now()
	res := &Result{Ref: img.Ref, Source: img.Source}
	if d, err := img.Digest(); err == nil {
		res.Digest = d.String()
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: reading image config: %w", img.Ref, err)
	}
	res.Platform = cfg.OS + "/" + cfg.Architecture
	if cfg.Variant != "" {
		res.Platform += "/" + cfg.Variant
	}
	res.Env = map[string]string{}
	for _, kv := range cfg.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		res.Env[k] = v
	}
	res.Labels = cfg.Config.Labels

	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("%s: listing layers: %w", img.Ref, err)
	}
	results := make([]*Layer, len(layers))
	res.Layers = make([]LayerInfo, len(layers))
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for w := 0; w < min(workers, max(len(layers), 1)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ex := &Extractor{}
			for i := range jobs {
				info, l, err := scanLayer(ctx, img, layers[i], ex, o.Cache)
				mu.Lock()
				res.Layers[i] = info
				results[i] = l
				if err != nil && firstErr == nil {
					firstErr = err
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	for i := range layers {
		select {
		case jobs <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, li := range res.Layers {
		res.CompressedBytes += li.CompressedBytes
	}
	res.Facts = Merge(results)
	res.Elapsed = time.Since(start)
	// Every layer is in the cache now: the record lets the image be judged
	// again without the registry (the server's fleet findings).
	o.Cache.PutImage(res, time.Now())
	return res, nil
}

// scanLayer reads one layer, or takes it from the cache.
func scanLayer(ctx context.Context, img *Image, layer v1.Layer, ex *Extractor, cache *Cache) (LayerInfo, *Layer, error) {
	var info LayerInfo
	d, err := layer.Digest()
	if err != nil {
		return info, nil, fmt.Errorf("%s: layer digest: %w", img.Ref, err)
	}
	info.Digest = d.String()
	if l, ok := cache.Get(info.Digest); ok {
		info.Cached, info.Files = true, l.Files
		return info, l, nil
	}
	var rc io.ReadCloser
	if img.Source == SourceTarball {
		// docker save keeps layers uncompressed; asking for the compressed
		// stream would compress them on the fly.
		rc, err = layer.Uncompressed()
	} else {
		rc, err = layer.Compressed()
	}
	if err != nil {
		return info, nil, fmt.Errorf("%s: layer %s: %w", img.Ref, info.Digest, err)
	}
	defer rc.Close()
	counted := &countReader{r: &ctxReader{ctx: ctx, r: rc}}
	tarStream, closeFn, err := decompress(counted)
	if err != nil {
		return info, nil, fmt.Errorf("%s: layer %s: %w", img.Ref, info.Digest, err)
	}
	l, err := WalkLayer(tarStream, ex)
	closeFn()
	if err == nil {
		// Drain what the decompressor left, so the digest check of the
		// compressed stream completes.
		_, err = io.Copy(io.Discard, counted)
	}
	info.CompressedBytes = counted.n
	if err != nil {
		return info, nil, fmt.Errorf("%s: layer %s: %w", img.Ref, info.Digest, err)
	}
	info.Files = l.Files
	cache.Put(info.Digest, l)
	return info, l, nil
}

// decompress detects gzip, zstd or a plain tar by the first bytes.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 1<<20)
	head, _ := br.Peek(4)
	switch {
	case len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, func() { zr.Close() }, nil
	case len(head) == 4 && head[0] == 0x28 && head[1] == 0xb5 && head[2] == 0x2f && head[3] == 0xfd:
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd: %w", err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// ctxReader stops a read when the context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
