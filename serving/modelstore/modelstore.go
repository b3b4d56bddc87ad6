// Package modelstore keeps models in the lab's OCI registry, for labs
// without the internet: a model (a Hugging Face style folder, or a GGUF
// file) is an OCI artifact whose config is what kiln read of the model and
// whose layers are its files, one layer a file, uncompressed, so a file
// two models share is stored once. Nodes pull a model once into a
// content-addressed cache, every file verified by its digest, and the
// engines of every deployment of it share that copy.
package modelstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/serving"
)

// Media types of a model artifact.
const (
	// ArtifactType is the manifest's artifactType and its config's media
	// type.
	ArtifactType = "application/vnd.kiln.model.v1+json"
	// FileMediaType is each file's layer.
	FileMediaType = "application/vnd.kiln.model.file.v1"
	// TitleAnnotation names a layer's file, as OCI's image spec says.
	TitleAnnotation = "org.opencontainers.image.title"
)

// Bounds of what a model artifact may hold.
const (
	maxFiles      = 10_000
	maxConfig     = 4 << 20
	maxPathLength = 1024
)

// Config is a model artifact's config: what kiln read of the model, and
// its files.
type Config struct {
	Version int `json:"version"`
	// Model is what kiln serve sizes it by; its Path is "" and its File,
	// for a GGUF model, the file's path in the artifact.
	Model api.ServeModel `json:"model"`
	Files []File         `json:"files"`
}

