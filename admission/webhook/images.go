// Package webhook serves kiln's admission webhook: it reads a Pod's images
// from their registries and the cluster's ResourceSlices, and answers the
// apiserver's AdmissionReviews with what package admission decides.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/image"
)

// Registry reads images from their registries, by reference, with the
// credentials of the Pod that names them.
type Registry struct {
	// Insecure allows plain HTTP registries (a lab's air-gapped one).
	Insecure bool
	// Cache keeps the layers' results on disk; nil reads every layer.
	Cache *image.Cache

	mu       sync.Mutex
	byDigest map[string]*compat.Requirements
}

// maxCached bounds the requirements kept in memory, by digest.
const maxCached = 4096

// Read returns what kiln compat reads of the image. Only registry
// references are read, never a file of the webhook's machine, and only
// with the credentials given (the Pod's pull secrets), never the
// webhook's own.
func (r *Registry) Read(ctx context.Context, ref string, creds []DockerConfig) (*compat.Requirements, error) {
	img, err := image.Open(ctx, ref, image.OpenOptions{Insecure: r.Insecure, RegistryOnly: true, Keychain: keychain(creds)})
	if err != nil {
		return nil, err
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	r.mu.Lock()
	if req := r.byDigest[d.String()]; req != nil {
		r.mu.Unlock()
		return req, nil
	}
	r.mu.Unlock()
	res, err := image.Scan(ctx, img, image.ScanOptions{Cache: r.Cache})
	if err != nil {
		return nil, err
	}
	req := compat.FromScan(res)
	r.mu.Lock()
	if r.byDigest == nil || len(r.byDigest) >= maxCached {
		r.byDigest = map[string]*compat.Requirements{}
	}
	r.byDigest[d.String()] = req
	r.mu.Unlock()
	return req, nil
}

// DockerConfig is the content of a kubernetes.io/dockerconfigjson Secret.
type DockerConfig struct {
	Auths map[string]struct {
		Username string `json:"username,omitempty"`
		Password string `json:"password,omitempty"`
		Auth     string `json:"auth,omitempty"`
	} `json:"auths"`
}

// ParseDockerConfig reads a pull secret's .dockerconfigjson.
func ParseDockerConfig(b []byte) (DockerConfig, error) {
	var c DockerConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("pull secret: %w", err)
	}
	return c, nil
}

// keychain gives a registry the first matching credentials of creds, or
// none (anonymous).
func keychain(creds []DockerConfig) authn.Keychain { return secretKeychain(creds) }

type secretKeychain []DockerConfig

func (k secretKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	for _, c := range k {
		for host, a := range c.Auths {
			if host == res.RegistryStr() || host == "https://"+res.RegistryStr() || host == "http://"+res.RegistryStr() {
				return authn.FromConfig(authn.AuthConfig{Username: a.Username, Password: a.Password, Auth: a.Auth}), nil
			}
		}
	}
	return authn.Anonymous, nil
}
