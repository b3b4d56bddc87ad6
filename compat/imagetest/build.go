package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"kiln.dev/kiln/compat/fatbin"
)

// File is one entry of a layer.
type File struct {
	Path string
	Body []byte
	// Mode defaults to 0644 (0755 for Exec).
	Exec bool
	// Symlink makes the entry a symbolic link to this target.
	Symlink string
	// Dir makes the entry a directory.
	Dir bool
}

// Whiteout is the entry that deletes p from lower layers.
func Whiteout(p string) File {
	i := strings.LastIndex(p, "/")
	return File{Path: p[:i+1] + ".wh." + p[i+1:]}
}

// Opaque is the entry that hides the lower content of directory dir.
func Opaque(dir string) File { return File{Path: strings.TrimSuffix(dir, "/") + "/.wh..wh..opq"} }

// Tar writes files as an uncompressed tar stream.
func Tar(files []File) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.Path, Mode: 0o644, Size: int64(len(f.Body)), Typeflag: tar.TypeReg}
		switch {
		case f.Dir:
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case f.Symlink != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.Symlink, 0
		case f.Exec:
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			panic(err) // only reachable with a broken File list in a test
		}
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write(f.Body)
		}
	}
	_ = tw.Close()
	return buf.Bytes()
}

// Layer makes a gzip-compressed layer of files.
func Layer(files []File) (v1.Layer, error) {
	b := Tar(files)
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
}

// Spec describes a GPU image the way kiln's tests need one.
type Spec struct {
	// Arch is the image platform's architecture; "" is amd64.
	Arch string
	// Env is set in the image config ("CUDA_VERSION": "12.4.1", ...).
	Env map[string]string
	// Labels are set in the image config.
	Labels map[string]string
	// CUDA, when set ("12.4.127"), adds libcudart.so.CUDA and
	// libcublas.so.CUDA under /usr/local/cuda/lib64, as ELF objects whose
	// .nv_fatbin sections hold SASS for CUDAArchs (default 7.0-9.0 for
	// 12.x, 7.5-12.0 for 13.x).
	CUDA      string
	CUDAArchs []int
	// CompatDriver, when set ("550.54.15"), adds the CUDA forward
	// compatibility package: /usr/local/cuda/compat/libcuda.so.DRIVER.
	CompatDriver string
	// CuDNN / NCCL add libcudnn.so.VERSION / libnccl.so.VERSION.
	CuDNN, NCCL string
	// Torch, when set ("2.1.0+cu118"), adds torch/version.py with TorchCUDA
	// or TorchHIP, a dist-info directory, and lib/libtorch_cuda.so with
	// SASS for TorchSASS and PTX for TorchPTX.
	Torch, TorchCUDA, TorchHIP string
	TorchSASS, TorchPTX        []int
	// ROCm, when set ("6.1.2"), adds /opt/rocm-ROCm/.info/version and
	// libamdhip64.so.ROCm.
	ROCm string
	// Extra layers go on top, in order.
	Extra [][]File
}

const sitePackages = "usr/local/lib/python3.10/dist-packages"

// CUDALibrary is an ELF shared object with a .nv_fatbin section holding
// SASS for sass and PTX for ptx, and padding text so it has a real size.
func CUDALibrary(sass, ptx []int, textSize int) []byte {
	var entries []fatbin.Entry
	for _, a := range sass {
		entries = append(entries, fatbin.Entry{Kind: fatbin.KindELF, Arch: a})
	}
	for _, a := range ptx {
		entries = append(entries, fatbin.Entry{Kind: fatbin.KindPTX, Arch: a})
	}
	var fb []byte
	if len(entries) > 0 {
		fb = fatbin.BuildContainer(entries, 512)
	}
	text := make([]byte, textSize)
	for i := range text {
		text[i] = byte(i*13 + i>>8)
	}
	return fatbin.BuildELF(text, fb)
}

