package containerdtest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// BuildStatic builds the Go main package in dir as a static Linux binary
// (CGO_ENABLED=0) and returns its path.
func BuildStatic(t testing.TB, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		// go test puts its own toolchain first on PATH.
		t.Fatalf("building %s: the go command is not on PATH: %v", dir, err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(dir))
	cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", dir, err, b)
	}
	return out
}

// Image is an image whose only file is one program, /<name>, which is
// also its entrypoint.
func Image(t testing.TB, program string) v1.Image {
	t.Helper()
	data, err := os.ReadFile(program)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Base(program)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{
		Name: base, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg,
		ModTime: time.Unix(0, 0),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layerData := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerData)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = runtime.GOARCH
	cf.Config.Entrypoint = []string{"/" + base}
	cf.Config.Env = []string{"PATH=/", "KILN_IMAGE_ENV=from-image"}
	cf.Config.WorkingDir = "/"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Push writes img to the registry as repo:tag ("kiln/job:test") over
// plain HTTP and returns the full reference.
func (r *Registry) Push(t testing.TB, img v1.Image, repoTag string) string {
	t.Helper()
	ref, err := name.ParseReference(r.Host+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref.String()
}
