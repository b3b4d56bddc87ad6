package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"path"
	"regexp"
	"strings"

	"kiln.dev/kiln/compat/fatbin"
	"kiln.dev/kiln/compat/offload"
	"kiln.dev/kiln/compat/pkgdb"
)

// Fact kinds.
const (
	// KindLibrary is a versioned shared library of a GPU stack, read from
	// its name: libcudart.so.12.4.127 -> Name "cudart", Version "12.4.127".
	KindLibrary = "library"
	// KindCUDACompat is a libcuda.so.VERSION in a compat/ directory: the
	// CUDA forward-compatibility package, Version is its driver version.
	KindCUDACompat = "cuda-compat"
	// KindROCm is ROCm's own version file (/opt/rocm*/.info/version).
	KindROCm = "rocm"
	// KindPython is a framework's version module (torch/version.py,
	// tensorflow's build_info.py, jax/version.py); Fields hold its values.
	KindPython = "python-module"
	// KindDist is an installed Python distribution (NAME-VERSION.dist-info).
	KindDist = "dist-info"
	// KindGPUCode is an ELF file with CUDA fat binaries (Code lists them)
	// or AMD code objects (AMD lists their targets), or both.
	KindGPUCode = "gpu-code"
	// KindAMDKernels is a file of AMD kernels that names its target
	// (TensileLibrary_gfx90a.co, a MIOpen gfx942130.kdb): AMD lists it.
	KindAMDKernels = "amd-kernels"
	// KindPackages is a package database or a version file (dpkg status,
	// apk, rpm, CUDA's version.json, os-release): Packages holds what it says.
	KindPackages = "packages"
)

// Fact is one thing read from a file of the image.
type Fact struct {
	Path    string            `json:"path"`
	Kind    string            `json:"kind"`
	Name    string            `json:"name,omitempty"`
	Version string            `json:"version,omitempty"`
	Fields  map[string]string `json:"fields,omitempty"`
	Code    *fatbin.Result    `json:"code,omitempty"`
	AMD     *offload.Result   `json:"amd,omitempty"`
	// Packages is what a package database or version file says.
	Packages *pkgdb.Facts `json:"packages,omitempty"`
}

// maxTextFile bounds the body kiln reads of a text file it wants.
const maxTextFile = 64 << 10

// Extractor decides which files to read and reads them. It keeps buffers
// between files; one Extractor serves one goroutine.
type Extractor struct {
	scanner fatbin.Scanner
	amd     offload.Scanner
	peek    [4]byte
}

var (
	libRe         = regexp.MustCompile(`^lib(cudart|cublas|cublasLt|cudnn|nccl|amdhip64|rccl|nvrtc|cufft|curand|cusolver|cusparse|MIOpen|rocblas|cuda)\.so\.([0-9]+(?:\.[0-9]+)*)$`)
	rocmVersionRe = regexp.MustCompile(`^opt/rocm[^/]*/\.info/version(-[a-z]+)?$`)
	distInfoRe    = regexp.MustCompile(`^(.*/)?([A-Za-z0-9_.]+?)-([0-9][^/-]*)\.dist-info/METADATA$`)
	pyAssignRe    = regexp.MustCompile(`^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*[^=]+)?=\s*(.+?)\s*$`)
	pyDictItemRe  = regexp.MustCompile(`['"]([A-Za-z_][A-Za-z0-9_]*)['"]\s*:\s*('([^']*)'|"([^"]*)"|True|False|None|[0-9][0-9.]*)`)
)

// pythonModules maps path suffixes to the framework they describe.
var pythonModules = []struct{ suffix, name string }{
	{"/torch/version.py", "torch"},
	{"/tensorflow/python/platform/build_info.py", "tensorflow"},
	{"/jax/version.py", "jax"},
	{"/jaxlib/version.py", "jaxlib"},
}

// file returns the facts of one tar entry.
func (ex *Extractor) file(p string, h *tar.Header, body io.Reader) ([]Fact, error) {
	base := path.Base(p)
	if m := libRe.FindStringSubmatch(base); m != nil {
		kind := KindLibrary
		if m[1] == "cuda" {
			if path.Base(path.Dir(p)) != "compat" {
				// A libcuda.so baked into an image outside compat/ is a
				// driver library copy, not a requirement.
				return nil, nil
			}
			kind = KindCUDACompat
		}
		f := Fact{Path: p, Kind: kind, Name: m[1], Version: m[2]}
		if h.Typeflag == tar.TypeSymlink {
			return []Fact{f}, nil
		}
		facts := []Fact{f}
		code, err := ex.elfCode(p, h, body)
		if err != nil {
			return nil, err
		}
		if code != nil {
			facts = append(facts, *code)
		}
		return facts, nil
	}
	if h.Typeflag != tar.TypeReg {
		return nil, nil
	}
	if rocmVersionRe.MatchString(p) {
		b, err := readBounded(body)
		if err != nil {
			return nil, err
		}
		v, err := pkgdb.ROCmInfoVersion(string(b))
		if err != nil {
			// A version file that holds no release is no fact: a build id
			// or junk is never taken for a ROCm version.
			return nil, nil
		}
		return []Fact{{Path: p, Kind: KindROCm, Name: "rocm", Version: v}}, nil
	}
	if pkgdb.Wants(p) {
		b, err := io.ReadAll(io.LimitReader(body, pkgdb.MaxBytes(p)))
		if err != nil {
			return nil, err
		}
		pf, err := pkgdb.Read(p, bytes.NewReader(b))
		if err != nil {
			// An unreadable database is reported by what it lacks, not
			// fatal to the scan.
			return nil, nil
		}
		if len(pf.Packages) == 0 && len(pf.CUDA) == 0 && len(pf.ROCm) == 0 && pf.OS == "" {
			return nil, nil
		}
		pf.Packages = gpuPackages(pf.Packages)
		return []Fact{{Path: p, Kind: KindPackages, Packages: &pf}}, nil
	}
	if m := distInfoRe.FindStringSubmatch(p); m != nil {
		return []Fact{{Path: path.Dir(p), Kind: KindDist, Name: normalizeDist(m[2]), Version: m[3]}}, nil
	}
	for _, pm := range pythonModules {
		if strings.HasSuffix("/"+p, pm.suffix) {
			b, err := readBounded(body)
			if err != nil {
				return nil, err
			}
			f := parsePythonModule(pm.name, b)
			f.Path = p
			return []Fact{f}, nil
		}
	}
	code, err := ex.elfCode(p, h, body)
	if err != nil {
		return nil, err
	}
	if code != nil {
		return []Fact{*code}, nil
	}
	// Kernel files ROCm libraries load at run time name their target.
	if t, ok := offload.TargetFromName(base); ok {
		return []Fact{{Path: p, Kind: KindAMDKernels, AMD: &offload.Result{Targets: []offload.Target{t}}}}, nil
	}
	return nil, nil
}

