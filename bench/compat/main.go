// Command compat measures kiln compat on a large image in a real registry:
// it builds a synthetic CUDA image of about 2 GB of gzip layers, pushes it
// to a docker-registry it starts on a loopback port, and times the whole
// `kiln compat IMAGE --node CAPTURE` process: first scan (throughput in MB/s
// of compressed input, peak resident memory) and second scan from the layer
// cache. When it can build syft (github.com/anchore/syft, from the Go
// module proxy into a temporary module), it times `syft scan` on the same
// image from the same registry and prints both side by side.
//
// With -real DIR the image is made of real GPU binaries instead, from the
// cache scripts/realbin.sh fills: a ROCm library layer of Debian's ROCm 5
// libraries (librocsparse.so alone is 1.25 GB) and a CUDA 11.8 library
// layer, checked against an MI100 node. It also times gzip -dc of the same
// layer files.
//
// Goals: >= 300 MB/s of compressed input on 2 cores, no slower than gzip -dc
// of the same layers, < 100 MB peak memory, < 50 ms from cache, and a
// verdict sooner than syft lists the packages.
//
//	go run ./bench/compat [-gb 2] [-layers 8] [-runs 3] [-syft PATH | -no-syft] [-real DIR]
package main

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"

	"kiln.dev/kiln/compat/fatbin"
	"kiln.dev/kiln/compat/imagetest"
)

const (
	node        = "testdata/captures/nvidia-smi-summary/h100x8-550.90.07.txt"
	amdNode     = "testdata/captures/rocm-smi/mi100-x4-rocm6.0.2-showall.json"
	syftVersion = "v1.57.1"
)

