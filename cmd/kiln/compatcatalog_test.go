//go:build !agentonly

package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"kiln.dev/kiln/compat/image"
	"kiln.dev/kiln/kb"
)

// The server's catalog is kiln compat's cache read again at most every
// ttl, with an image's requirements made from its cached layers.
func TestCompatCatalog(t *testing.T) {
	dir := t.TempDir()
	cache := image.NewCache(dir)
	put := func(ref, layer, cuda string, at time.Time) {
		cache.Put(layer, &image.Layer{Files: 1})
		cache.PutImage(&image.Result{Ref: ref, Platform: "linux/amd64", Env: map[string]string{"CUDA_VERSION": cuda},
			Layers: []image.LayerInfo{{Digest: layer}}}, at)
	}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	put("lab/a:1", "sha256:aa", "12.4.1", t0)
	now := t0
	cat := newCompatCatalog(dir, kb.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	cat.now = func() time.Time { return now }
	imgs, err := cat.CheckedImages(context.Background())
	if err != nil || len(imgs) != 1 || imgs[0].Ref != "lab/a:1" || imgs[0].Platform != "linux/amd64" || imgs[0].Requirements.EnvCUDA != "12.4" {
		t.Fatalf("first read: %+v, %v", imgs, err)
	}
	put("lab/b:1", "sha256:bb", "11.8.0", t0.Add(time.Minute))
	now = now.Add(10 * time.Second)
	if imgs, _ := cat.CheckedImages(context.Background()); len(imgs) != 1 {
		t.Errorf("within the ttl the cache was read again: %d images", len(imgs))
	}
	now = now.Add(time.Minute)
	imgs, _ = cat.CheckedImages(context.Background())
	if len(imgs) != 2 || imgs[0].Ref != "lab/b:1" {
		t.Fatalf("after the ttl: %+v", imgs)
	}
	cat.max = 1
	now = now.Add(time.Minute)
	if imgs, _ := cat.CheckedImages(context.Background()); len(imgs) != 1 || imgs[0].Ref != "lab/b:1" {
		t.Errorf("at most one: %+v", imgs)
	}
}
