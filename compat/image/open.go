// Package image reads container images for kiln compat: from a registry,
// an OCI layout directory or a `docker save` tarball, through
// go-containerregistry. Layers are decompressed and walked as streams, only
// the files kiln needs are read, whiteouts are applied, and what each layer
// holds is cached by its digest.
package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Source kinds.
const (
	SourceRegistry = "registry"
	SourceLayout   = "oci-layout"
	SourceTarball  = "tarball"
)

// OpenOptions say how to reach an image.
type OpenOptions struct {
	// Insecure allows plain HTTP and unverified TLS for the registry.
	Insecure bool
	// Platform picks the image of a multi-platform index; nil means linux/amd64.
	Platform *v1.Platform
	// RegistryOnly reads registry references only, never a file or
	// directory of this machine: for references that come from others
	// (a Pod's image, in the admission webhook).
	RegistryOnly bool
	// Keychain gives the registry credentials; nil means the docker
	// config's (authn.DefaultKeychain).
	Keychain authn.Keychain
}

// Image is an opened image and where it came from.
type Image struct {
	v1.Image
	// Ref is the reference as given; Source is one of the Source* kinds.
	Ref    string
	Source string
}

// PlatformForArch maps a node's machine architecture (uname -m: x86_64,
// aarch64) to an image platform. An unknown architecture gives amd64.
func PlatformForArch(arch string) v1.Platform {
	switch strings.ToLower(arch) {
	case "aarch64", "arm64":
		return v1.Platform{OS: "linux", Architecture: "arm64"}
	case "ppc64le":
		return v1.Platform{OS: "linux", Architecture: "ppc64le"}
	}
	return v1.Platform{OS: "linux", Architecture: "amd64"}
}

// Open reaches an image. ref is one of:
//   - a directory holding an OCI image layout (oci-layout and index.json),
//     optionally written "oci:DIR";
//   - a file made by `docker save` (a tarball), optionally "docker-archive:FILE";
//   - a registry reference ("registry.example.com/team/train:1.4",
//     "localhost:5000/img@sha256:..."), with credentials from the docker
//     config (~/.docker/config.json and credential helpers).
func Open(ctx context.Context, ref string, o OpenOptions) (*Image, error) {
	plat := v1.Platform{OS: "linux", Architecture: "amd64"}
	if o.Platform != nil {
		plat = *o.Platform
	}
	local := ref
	explicit := ""
	for _, p := range []string{"oci:", "docker-archive:"} {
		if strings.HasPrefix(ref, p) {
			local, explicit = strings.TrimPrefix(ref, p), p
		}
	}
	if o.RegistryOnly {
		if explicit != "" || strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, ".") {
			return nil, fmt.Errorf("%q is not a registry reference (files and directories are not read here)", ref)
		}
	} else if st, err := os.Stat(local); err == nil {
		if st.IsDir() {
			img, err := openLayout(local, plat)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", ref, err)
			}
			return &Image{Image: img, Ref: ref, Source: SourceLayout}, nil
		}
		img, err := tarball.ImageFromPath(local, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: reading docker save tarball: %w", ref, err)
		}
		return &Image{Image: img, Ref: ref, Source: SourceTarball}, nil
	} else if explicit != "" {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	var nopts []name.Option
	if o.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nopts...)
	if err != nil {
		return nil, fmt.Errorf("%q is neither a file, a directory nor an image reference: %w", ref, err)
	}
	keychain := o.Keychain
	if keychain == nil {
		keychain = authn.DefaultKeychain
	}
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(keychain),
		remote.WithPlatform(plat),
	}
	img, err := remote.Image(r, ropts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return &Image{Image: img, Ref: ref, Source: SourceRegistry}, nil
}

// openLayout reads an OCI layout directory: its only image, or the image
// of the wanted platform from its (possibly nested) index.
func openLayout(dir string, plat v1.Platform) (v1.Image, error) {
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, fmt.Errorf("not an OCI image layout (no index.json): %w", err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("reading OCI layout: %w", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("reading OCI layout index: %w", err)
	}
	return pickFromIndex(idx, plat, 0)
}

func pickFromIndex(idx v1.ImageIndex, plat v1.Platform, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("image index nested too deep")
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var images, indexes []v1.Descriptor
	for _, d := range m.Manifests {
		switch {
		case d.MediaType.IsImage():
			images = append(images, d)
		case d.MediaType.IsIndex():
			indexes = append(indexes, d)
		}
	}
	// An index that lists one image without a platform is that image.
	if len(images) == 1 && len(indexes) == 0 && images[0].Platform == nil {
		return idx.Image(images[0].Digest)
	}
	var seen []string
	for _, d := range images {
		if d.Platform == nil {
			continue
		}
		seen = append(seen, d.Platform.OS+"/"+d.Platform.Architecture)
		if d.Platform.OS == plat.OS && d.Platform.Architecture == plat.Architecture &&
			(plat.Variant == "" || d.Platform.Variant == plat.Variant) {
			return idx.Image(d.Digest)
		}
	}
	for _, d := range indexes {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		if img, err := pickFromIndex(child, plat, depth+1); err == nil {
			return img, nil
		}
	}
	if len(images) == 1 && len(seen) == 0 {
		return idx.Image(images[0].Digest)
	}
	return nil, fmt.Errorf("no image for platform %s/%s (the index has: %s)", plat.OS, plat.Architecture, strings.Join(seen, ", "))
}