func main() {
	if len(os.Args) > 2 && os.Args[1] == measureChild {
		childMeasure(os.Args[2], os.Args[3:])
		return
	}
	gb := flag.Float64("gb", 2, "target compressed image size in GB")
	nLayers := flag.Int("layers", 8, "number of layers")
	runs := flag.Int("runs", 3, "first-scan runs (each with an empty cache)")
	cores := flag.Int("cores", 2, "GOMAXPROCS for kiln and syft")
	syftBin := flag.String("syft", "", "a syft binary to use instead of building one")
	noSyft := flag.Bool("no-syft", false, "do not run syft")
	keep := flag.Bool("keep", false, "keep the temporary directory")
	realDir := flag.String("real", "", "build the image of real GPU binaries from DIR, the cache of scripts/realbin.sh: a ROCm library layer (Debian's ROCm 5 libraries, over 1 GB) and a CUDA library layer (Debian's CUDA 11.8 libraries); checked against an AMD node")
	flag.Parse()

	dir, err := os.MkdirTemp("", "kiln-bench-compat-")
	if err != nil {
		fail(err)
	}
	if !*keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Println("work dir:", dir)
	}
	kiln := filepath.Join(dir, "kiln")
	if err := run("", nil, "go", "build", "-o", kiln, "./cmd/kiln"); err != nil {
		fail(fmt.Errorf("building kiln: %w", err))
	}
	reg, err := imagetest.StartRegistry("", filepath.Join(dir, "registry"))
	if err != nil {
		fail(err)
	}
	defer reg.Stop()

	// Build and push the image.
	t0 := time.Now()
	var layers []string
	var compressed, uncompressed int64
	var files int
	nodeFile := node
	if *realDir != "" {
		layers, compressed, uncompressed, files, err = buildRealLayers(filepath.Join(dir, "layers"), *realDir)
		nodeFile = amdNode
	} else {
		layers, compressed, uncompressed, files, err = buildLayers(filepath.Join(dir, "layers"), int64(*gb*1e9), *nLayers)
	}
	if err != nil {
		fail(err)
	}
	// gzip -dc of the same layers, one after another: the floor any reader
	// of the image pays with the standard tool.
	var gunzip time.Duration
	for _, l := range layers {
		r, _, err := measure(nil, "sh", "-c", "gzip -dc < '"+l+"' > /dev/null")
		if err != nil {
			fail(fmt.Errorf("gzip -dc %s: %w", l, err))
		}
		gunzip += r.wall
	}
	img, err := assemble(layers)
	if err != nil {
		fail(err)
	}
	built := time.Since(t0)
	t0 = time.Now()
	ref, err := imagetest.Push(reg.Host, "bench/cuda-torch", "1", img)
	if err != nil {
		fail(err)
	}
	pushed := time.Since(t0)
	for _, l := range layers {
		os.Remove(l) // the registry has its own copy
	}
	fmt.Printf("image %s: %d layers, %d files, %.2f GB gzip (%.2f GB uncompressed); built in %s, pushed in %s\n",
		ref, len(layers), files, float64(compressed)/1e9, float64(uncompressed)/1e9, built.Round(time.Second), pushed.Round(time.Second))
	fmt.Printf("kiln and syft run with GOMAXPROCS=%d on a %d-CPU machine\n\n", *cores, numCPU())

	env := []string{fmt.Sprintf("GOMAXPROCS=%d", *cores)}
	args := func(cache string) []string {
		return []string{"compat", ref, "--insecure", "--cache-dir", cache, "--node", nodeFile, "-o", "json"}
	}
	// First scans, each with an empty cache.
	var first []result
	var verdict string
	for i := 0; i < *runs; i++ {
		cache := filepath.Join(dir, fmt.Sprintf("cache-%d", i))
		r, out, err := measure(env, kiln, args(cache)...)
		if err != nil && !isExit(err, 1) && !isExit(err, 2) {
			fail(fmt.Errorf("kiln compat: %w\n%s", err, out))
		}
		first = append(first, r)
		verdict = summary(out)
	}
	// Second scans from the on-disk cache of the first run.
	var second []result
	for i := 0; i < 10; i++ {
		r, out, err := measure(env, kiln, args(filepath.Join(dir, "cache-0"))...)
		if err != nil && !isExit(err, 1) && !isExit(err, 2) {
			fail(fmt.Errorf("kiln compat (cached): %w\n%s", err, out))
		}
		second = append(second, r)
	}
	f, s := median(first), median(second)
	fmt.Printf("kiln compat verdict: %s\n", verdict)
	fmt.Printf("%-34s %10s %12s %10s\n", "", "wall", "MB/s (gzip)", "peak MB")
	fmt.Printf("%-34s %10s %12.0f %10.1f   (median of %d)\n", "kiln first scan (empty cache)", f.wall.Round(time.Millisecond), float64(compressed)/1e6/f.wall.Seconds(), f.peakMB, len(first))
	fmt.Printf("%-34s %10s %12s %10.1f   (median of %d)\n", "kiln second scan (layer cache)", s.wall.Round(time.Millisecond), "-", s.peakMB, len(second))
	fmt.Printf("%-34s %10s %12.0f %10s   (the layer files, one after another)\n", "gzip -dc of the same layers", gunzip.Round(time.Millisecond), float64(compressed)/1e6/gunzip.Seconds(), "-")
	fmt.Printf("\nkiln's first scan took %.2fx the time of gzip -dc\n", f.wall.Seconds()/gunzip.Seconds())

	if *noSyft {
		return
	}
	bin := *syftBin
	if bin == "" {
		bin, err = buildSyft(filepath.Join(dir, "syft-build"))
		if err != nil {
			fmt.Printf("\nsyft: not run: %v\n", err)
			return
		}
	}
	senv := append(env, "SYFT_REGISTRY_INSECURE_USE_HTTP=true", "SYFT_CHECK_FOR_APP_UPDATE=false",
		"XDG_CACHE_HOME="+filepath.Join(dir, "syft-cache"), "HOME="+filepath.Join(dir, "syft-home"))
	sr, out, err := measure(senv, bin, "scan", "registry:"+ref, "-o", "syft-json="+filepath.Join(dir, "sbom.json"), "-q")
	if err != nil {
		fmt.Printf("\nsyft scan failed: %v\n%s\n", err, tail(out, 2000))
		return
	}
	pkgs := countPackages(filepath.Join(dir, "sbom.json"))
	fmt.Printf("%-34s %10s %12.0f %10.1f   (%d packages listed)\n", "syft "+syftVersion+" scan (same image)", sr.wall.Round(time.Millisecond), float64(compressed)/1e6/sr.wall.Seconds(), sr.peakMB, pkgs)
	fmt.Printf("\nkiln's verdict took %.2fx syft's time\n", f.wall.Seconds()/sr.wall.Seconds())
}

type result struct {
	wall   time.Duration
	peakMB float64
}

// measureChild is the argument that makes this program run one command
// and report its wall time and peak memory. A child's ru_maxrss starts
// from the memory of the process that forked it, so the command is started
// from this small process, not from the one holding the built image.
const measureChild = "-measure-child"