// Image builds the image a Spec describes: a base layer, a CUDA or ROCm
// layer, a framework layer and the extra layers.
func Image(s Spec) (v1.Image, error) {
	var layers [][]File
	layers = append(layers, []File{
		{Path: "etc/", Dir: true},
		{Path: "etc/os-release", Body: []byte("ID=ubuntu\nVERSION_ID=\"22.04\"\n")},
		{Path: "usr/lib/x86_64-linux-gnu/libc.so.6", Body: fatbin.BuildELF(make([]byte, 4096), nil)},
		{Path: "bin/sh", Body: fatbin.BuildELF(make([]byte, 1024), nil), Exec: true},
	})
	var stack []File
	if s.CUDA != "" {
		archs := s.CUDAArchs
		if archs == nil {
			archs = []int{70, 75, 80, 86, 89, 90}
			if strings.HasPrefix(s.CUDA, "13.") {
				archs = []int{75, 80, 86, 89, 90, 100, 120}
			}
		}
		lib := "usr/local/cuda/lib64/"
		major := strings.SplitN(s.CUDA, ".", 2)[0]
		stack = append(stack,
			File{Path: lib + "libcudart.so." + s.CUDA, Body: CUDALibrary(archs, nil, 2048)},
			File{Path: lib + "libcudart.so." + major, Symlink: "libcudart.so." + s.CUDA},
			File{Path: lib + "libcublas.so." + s.CUDA, Body: CUDALibrary(archs, nil, 4096)},
		)
	}
	if s.CompatDriver != "" {
		stack = append(stack, File{Path: "usr/local/cuda/compat/libcuda.so." + s.CompatDriver, Body: fatbin.BuildELF(make([]byte, 512), nil)})
	}
	if s.CuDNN != "" {
		stack = append(stack, File{Path: "usr/lib/x86_64-linux-gnu/libcudnn.so." + s.CuDNN, Body: fatbin.BuildELF(make([]byte, 512), nil)})
	}
	if s.NCCL != "" {
		stack = append(stack, File{Path: "usr/lib/x86_64-linux-gnu/libnccl.so." + s.NCCL, Body: CUDALibrary([]int{70, 80, 90}, nil, 512)})
	}
	if s.ROCm != "" {
		root := "opt/rocm-" + s.ROCm + "/"
		stack = append(stack,
			File{Path: root + ".info/version", Body: []byte(s.ROCm + "-119\n")},
			File{Path: root + "lib/libamdhip64.so." + s.ROCm, Body: fatbin.BuildELF(make([]byte, 1024), nil)},
		)
	}
	if len(stack) > 0 {
		layers = append(layers, stack)
	}
	if s.Torch != "" {
		q := func(v string) string {
			if v == "" {
				return "None"
			}
			return "'" + v + "'"
		}
		version := fmt.Sprintf("__version__ = '%s'\ndebug = False\ncuda: Optional[str] = %s\ngit_version = '7bcf7da3a268b435777fe87c7794c382f444e86d'\nhip: Optional[str] = %s\n",
			s.Torch, q(s.TorchCUDA), q(s.TorchHIP))
		base := strings.SplitN(s.Torch, "+", 2)[0]
		fw := []File{
			{Path: sitePackages + "/torch/version.py", Body: []byte("from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n" + version)},
			{Path: sitePackages + "/torch-" + base + ".dist-info/METADATA", Body: []byte("Metadata-Version: 2.1\nName: torch\nVersion: " + s.Torch + "\n")},
		}
		if s.TorchCUDA != "" {
			fw = append(fw, File{Path: sitePackages + "/torch/lib/libtorch_cuda.so", Body: CUDALibrary(s.TorchSASS, s.TorchPTX, 8192)})
		}
		layers = append(layers, fw)
	}
	layers = append(layers, s.Extra...)

	img := empty.Image
	for _, files := range layers {
		l, err := Layer(files)
		if err != nil {
			return nil, err
		}
		img, err = mutate.AppendLayers(img, l)
		if err != nil {
			return nil, err
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	if s.Arch != "" {
		cfg.Architecture = s.Arch
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, k := range keys {
		cfg.Config.Env = append(cfg.Config.Env, k+"="+s.Env[k])
	}
	cfg.Config.Labels = s.Labels
	return mutate.ConfigFile(img, cfg)
}

// Push writes an image to the registry as host/repo:tag and returns the reference.
func Push(host, repo, tag string, img v1.Image) (string, error) {
	return PushAuth(host, repo, tag, img, authn.Anonymous)
}

// PushAuth is Push with credentials.
func PushAuth(host, repo, tag string, img v1.Image, auth authn.Authenticator) (string, error) {
	ref := host + "/" + repo + ":" + tag
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(r, img, remote.WithAuth(auth)); err != nil {
		return "", fmt.Errorf("pushing %s: %w", ref, err)
	}
	return ref, nil
}

// PushIndex writes a multi-platform index of the images as host/repo:tag.
func PushIndex(host, repo, tag string, imgs ...v1.Image) (string, error) {
	ref := host + "/" + repo + ":" + tag
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return "", err
	}
	var adds []mutate.IndexAddendum
	for _, img := range imgs {
		cfg, err := img.ConfigFile()
		if err != nil {
			return "", err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture},
		}})
	}
	idx := mutate.AppendManifests(empty.Index, adds...)
	if err := remote.WriteIndex(r, idx); err != nil {
		return "", fmt.Errorf("pushing index %s: %w", ref, err)
	}
	return ref, nil
}