// File is one file of a model.
type File struct {
	// Path is the file's path inside the model, slash-separated.
	Path   string `json:"path"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// Options say how to reach the registry.
type Options struct {
	// Insecure allows plain HTTP (loopback and private addresses get it
	// without asking, as go-containerregistry does).
	Insecure bool
	Keychain authn.Keychain
	// Transport, when set, carries the requests (a lab's CA, a proxy).
	Transport http.RoundTripper
	// Progress, when set, is told the bytes done of the total as they
	// pass (hashing, then uploading or downloading).
	Progress func(phase string, done, total int64)
}

func (o Options) ref(ref string) (name.Reference, error) {
	var nopts []name.Option
	if o.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("%q is not a model reference (REGISTRY/REPOSITORY:TAG): %w", ref, err)
	}
	if !strings.Contains(ref, "/") {
		return nil, fmt.Errorf("%q names no registry: give REGISTRY/REPOSITORY:TAG (the lab's registry, such as registry.lab:5000/models/llama-3:8b)", ref)
	}
	return r, nil
}

func (o Options) remote(ctx context.Context) []remote.Option {
	kc := o.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc)}
	if o.Transport != nil {
		opts = append(opts, remote.WithTransport(o.Transport))
	}
	return opts
}

func (o Options) progress(phase string, done, total int64) {
	if o.Progress != nil {
		o.Progress(phase, done, total)
	}
}

// Files lists a model's files as kiln pushes them: every regular file of
// its folder (links followed, hidden files and folders left out), or its
// one GGUF file; with their paths relative to the model.
func Files(m serving.Model) (root string, files []string, err error) {
	st, err := os.Stat(m.Path)
	if err != nil {
		return "", nil, err
	}
	if !st.IsDir() {
		return filepath.Dir(m.Path), []string{filepath.Base(m.Path)}, nil
	}
	// Links may point into the model's folder, or, as Hugging Face's cache
	// lays a snapshot out (models--org--name/snapshots/REV/file ->
	// ../../blobs/SHA), into its repository's folder; anywhere else they
	// might carry the pusher's other files to the registry.
	base, err := filepath.EvalSymlinks(m.Path)
	if err != nil {
		return "", nil, err
	}
	allowed := []string{base}
	if filepath.Base(filepath.Dir(base)) == "snapshots" {
		allowed = append(allowed, filepath.Dir(filepath.Dir(base)))
	}
	err = filepath.WalkDir(m.Path, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(m.Path, p)
		if rel != "." && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if d.Type()&os.ModeSymlink != 0 {
			target, err := filepath.EvalSymlinks(p)
			if err != nil {
				return err
			}
			inside := false
			for _, a := range allowed {
				if target == a || strings.HasPrefix(target, a+string(filepath.Separator)) {
					inside = true
				}
			}
			if !inside {
				return fmt.Errorf("%s links outside the model (to %s): kiln model push sends only the model's own files", rel, target)
			}
		}
		fi, err := os.Stat(p) // a link into a cache counts as its target
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		if len(files) >= maxFiles {
			return fmt.Errorf("more than %d files", maxFiles)
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	sort.Strings(files)
	return m.Path, files, err
}

// fileLayer is one file of the model as a layer, uncompressed.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return FileMediaType, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }

// artifact is a model as an image go-containerregistry can write.
type artifact struct {
	config   []byte
	manifest []byte
	layers   map[v1.Hash]*fileLayer
}

func (a *artifact) RawConfigFile() ([]byte, error)      { return a.config, nil }
func (a *artifact) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (a *artifact) RawManifest() ([]byte, error)        { return a.manifest, nil }
func (a *artifact) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if l := a.layers[h]; l != nil {
		return l, nil
	}
	if h == digestOf(a.config) {
		return partial.ConfigLayer(a)
	}
	return nil, fmt.Errorf("the model has no blob %s", h)
}

func digestOf(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// Push stores the model read from disk (serving/modeldir) at ref: each file
// is hashed, then only the files the registry does not hold are sent. It
// returns the artifact's digest.
func Push(ctx context.Context, m serving.Model, ref string, o Options) (string, error) {
	r, err := o.ref(ref)
	if err != nil {
		return "", err
	}
	root, files, err := Files(m)
	if err != nil {
		return "", fmt.Errorf("model %s: %w", m.Path, err)
	}
	var total int64
	for _, f := range files {
		fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			return "", err
		}
		total += fi.Size()
	}
	cfg := Config{Version: 1, Model: APIModel(m)}
	cfg.Model.Path, cfg.Model.File = "", ""
	if m.File != "" {
		cfg.Model.File = filepath.Base(m.File)
	}
	a := &artifact{layers: map[v1.Hash]*fileLayer{}}
	var done int64
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	var layers []desc
	for _, f := range files {
		p := filepath.Join(root, filepath.FromSlash(f))
		h, n, err := hashFile(ctx, p, func(k int64) { o.progress("hashing", done+k, total) })
		if err != nil {
			return "", fmt.Errorf("model %s: %w", m.Path, err)
		}
		done += n
		cfg.Files = append(cfg.Files, File{Path: f, Digest: h.String(), Size: n})
		a.layers[h] = &fileLayer{path: p, digest: h, size: n}
		layers = append(layers, desc{MediaType: FileMediaType, Digest: h.String(), Size: n, Annotations: map[string]string{TitleAnnotation: f}})
	}
	if a.config, err = json.Marshal(cfg); err != nil {
		return "", err
	}
	manifest := map[string]any{
		"schemaVersion": 2,
		"mediaType":     string(types.OCIManifestSchema1),
		"artifactType":  ArtifactType,
		"config":        desc{MediaType: ArtifactType, Digest: digestOf(a.config).String(), Size: int64(len(a.config))},
		"layers":        layers,
		"annotations":   map[string]string{TitleAnnotation: m.Name},
	}
	if a.manifest, err = json.Marshal(manifest); err != nil {
		return "", err
	}
	img, err := partial.CompressedToImage(a)
	if err != nil {
		return "", err
	}
	updates := make(chan v1.Update, 16)
	go func() {
		for u := range updates {
			o.progress("uploading", u.Complete, u.Total)
		}
	}()
	if err := remote.Write(r, img, append(o.remote(ctx), remote.WithProgress(updates))...); err != nil {
		return "", fmt.Errorf("pushing %s: %w", ref, err)
	}
	return digestOf(a.manifest).String(), nil
}

// APIModel is what kiln read of a model (serving/modeldir) in the API's
// terms: what the server's choice and a stored model's config hold.
func APIModel(m serving.Model) api.ServeModel {
	out := api.ServeModel{Name: m.Name, Format: m.Format, Precision: m.Precision, WeightsBytes: m.WeightsBytes, Path: m.Path, File: m.File}
	if a := m.Arch; a != nil {
		out.Shape = &api.ModelShape{Layers: a.Layers, EncoderLayers: a.EncoderLayers, Hidden: a.Hidden, Heads: a.Heads,
			KVHeads: a.KVHeads, HeadDim: a.HeadDim, FFN: a.FFN, Gated: a.Gated, Tied: a.Tied, Vocab: a.Vocab, Seq: a.Seq,
			MaxSeq: a.MaxSeq, Experts: a.Experts, ExpertsPerToken: a.ExpertsPerToken, Params: a.PublishedParams}
	}
	return out
}

// hashFile is a file's sha256 and size, read once.
func hashFile(ctx context.Context, p string, progress func(int64)) (v1.Hash, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return v1.Hash{}, 0, err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return v1.Hash{}, 0, err
		}
		k, err := f.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		progress(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return v1.Hash{}, 0, err
		}
	}
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}, n, nil
}

// Artifact is a model in the registry.
type Artifact struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	Config Config `json:"config"`
	// Size is the files' bytes.
	Size int64 `json:"size"`
}

// ParseConfig reads and checks a model artifact's config: its files are
// paths inside the model (no "..", not absolute, no control characters),
// each named once, with a sha256 digest and a size; the model's name and
// format are ones kiln serves.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	if len(b) > maxConfig {
		return c, fmt.Errorf("the model's config is %d bytes, more than %d", len(b), maxConfig)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("the model's config: %w", err)
	}
	if c.Version != 1 {
		return c, fmt.Errorf("the model's config is of version %d; this kiln reads version 1", c.Version)
	}
	if err := serving.CheckName(c.Model.Name); err != nil {
		return c, fmt.Errorf("the model's config: %w", err)
	}
	if c.Model.Format != serving.FormatSafetensors && c.Model.Format != serving.FormatGGUF {
		return c, fmt.Errorf("the model's config: format %q", c.Model.Format)
	}
	if len(c.Files) == 0 || len(c.Files) > maxFiles {
		return c, fmt.Errorf("the model's config lists %d files (1 to %d)", len(c.Files), maxFiles)
	}
	seen := map[string]bool{}
	for _, f := range c.Files {
		if err := checkPath(f.Path); err != nil {
			return c, err
		}
		if seen[f.Path] {
			return c, fmt.Errorf("the model's config lists %s twice", f.Path)
		}
		seen[f.Path] = true
		if h, err := v1.NewHash(f.Digest); err != nil || h.Algorithm != "sha256" {
			return c, fmt.Errorf("file %s: digest %q is not a sha256 digest", f.Path, f.Digest)
		}
		if f.Size < 0 {
			return c, fmt.Errorf("file %s: size %d", f.Path, f.Size)
		}
	}
	if c.Model.File != "" && !seen[c.Model.File] {
		return c, fmt.Errorf("the model's config names %s as its weights, which it does not list", c.Model.File)
	}
	if c.Model.Path != "" {
		return c, errors.New("the model's config names a path on a disk; a stored model has none")
	}
	return c, nil
}

// checkPath: a file's path inside a model, which a node writes under its
// cache.
func checkPath(p string) error {
	bad := p == "" || len(p) > maxPathLength || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") || path.Clean(p) != p ||
		p == "." || strings.HasPrefix(p, "../") || p == ".."
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("file path %q: want a clean relative path inside the model", p)
	}
	return nil
}

// Inspect reads a model's config from the registry.
func Inspect(ctx context.Context, ref string, o Options) (*Artifact, error) {
	r, err := o.ref(ref)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(r, o.remote(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	if desc.MediaType != types.OCIManifestSchema1 {
		return nil, fmt.Errorf("%s is a %s, not a kiln model (kiln model push makes one)", ref, desc.MediaType)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	if string(m.Config.MediaType) != ArtifactType {
		return nil, fmt.Errorf("%s is not a kiln model: its config is a %s", ref, m.Config.MediaType)
	}
	if m.Config.Size > maxConfig {
		return nil, fmt.Errorf("%s: its config is %d bytes", ref, m.Config.Size)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	c, err := ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	// The layers must be the files the config lists, in order.
	if len(m.Layers) != len(c.Files) {
		return nil, fmt.Errorf("%s: %d layers for %d files", ref, len(m.Layers), len(c.Files))
	}
	var size int64
	for i, l := range m.Layers {
		if l.Digest.String() != c.Files[i].Digest || l.Size != c.Files[i].Size {
			return nil, fmt.Errorf("%s: layer %d is not the file %s its config lists", ref, i, c.Files[i].Path)
		}
		size += l.Size
	}
	return &Artifact{Ref: ref, Digest: desc.Digest.String(), Config: c, Size: size}, nil
}

// List lists the kiln models of a repository, one per tag; tags that are
// not kiln models are left out.
func List(ctx context.Context, repo string, o Options) ([]Artifact, error) {
	var nopts []name.Option
	if o.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.NewRepository(repo, nopts...)
	if err != nil {
		return nil, fmt.Errorf("%q is not a repository (REGISTRY/REPOSITORY): %w", repo, err)
	}
	tags, err := remote.List(r, o.remote(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", repo, err)
	}
	sort.Strings(tags)
	var out []Artifact
	for _, t := range tags {
		a, err := Inspect(ctx, r.Tag(t).String(), o)
		if err != nil {
			continue
		}
		out = append(out, *a)
	}
	return out, nil
}

// Remove deletes a model's manifest from the registry (its files stay
// until the registry's garbage collection, and other models may share
// them).
func Remove(ctx context.Context, ref string, o Options) error {
	a, err := Inspect(ctx, ref, o)
	if err != nil {
		return err
	}
	r, _ := o.ref(ref)
	d, err := name.NewDigest(r.Context().String()+"@"+a.Digest, name.WeakValidation)
	if err != nil {
		return err
	}
	if err := remote.Delete(d, o.remote(ctx)...); err != nil {
		return fmt.Errorf("deleting %s: %w (the registry must allow deletes: storage.delete.enabled in docker-registry's config)", ref, err)
	}
	return nil
}