func measure(env []string, bin string, args ...string) (result, []byte, error) {
	self, err := os.Executable()
	if err != nil {
		return result{}, nil, err
	}
	cmd := exec.Command(self, append([]string{measureChild, bin}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, stats bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.ExtraFiles = nil
	statsR, statsW, err := os.Pipe()
	if err != nil {
		return result{}, nil, err
	}
	cmd.ExtraFiles = []*os.File{statsW}
	if err := cmd.Start(); err != nil {
		return result{}, nil, err
	}
	statsW.Close()
	_, _ = io.Copy(&stats, statsR)
	statsR.Close()
	err = cmd.Wait()
	var r struct {
		WallNS int64   `json:"wall_ns"`
		PeakMB float64 `json:"peak_mb"`
		Exit   int     `json:"exit"`
	}
	if jerr := json.Unmarshal(stats.Bytes(), &r); jerr != nil {
		return result{}, out.Bytes(), fmt.Errorf("measuring %s: %v (%v)", bin, jerr, err)
	}
	res := result{wall: time.Duration(r.WallNS), peakMB: r.PeakMB}
	if r.Exit != 0 {
		return res, out.Bytes(), exitCode(r.Exit)
	}
	return res, out.Bytes(), nil
}

type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// childMeasure runs bin, passes its output through and writes its wall
// time and peak resident memory as JSON to file descriptor 3.
func childMeasure(bin string, args []string) {
	stats := os.NewFile(3, "stats")
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
		fmt.Fprintln(os.Stderr, err)
	}
	peak := 0.0
	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			peak = float64(ru.Maxrss) / 1024 // Linux reports KiB
		}
	}
	_ = json.NewEncoder(stats).Encode(map[string]any{"wall_ns": wall.Nanoseconds(), "peak_mb": peak, "exit": code})
}

func isExit(err error, code int) bool {
	var ec exitCode
	return errors.As(err, &ec) && int(ec) == code
}

func median(rs []result) result {
	sort.Slice(rs, func(i, j int) bool { return rs[i].wall < rs[j].wall })
	m := rs[len(rs)/2]
	for _, r := range rs {
		m.peakMB = max(m.peakMB, r.peakMB)
	}
	return m
}