// elfCode reads any regular file that is an ELF object (shared library,
// executable, Python or Node.js extension module, plugin, AMD code object;
// whatever its name or mode) as a stream and returns a gpu-code fact when it
// holds CUDA fat binaries or AMD code objects. One pass feeds both readers.
func (ex *Extractor) elfCode(p string, h *tar.Header, body io.Reader) (*Fact, error) {
	if h.Typeflag != tar.TypeReg || h.Size < 64 {
		return nil, nil
	}
	if _, err := io.ReadFull(body, ex.peek[:]); err != nil {
		return nil, nil
	}
	if string(ex.peek[:]) != "\x7fELF" {
		return nil, nil
	}
	src := io.MultiReader(bytes.NewReader(ex.peek[:]), body)
	pr, pw := io.Pipe()
	type amdOut struct {
		res *offload.Result
		err error
	}
	done := make(chan amdOut, 1)
	go func() {
		res, err := ex.amd.Scan(pr, h.Size)
		// Read what the scanner left, so the writer never blocks.
		_, _ = io.Copy(io.Discard, pr)
		done <- amdOut{res, err}
	}()
	res, err := ex.scanner.Scan(io.TeeReader(src, pw), h.Size)
	if err == nil {
		// The NVIDIA reader stops at the end of the file; pass on any rest.
		_, err = io.Copy(pw, src)
	}
	pw.CloseWithError(err)
	amd := <-done
	if err != nil {
		if errors.Is(err, fatbin.ErrNotELF) {
			return nil, nil
		}
		return nil, err
	}
	f := &Fact{Path: p, Kind: KindGPUCode}
	if !res.Empty() {
		code := res.Result
		f.Code = &code
	}
	if amd.err == nil && amd.res != nil && !amd.res.Empty() {
		f.AMD = amd.res
	}
	if f.Code == nil && f.AMD == nil {
		return nil, nil
	}
	return f, nil
}

// gpuPackages keeps the packages of GPU stacks (CUDA, ROCm, HIP, drivers,
// the libraries kiln knows): a whole distribution's list would make every
// cached layer large.
func gpuPackages(pk []pkgdb.Package) []pkgdb.Package {
	var out []pkgdb.Package
	for _, p := range pk {
		n := strings.ToLower(p.Name)
		for _, w := range []string{"cuda", "cudnn", "nccl", "cublas", "nvidia", "tensorrt", "rocm", "hip", "amdgpu", "roc", "miopen", "rccl", "hsa"} {
			if strings.Contains(n, w) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

func readBounded(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxTextFile))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// normalizeDist writes a distribution name the way PyPI normalizes it,
// with underscores: "Jax-CUDA12-Plugin" -> "jax_cuda12_plugin".
func normalizeDist(n string) string {
	n = strings.ToLower(n)
	return strings.NewReplacer("-", "_", ".", "_").Replace(n)
}

// parsePythonModule reads NAME = VALUE assignments (torch/version.py,
// jax/version.py) and 'key': value items (tensorflow's build_info dict).
func parsePythonModule(name string, b []byte) Fact {
	f := Fact{Kind: KindPython, Name: name, Fields: map[string]string{}}
	for _, line := range strings.Split(string(b), "\n") {
		if m := pyAssignRe.FindStringSubmatch(line); m != nil && !strings.HasPrefix(strings.TrimSpace(m[2]), "{") {
			if v, ok := pyLiteral(m[2]); ok {
				f.Fields[m[1]] = v
			}
		}
		for _, m := range pyDictItemRe.FindAllStringSubmatch(line, -1) {
			if v, ok := pyLiteral(m[2]); ok {
				f.Fields[m[1]] = v
			}
		}
	}
	for _, k := range []string{"__version__", "_version", "version"} {
		if v := f.Fields[k]; v != "" {
			f.Version = v
			break
		}
	}
	if len(f.Fields) == 0 {
		f.Fields = nil
	}
	return f
}

// pyLiteral reads a Python string, number, True/False or None literal.
// None reads as "" (unknown); anything else is not a literal.
func pyLiteral(s string) (string, bool) {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, " #"); i >= 0 {
		s = strings.TrimSpace(s[:i])
	}
	switch {
	case s == "None":
		return "", true
	case s == "True" || s == "False":
		return strings.ToLower(s), true
	case len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && s[len(s)-1] == s[0]:
		return s[1 : len(s)-1], true
	case s != "" && s[0] >= '0' && s[0] <= '9' && strings.Trim(s, "0123456789.") == "":
		return s, true
	}
	return "", false
}
