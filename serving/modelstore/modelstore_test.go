package modelstore_test

import (
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"kiln.dev/kiln/compat/imagetest"
	"kiln.dev/kiln/serving"
	"kiln.dev/kiln/serving/modeldir"
	"kiln.dev/kiln/serving/modelstore"
)

// counting counts the request body bytes it carries.
type counting struct {
	rt http.RoundTripper
	n  atomic.Int64
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		r.Body = &countBody{r.Body, &c.n}
	}
	return c.rt.RoundTrip(r)
}

type countBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countBody) Read(p []byte) (int, error) {
	k, err := b.ReadCloser.Read(p)
	b.n.Add(int64(k))
	return k, err
}

func write(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

const llamaConfig = `{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":512,"intermediate_size":1376,` +
	`"num_attention_heads":8,"num_key_value_heads":4,"num_hidden_layers":4,"vocab_size":32000,"max_position_embeddings":2048,"torch_dtype":"bfloat16"}`

// A model folder pushed to a real docker-registry comes back whole on a
// node: every file, by its path, with its bytes; a second model that
// shares a file sends only the other; a second pull fetches nothing; the
// config says what kiln serve sizes the model by.
func TestPushPull(t *testing.T) {
	reg := imagetest.NewTestRegistry(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "tiny")
	shard := random(t, 3<<20)
	write(t, filepath.Join(dir, "config.json"), []byte(llamaConfig))
	write(t, filepath.Join(dir, "model.safetensors"), shard)
	write(t, filepath.Join(dir, "tokenizer", "tokenizer.json"), []byte(`{"v":1}`))
	write(t, filepath.Join(dir, ".cache", "junk"), []byte("left out"))
	m, err := modeldir.Read(dir, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	var phases []string
	o := modelstore.Options{Progress: func(phase string, done, total int64) {
		if len(phases) == 0 || phases[len(phases)-1] != phase {
			phases = append(phases, phase)
		}
	}}
	ref := reg.Host + "/models/tiny:v1"
	digest, err := modelstore.Push(ctx, m, ref, o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(digest, "sha256:") || len(phases) < 2 || phases[0] != "hashing" {
		t.Errorf("digest %s, progress phases %v", digest, phases)
	}
	a, err := modelstore.Inspect(ctx, ref, modelstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != digest || a.Config.Model.Name != "tiny" || a.Config.Model.Format != "safetensors" || a.Config.Model.Shape == nil ||
		a.Config.Model.Shape.Layers != 4 || len(a.Config.Files) != 3 || a.Config.Files[2].Path != "tokenizer/tokenizer.json" {
		t.Errorf("inspected %+v", a)
	}

	cache := &modelstore.Cache{Root: t.TempDir()}
	p, err := cache.Pull(ctx, ref, modelstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(p.Dir, "model.safetensors"))
	if err != nil || string(got) != string(shard) {
		t.Fatalf("the pulled shard: %d bytes, %v", len(got), err)
	}
	if b, _ := os.ReadFile(filepath.Join(p.Dir, "tokenizer", "tokenizer.json")); string(b) != `{"v":1}` {
		t.Errorf("the tokenizer: %q", b)
	}
	if _, err := os.Stat(filepath.Join(p.Dir, ".cache")); err == nil {
		t.Error("a hidden folder was pushed")
	}
	// What kiln serve reads from the pulled folder is what it read before.
	if back, err := modeldir.Read(p.Dir, "tiny"); err != nil || back.WeightsBytes != m.WeightsBytes || back.Arch.Layers != 4 {
		t.Errorf("the pulled model reads as %+v, %v", back, err)
	}
	again, err := cache.Pull(ctx, ref, modelstore.Options{})
	if err != nil || again.Fetched != 0 || again.Dir != p.Dir {
		t.Errorf("a second pull: %+v, %v", again, err)
	}

	// A second model sharing the shard: the registry already holds it, and
	// the node fetches only what it lacks.
	dir2 := filepath.Join(t.TempDir(), "tiny-chat")
	write(t, filepath.Join(dir2, "config.json"), []byte(strings.Replace(llamaConfig, `"num_hidden_layers":4`, `"num_hidden_layers":4 `, 1)))
	write(t, filepath.Join(dir2, "model.safetensors"), shard)
	m2, err := modeldir.Read(dir2, "tiny-chat")
	if err != nil {
		t.Fatal(err)
	}
	sent := &counting{rt: http.DefaultTransport}
	if _, err := modelstore.Push(ctx, m2, reg.Host+"/models/tiny:chat", modelstore.Options{Transport: sent}); err != nil {
		t.Fatal(err)
	}
	if uploaded := sent.n.Load(); uploaded >= int64(len(shard)) || uploaded == 0 {
		t.Errorf("the second push sent %d bytes: the shared shard again", uploaded)
	}
	p2, err := cache.Pull(ctx, reg.Host+"/models/tiny:chat", modelstore.Options{})
	if err != nil || p2.Fetched >= int64(len(shard)) {
		t.Errorf("the second model's pull fetched %d bytes (%v): the shard was cached", p2.Fetched, err)
	}

	ls, err := modelstore.List(ctx, reg.Host+"/models/tiny", modelstore.Options{})
	if err != nil || len(ls) != 2 {
		t.Errorf("list: %+v, %v", ls, err)
	}
	if err := modelstore.Remove(ctx, reg.Host+"/models/tiny:chat", modelstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := modelstore.Inspect(ctx, reg.Host+"/models/tiny:chat", modelstore.Options{}); err == nil {
		t.Error("the removed model is still there")
	}

	// Evicting to nothing keeps the model in use and drops the other, and
	// the blobs only the dropped one held.
	cache.MaxBytes = 1
	if _, err := cache.Evict(digest); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.Dir); err != nil {
		t.Errorf("the model in use was evicted: %v", err)
	}
	if _, err := os.Stat(p2.Dir); err == nil {
		t.Error("the unused model was kept")
	}
	if b, err := os.ReadFile(filepath.Join(p.Dir, "model.safetensors")); err != nil || len(b) != len(shard) {
		t.Errorf("the kept model's shard after eviction: %d bytes, %v", len(b), err)
	}
}

// What a node cannot trust is refused: a registry nobody answers at, a
// reference without a registry, an image that is not a kiln model.
func TestRefusals(t *testing.T) {
	ctx := context.Background()
	if _, err := modelstore.Inspect(ctx, "127.0.0.1:1/models/x:v1", modelstore.Options{}); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("an unreachable registry: %v", err)
	}
	if _, err := modelstore.Inspect(ctx, "llama", modelstore.Options{}); err == nil || !strings.Contains(err.Error(), "names no registry") {
		t.Errorf("no registry: %v", err)
	}
	reg := imagetest.NewTestRegistry(t)
	ref := reg.PushSpec(t, "images/app", imagetest.Spec{})
	if _, err := modelstore.Inspect(ctx, ref, modelstore.Options{}); err == nil || !strings.Contains(err.Error(), "not a kiln model") {
		t.Errorf("an image: %v", err)
	}

	// A node pulls only from the registries its admin names, and nothing
	// larger than its cache.
	file := filepath.Join(t.TempDir(), "m.gguf")
	write(t, file, append([]byte("GGUF"), random(t, 64<<10)...))
	mref := reg.Host + "/models/m:v1"
	digest, err := modelstore.Push(ctx, modelstoreModel(file, 64<<10+4), mref, modelstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cache *modelstore.Cache
		want  string
	}{
		{&modelstore.Cache{Root: t.TempDir()}, "from no registry"},
		{&modelstore.Cache{Root: t.TempDir(), Registries: []string{"registry.lab:5000"}}, "only from registry.lab:5000, not from " + reg.Host},
		{&modelstore.Cache{Root: t.TempDir(), Registries: []string{reg.Host}, MaxBytes: 1024}, "more than this node's model cache holds"},
	} {
		if _, _, err := tc.cache.PullPinned(ctx, mref, digest, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("registries %v, bound %d: %v", tc.cache.Registries, tc.cache.MaxBytes, err)
		}
	}
	ok := &modelstore.Cache{Root: t.TempDir(), Registries: []string{reg.Host}}
	if _, _, err := ok.PullPinned(ctx, mref, "sha256:"+strings.Repeat("0", 64), nil); err == nil || !strings.Contains(err.Error(), strings.Repeat("0", 64)) {
		t.Errorf("a digest the registry does not hold: %v", err)
	}
	if dir, _, err := ok.PullPinned(ctx, mref, digest, nil); err != nil || dir == "" {
		t.Errorf("an allowed pull: %q, %v", dir, err)
	}
}

func TestParseConfig(t *testing.T) {
	good := `{"version":1,"model":{"name":"m","format":"gguf","weights_bytes":5,"path":"","file":"m.gguf"},"files":[{"path":"m.gguf","digest":"sha256:` + strings.Repeat("a", 64) + `","size":5}]}`
	if _, err := modelstore.ParseConfig([]byte(good)); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"version":   strings.Replace(good, `"version":1`, `"version":2`, 1),
		"escape":    strings.Replace(good, `{"path":"m.gguf"`, `{"path":"../../etc/passwd"`, 1),
		"absolute":  strings.Replace(good, `{"path":"m.gguf"`, `{"path":"/etc/passwd"`, 1),
		"unclean":   strings.Replace(good, `{"path":"m.gguf"`, `{"path":"a/./m.gguf"`, 1),
		"control":   strings.Replace(good, `{"path":"m.gguf"`, `{"path":"m\u001b.gguf"`, 1),
		"digest":    strings.Replace(good, `"digest":"sha256:`, `"digest":"md5:`, 1),
		"weights":   strings.Replace(good, `"file":"m.gguf"`, `"file":"other.gguf"`, 1),
		"name":      strings.Replace(good, `"name":"m"`, `"name":"../m"`, 1),
		"disk path": strings.Replace(good, `"path":""`, `"path":"/models/m"`, 1),
		"no files":  `{"version":1,"model":{"name":"m","format":"gguf"},"files":[]}`,
	} {
		if _, err := modelstore.ParseConfig([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"version":1,"model":{"name":"m","format":"gguf","weights_bytes":5,"file":"m.gguf"},"files":[{"path":"m.gguf","digest":"sha256:` + strings.Repeat("a", 64) + `","size":5}]}`))
	f.Add([]byte(`{"version":1,"files":[{"path":"a/../../b"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := modelstore.ParseConfig(b)
		if err != nil {
			return
		}
		root := "/cache/models/x"
		for _, fl := range c.Files {
			p := filepath.Join(root, filepath.FromSlash(fl.Path))
			if !strings.HasPrefix(p, root+"/") {
				t.Fatalf("accepted the path %q, which leaves the model", fl.Path)
			}
		}
	})
}

// A file whose bytes the registry changed is refused by its digest, and
// nothing of the model is left in the cache.
func TestPullVerifies(t *testing.T) {
	dir := t.TempDir()
	reg, err := imagetest.StartRegistry(imagetest.NeedRegistry(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	ctx := context.Background()
	model := filepath.Join(t.TempDir(), "m.gguf")
	body := append([]byte("GGUF"), random(t, 1<<20)...)
	write(t, model, body)
	m := modelstoreModel(model, int64(len(body)))
	ref := reg.Host + "/models/m:v1"
	digest, err := modelstore.Push(ctx, m, ref, modelstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := modelstore.Inspect(ctx, ref, modelstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hexd := strings.TrimPrefix(a.Config.Files[0].Digest, "sha256:")
	data := filepath.Join(dir, "storage", "docker", "registry", "v2", "blobs", "sha256", hexd[:2], hexd, "data")
	tampered := append([]byte(nil), body...)
	tampered[len(tampered)/2] ^= 0xff
	if err := os.WriteFile(data, tampered, 0o644); err != nil {
		t.Fatal(err)
	}
	cache := &modelstore.Cache{Root: t.TempDir()}
	_, err = cache.Pull(ctx, ref, modelstore.Options{})
	// go-containerregistry checks the digest as it reads, and kiln again.
	if err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("a tampered file: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(cache.Root, "*", "*", "*"))
	for _, p := range left {
		t.Errorf("left in the cache: %s", p)
	}
	if _, err := os.Stat(filepath.Join(cache.Root, "models", strings.TrimPrefix(digest, "sha256:"))); err == nil {
		t.Error("the model's folder exists")
	}
}

// A link out of the model is refused before anything is read; links into
// a Hugging Face cache's blobs are followed.
func TestFilesLinks(t *testing.T) {
	root := t.TempDir()
	repo := filepath.Join(root, "models--org--tiny")
	snap := filepath.Join(repo, "snapshots", "abc123")
	write(t, filepath.Join(repo, "blobs", "sha1"), []byte(llamaConfig))
	write(t, filepath.Join(snap, "dummy"), []byte("x"))
	if err := os.Symlink("../../blobs/sha1", filepath.Join(snap, "config.json")); err != nil {
		t.Fatal(err)
	}
	if _, files, err := modelstore.Files(serving.Model{Path: snap}); err != nil || len(files) != 2 {
		t.Errorf("a Hugging Face snapshot: %v, %v", files, err)
	}
	secret := filepath.Join(root, "client.json")
	write(t, secret, []byte(`{"token":"kiln_secret"}`))
	if err := os.Symlink(secret, filepath.Join(snap, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := modelstore.Files(serving.Model{Path: snap}); err == nil || !strings.Contains(err.Error(), "links outside the model") {
		t.Errorf("a link to the pusher's token file: %v", err)
	}
}
