package containerd

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	client "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// NormalizeRef turns a short image reference ("alpine",
// "registry.lab:5000/train") into the full form containerd stores
// ("docker.io/library/alpine:latest", "registry.lab:5000/train:latest").
func NormalizeRef(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", ref, err)
	}
	return named.String(), nil
}

// plainHTTP reports whether a registry host is reached over plain HTTP.
func (e *Executor) plainHTTP(host string) (bool, error) {
	for _, h := range e.cfg.PlainHTTP {
		if h == "*" || strings.EqualFold(h, host) {
			return true, nil
		}
		// "registry.lab" names the host on every port.
		if hn, _, err := net.SplitHostPort(host); err == nil && strings.EqualFold(h, hn) {
			return true, nil
		}
	}
	return false, nil
}

func (e *Executor) resolverOpts() []client.RemoteOpt {
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(e.plainHTTP)),
	})
	opts := []client.RemoteOpt{client.WithResolver(resolver), client.WithPullUnpack}
	if e.cfg.Snapshotter != "" {
		opts = append(opts, client.WithPullSnapshotter(e.cfg.Snapshotter))
	}
	return opts
}

// Pull fetches and unpacks an image unless it is there already, and
// returns it. Jobs call it through Start; an agent may call it ahead of
// time to warm a node.
func (e *Executor) Pull(ctx context.Context, ref string) (client.Image, error) {
	ctx = e.ns(ctx)
	full, err := NormalizeRef(ref)
	if err != nil {
		return nil, err
	}
	img, err := e.client.GetImage(ctx, full)
	switch {
	case err == nil:
		unpacked, err := img.IsUnpacked(ctx, e.snapshotter())
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", full, err)
		}
		if !unpacked {
			if err := img.Unpack(ctx, e.snapshotter()); err != nil {
				return nil, fmt.Errorf("image %s: unpacking: %w", full, err)
			}
		}
		return img, nil
	case !errdefs.IsNotFound(err):
		return nil, fmt.Errorf("image %s: %w", full, err)
	}
	e.log.Info("pulling image", "image", full)
	img, err = e.client.Pull(ctx, full, e.resolverOpts()...)
	if err != nil {
		hint := ""
		if strings.Contains(err.Error(), "http: server gave HTTP response to HTTPS client") && !slices.Contains(e.cfg.PlainHTTP, "*") {
			hint = " (the registry speaks plain HTTP: allow it with the plain-HTTP registry setting)"
		}
		return nil, fmt.Errorf("pulling %s: %w%s", full, err, hint)
	}
	return img, nil
}

// snapshotter is the configured one or containerd's default.
func (e *Executor) snapshotter() string {
	if e.cfg.Snapshotter != "" {
		return e.cfg.Snapshotter
	}
	return defaults.DefaultSnapshotter
}