// summary reads the verdict of the first GPU from kiln's JSON.
func summary(out []byte) string {
	var rep struct {
		Nodes []struct {
			GPUs []struct {
				Model   string   `json:"model"`
				Verdict string   `json:"verdict"`
				Reasons []string `json:"reasons"`
			} `json:"gpus"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Nodes) == 0 || len(rep.Nodes[0].GPUs) == 0 {
		return "unreadable output: " + tail(out, 300)
	}
	g := rep.Nodes[0].GPUs[0]
	return fmt.Sprintf("%s on %s: %s", g.Verdict, g.Model, strings.Join(g.Reasons, "; "))
}

// buildLayers writes gzip layers of about total bytes together. Layer 0 is
// a base of many small text files; the middle layers hold CUDA libraries
// (ELF files whose .nv_fatbin payloads are random, as compressed cubins
// are, and whose code is low-entropy); the last holds PyTorch's version
// module and libtorch_cuda.so with sm_80/sm_86 and PTX 8.6.
func buildLayers(dir string, total int64, n int) (paths []string, compressed, uncompressed int64, files int, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, 0, 0, 0, err
	}
	n = max(n, 3)
	per := total / int64(n)
	paths = make([]string, n)
	sizes := make([][3]int64, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, numCPU())
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			p := filepath.Join(dir, fmt.Sprintf("layer-%d.tar.gz", i))
			c, u, nf, err := writeLayer(p, i, n, per)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			paths[i], sizes[i] = p, [3]int64{c, u, int64(nf)}
		}(i)
	}
	wg.Wait()
	if firstErr != nil {
		return nil, 0, 0, 0, firstErr
	}
	for _, s := range sizes {
		compressed += s[0]
		uncompressed += s[1]
		files += int(s[2])
	}
	return paths, compressed, uncompressed, files, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func writeLayer(path string, i, n int, target int64) (compressed, uncompressed int64, files int, err error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	cw := &countWriter{w: f}
	zw, _ := gzip.NewWriterLevel(cw, gzip.DefaultCompression)
	uw := &countWriter{w: zw}
	tw := newTarWriter(uw)
	rng := rand.New(rand.NewPCG(uint64(i), 42))
	add := func(name string, body []byte, exec bool) error {
		files++
		return tw.add(name, body, exec)
	}
	switch {
	case i == 0:
		// Base: package files, Python sources, small libraries.
		for k := 0; cw.n < target; k++ {
			if err := add(fmt.Sprintf("usr/lib/python3.10/pkg%03d/mod%05d.py", k%500, k), pySource(rng, 4096+rng.IntN(12000)), false); err != nil {
				return 0, 0, 0, err
			}
			if k%50 == 0 {
				if err := add(fmt.Sprintf("usr/lib/x86_64-linux-gnu/libbase%05d.so.1", k), fatbin.BuildELF(lowEntropy(rng, 200000), nil), false); err != nil {
					return 0, 0, 0, err
				}
			}
			if k%200 == 0 {
				zw.Flush()
			}
		}
	case i < n-1:
		// CUDA libraries.
		libs := []string{"cublasLt", "cublas", "cudnn_engines_precompiled", "cufft", "cusparse", "nccl", "cusolver", "curand"}
		if i == 1 {
			if err := add("usr/local/cuda-12.4/lib64/libcudart.so.12.4.127", cudaELF(rng, []int{70, 75, 80, 86, 89, 90}, 8<<20), false); err != nil {
				return 0, 0, 0, err
			}
		}
		for k := 0; cw.n < target; k++ {
			name := fmt.Sprintf("usr/local/cuda-12.4/lib64/lib%s_%d_%d.so.12.4.5.8", libs[k%len(libs)], i, k)
			if err := add(name, cudaELF(rng, []int{70, 75, 80, 86, 89, 90}, 48<<20), false); err != nil {
				return 0, 0, 0, err
			}
		}
	default:
		site := "usr/local/lib/python3.10/dist-packages/"
		if err := add(site+"torch/version.py", []byte("__version__ = '2.1.0+cu118'\ndebug = False\ncuda: Optional[str] = '11.8'\nhip: Optional[str] = None\n"), false); err != nil {
			return 0, 0, 0, err
		}
		if err := add(site+"torch-2.1.0+cu118.dist-info/METADATA", []byte("Name: torch\nVersion: 2.1.0+cu118\n"), false); err != nil {
			return 0, 0, 0, err
		}
		for k := 0; cw.n < target; k++ {
			name := site + fmt.Sprintf("torch/lib/libtorch_cuda_part%d.so", k)
			if k == 0 {
				name = site + "torch/lib/libtorch_cuda.so"
			}
			if err := add(name, cudaELFPTX(rng, []int{80, 86}, []int{86}, 48<<20), false); err != nil {
				return 0, 0, 0, err
			}
		}
	}
	if err := tw.close(); err != nil {
		return 0, 0, 0, err
	}
	if err := zw.Close(); err != nil {
		return 0, 0, 0, err
	}
	return cw.n, uw.n, files, nil
}

// cudaELF is a CUDA library of about size bytes: 35 % low-entropy code,
// 65 % fat binary whose payloads are random (compressed cubins).
func cudaELF(rng *rand.Rand, sass []int, size int) []byte { return cudaELFPTX(rng, sass, nil, size) }

func cudaELFPTX(rng *rand.Rand, sass, ptx []int, size int) []byte {
	var entries []fatbin.Entry
	for _, a := range sass {
		entries = append(entries, fatbin.Entry{Kind: fatbin.KindELF, Arch: a})
	}
	for _, a := range ptx {
		entries = append(entries, fatbin.Entry{Kind: fatbin.KindPTX, Arch: a})
	}
	fatSize := size * 65 / 100
	// Several containers, as real libraries have many.
	const perContainer = 4 << 20
	var fb []byte
	for len(fb) < fatSize {
		payload := perContainer / len(entries)
		c := fatbin.BuildContainer(entries, payload)
		padded := (payload + 7) &^ 7
		for k := range entries {
			off := 16 + k*(64+padded) + 64
			fillRandom(rng, c[off:off+payload])
		}
		fb = append(fb, c...)
	}
	return fatbin.BuildELF(lowEntropy(rng, size-len(fb)), fb)
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
}

// lowEntropy is machine-code-like filler: gzip shrinks it to about half.
func lowEntropy(rng *rand.Rand, n int) []byte {
	b := make([]byte, max(n, 0))
	for i := 0; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v>>(8*k)) & 0x1f
		}
	}
	return b
}

var words = strings.Fields("def class return import self if else for in while try except with as lambda yield None True False tensor device cuda kernel grad shape dtype float32 module forward backward optimizer step batch")

func pySource(rng *rand.Rand, n int) []byte {
	var b bytes.Buffer
	for b.Len() < n {
		for k := 0; k < 8; k++ {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		b.WriteString("\n    ")
	}
	return b.Bytes()
}

// assemble makes an image of gzip layer files, with the config of a CUDA
// 11.8 PyTorch image.
func assemble(paths []string) (v1.Image, error) {
	img := empty.Image
	for _, p := range paths {
		l, err := tarball.LayerFromFile(p)
		if err != nil {
			return nil, err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return nil, err
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "CUDA_VERSION=11.8.0", "NVIDIA_REQUIRE_CUDA=cuda>=11.8 brand=tesla,driver>=470,driver<471"}
	return mutate.ConfigFile(img, cfg)
}

// buildSyft builds syft from the Go module proxy in a module of its own.
func buildSyft(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "syft")
	steps := [][]string{
		{"go", "mod", "init", "kiln.dev/bench/syft"},
		{"go", "get", "github.com/anchore/syft/cmd/syft@" + syftVersion},
		{"go", "build", "-o", bin, "github.com/anchore/syft/cmd/syft"},
	}
	fmt.Printf("\nbuilding syft %s from the Go module proxy (this takes minutes)...\n", syftVersion)
	for _, s := range steps {
		var out bytes.Buffer
		cmd := exec.Command(s[0], s[1:]...)
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%s failed: %w\n%s", strings.Join(s, " "), err, tail(out.Bytes(), 3000))
		}
	}
	return bin, nil
}

func countPackages(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	var doc struct {
		Artifacts []json.RawMessage `json:"artifacts"`
	}
	if json.Unmarshal(b, &doc) != nil {
		return -1
	}
	return len(doc.Artifacts)
}

func run(dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func numCPU() int { return runtime.NumCPU() }

// tarWriter writes regular files, creating their parent directories once.
type tarWriter struct {
	tw   *tar.Writer
	dirs map[string]bool
}

func newTarWriter(w io.Writer) *tarWriter {
	return &tarWriter{tw: tar.NewWriter(w), dirs: map[string]bool{}}
}

func (t *tarWriter) add(name string, body []byte, exec bool) error {
	for d := path.Dir(name); d != "." && d != "/" && !t.dirs[d]; d = path.Dir(d) {
		t.dirs[d] = true
		if err := t.tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return err
		}
	}
	mode := int64(0o644)
	if exec {
		mode = 0o755
	}
	if err := t.tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(body))}); err != nil {
		return err
	}
	_, err := t.tw.Write(body)
	return err
}

func (t *tarWriter) close() error { return t.tw.Close() }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/compat:", err)
	os.Exit(1)
}

// realLayers are the package trees of scripts/realbin.sh's cache that make
// the real image: Debian's ROCm 5 libraries (librocsparse.so alone is
// 1.25 GB), then Debian's CUDA 11.8 libraries.
var realLayers = [][]string{
	{"librocsparse0", "librocrand1", "libamdhip64-5", "libhsa-runtime64-1", "libhipsparse0", "libhiprand1"},
	{"libcublaslt11", "libcublas11", "libcufft10", "libcurand10", "libcudart11.0", "libnvjpeg11"},
}

// buildRealLayers writes one gzip layer per group of realLayers, with every
// file of the package trees under dir/root.
func buildRealLayers(out, dir string) (paths []string, compressed, uncompressed int64, files int, err error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, 0, 0, 0, err
	}
	for i, group := range realLayers {
		p := filepath.Join(out, fmt.Sprintf("real-%d.tar.gz", i))
		f, err := os.Create(p)
		if err != nil {
			return nil, 0, 0, 0, err
		}
		cw := &countWriter{w: f}
		zw, _ := gzip.NewWriterLevel(cw, gzip.DefaultCompression)
		uw := &countWriter{w: zw}
		tw := newTarWriter(uw)
		for _, pkg := range group {
			root := filepath.Join(dir, "root", pkg)
			werr := filepath.WalkDir(root, func(fp string, d os.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return err
				}
				rel, err := filepath.Rel(root, fp)
				if err != nil {
					return err
				}
				body, err := os.ReadFile(fp)
				if err != nil {
					return err
				}
				files++
				return tw.add(filepath.ToSlash(rel), body, false)
			})
			if werr != nil {
				f.Close()
				return nil, 0, 0, 0, fmt.Errorf("%s (run scripts/realbin.sh first): %w", root, werr)
			}
		}
		if err := tw.close(); err != nil {
			return nil, 0, 0, 0, err
		}
		if err := zw.Close(); err != nil {
			return nil, 0, 0, 0, err
		}
		if err := f.Close(); err != nil {
			return nil, 0, 0, 0, err
		}
		paths = append(paths, p)
		compressed += cw.n
		uncompressed += uw.n
	}
	return paths, compressed, uncompressed, files, nil
}
