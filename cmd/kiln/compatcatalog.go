//go:build !agentonly

package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/image"
	"kiln.dev/kiln/kb"
)

// compatCatalog gives the server the images kiln compat read before, from
// its cache on this machine: no registry is asked, as an air-gapped server
// cannot. What it read is kept for ttl, so that the web page's fleet view
// (at most twice a second per tab) does not read the directory each time.
type compatCatalog struct {
	cache *image.Cache
	kb    *kb.KB
	ttl   time.Duration
	max   int // images judged, the latest read first
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex
	at      time.Time
	imgs    []compat.Checked
	skipped int
}

func newCompatCatalog(dir string, k *kb.KB, log *slog.Logger) *compatCatalog {
	return &compatCatalog{cache: image.NewCache(dir), kb: k, ttl: 30 * time.Second, max: 100, log: log, now: time.Now}
}

// CheckedImages lists the recorded images whose layers are all still in
// the cache, their requirements resolved.
func (c *compatCatalog) CheckedImages(ctx context.Context) ([]compat.Checked, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if !c.at.IsZero() && now.Sub(c.at) < c.ttl {
		return c.imgs, nil
	}
	recs, skipped, err := c.cache.Images()
	if err != nil {
		return nil, err
	}
	var imgs []compat.Checked
	gone := 0
	for _, rec := range recs {
		if len(imgs) >= c.max || ctx.Err() != nil {
			break
		}
		res, ok := c.cache.Result(rec)
		if !ok {
			gone++
			continue
		}
		req := compat.FromScan(res)
		req.Resolve(c.kb)
		imgs = append(imgs, compat.Checked{Ref: rec.Ref, Platform: rec.Platform, Requirements: req})
	}
	if (skipped > 0 || gone > 0) && skipped+gone != c.skipped {
		c.log.Info("kiln compat's cache: some images are not judged", "unreadable_records", skipped, "layers_gone", gone)
	}
	c.at, c.imgs, c.skipped = now, imgs, skipped+gone
	return imgs, nil
}
