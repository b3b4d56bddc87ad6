package image

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"kiln.dev/kiln/compat/imagetest"
)

func walk(t *testing.T, files []imagetest.File) *Layer {
	t.Helper()
	l, err := WalkLayer(bytes.NewReader(imagetest.Tar(files)), &Extractor{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func paths(facts []Fact) []string {
	var out []string
	for _, f := range facts {
		out = append(out, f.Kind+":"+f.Path)
	}
	return out
}

func TestWalkLayerFacts(t *testing.T) {
	torch := "from typing import Optional\n__version__ = '2.1.0+cu118'\ndebug = False\ncuda: Optional[str] = '11.8'\nhip: Optional[str] = None\n"
	l := walk(t, []imagetest.File{
		{Path: "./usr/local/cuda-11.8/lib64/libcudart.so.11.8.89", Body: imagetest.CUDALibrary([]int{80, 86}, []int{86}, 100)},
		{Path: "usr/local/cuda-11.8/lib64/libcudart.so.11.0", Symlink: "libcudart.so.11.8.89"},
		{Path: "usr/local/cuda-11.8/compat/libcuda.so.520.61.05", Body: []byte("x")},
		{Path: "usr/lib/x86_64-linux-gnu/libcuda.so.535.54.03", Body: []byte("driver copy")},
		{Path: "/opt/rocm-6.1.2/.info/version", Body: []byte("6.1.2-119\n")},
		{Path: "usr/lib/python3/dist-packages/torch/version.py", Body: []byte(torch)},
		{Path: "usr/lib/python3/dist-packages/torch-2.1.0+cu118.dist-info/METADATA", Body: []byte("Name: torch")},
		{Path: "usr/lib/python3/dist-packages/tensorflow/python/platform/build_info.py", Body: []byte("build_info = {'cuda_version': '12.3', 'cudnn_version': '8', 'is_cuda_build': True, 'is_rocm_build': False}\n")},
		{Path: "usr/lib/python3/dist-packages/jaxlib/version.py", Body: []byte("_version = \"0.4.31\"\n")},
		{Path: "usr/lib/python3/dist-packages/jax_cuda12_plugin-0.4.31.dist-info/METADATA", Body: []byte("Name: jax-cuda12-plugin")},
		{Path: "usr/bin/app", Body: imagetest.CUDALibrary([]int{90}, nil, 10), Exec: true},
		{Path: "usr/share/doc/notes.txt", Body: []byte("libcudart.so.12.4.127 is mentioned here")},
	})
	want := []string{
		"gpu-code:usr/local/cuda-11.8/lib64/libcudart.so.11.8.89",
		"library:usr/local/cuda-11.8/lib64/libcudart.so.11.8.89",
		"library:usr/local/cuda-11.8/lib64/libcudart.so.11.0",
		"cuda-compat:usr/local/cuda-11.8/compat/libcuda.so.520.61.05",
		"rocm:opt/rocm-6.1.2/.info/version",
		"python-module:usr/lib/python3/dist-packages/torch/version.py",
		"dist-info:usr/lib/python3/dist-packages/torch-2.1.0+cu118.dist-info",
		"python-module:usr/lib/python3/dist-packages/tensorflow/python/platform/build_info.py",
		"python-module:usr/lib/python3/dist-packages/jaxlib/version.py",
		"dist-info:usr/lib/python3/dist-packages/jax_cuda12_plugin-0.4.31.dist-info",
		"gpu-code:usr/bin/app",
	}
	got := paths(l.Facts)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("facts:\n got %q\nwant %q", got, want)
	}
	if l.Files != 12 || l.Bytes <= 0 {
		t.Errorf("files %d bytes %d", l.Files, l.Bytes)
	}
	by := map[string]Fact{}
	for _, f := range l.Facts {
		by[f.Kind+":"+f.Path] = f
	}
	tv := by["python-module:usr/lib/python3/dist-packages/torch/version.py"]
	if tv.Version != "2.1.0+cu118" || tv.Fields["cuda"] != "11.8" || tv.Fields["hip"] != "" || tv.Name != "torch" {
		t.Errorf("torch version.py read as %+v", tv)
	}
	tf := by["python-module:usr/lib/python3/dist-packages/tensorflow/python/platform/build_info.py"]
	if tf.Fields["cuda_version"] != "12.3" || tf.Fields["cudnn_version"] != "8" || tf.Fields["is_cuda_build"] != "true" {
		t.Errorf("tensorflow build_info read as %+v", tf)
	}
	if j := by["python-module:usr/lib/python3/dist-packages/jaxlib/version.py"]; j.Version != "0.4.31" {
		t.Errorf("jaxlib version %q", j.Version)
	}
	if d := by["dist-info:usr/lib/python3/dist-packages/jax_cuda12_plugin-0.4.31.dist-info"]; d.Name != "jax_cuda12_plugin" || d.Version != "0.4.31" {
		t.Errorf("dist-info %+v", d)
	}
	code := by["gpu-code:usr/local/cuda-11.8/lib64/libcudart.so.11.8.89"].Code
	if code == nil || code.String() != "sm_80 sm_86 compute_86 (PTX ISA 7.8)" {
		t.Errorf("libcudart code %+v", code)
	}
	if c := by["cuda-compat:usr/local/cuda-11.8/compat/libcuda.so.520.61.05"]; c.Version != "520.61.05" {
		t.Errorf("compat %+v", c)
	}
	// ROCm's version file holds the release and a build number: the release is kept.
	if r := by["rocm:opt/rocm-6.1.2/.info/version"]; r.Version != "6.1.2" {
		t.Errorf("rocm %+v", r)
	}
}

func TestWhiteouts(t *testing.T) {
	site := "usr/lib/python3/dist-packages"
	base := walk(t, []imagetest.File{
		{Path: "usr/local/cuda/lib64/libcudart.so.11.8.89", Body: []byte("x")},
		{Path: "usr/local/cuda/lib64/libcublas.so.11.11.3.6", Body: []byte("x")},
		{Path: site + "/torch/version.py", Body: []byte("__version__ = '2.0.1'\n")},
		{Path: site + "/torch-2.0.1.dist-info/METADATA", Body: []byte("x")},
		{Path: "opt/rocm-5.7.0/.info/version", Body: []byte("5.7.0\n")},
	})
	upper := walk(t, []imagetest.File{
		imagetest.Whiteout("usr/local/cuda/lib64/libcudart.so.11.8.89"),
		{Path: "usr/local/cuda/lib64/libcudart.so.12.4.127", Body: []byte("x")},
		imagetest.Opaque(site + "/torch"),
		{Path: site + "/torch/version.py", Body: []byte("__version__ = '2.3.0+cu121'\n")},
		imagetest.Whiteout(site + "/torch-2.0.1.dist-info"),
		imagetest.Whiteout("opt/rocm-5.7.0"),
	})
	if !slices.Equal(upper.Opaque, []string{site + "/torch"}) || len(upper.Whiteouts) != 3 {
		t.Fatalf("opaque %v whiteouts %v", upper.Opaque, upper.Whiteouts)
	}
	got := paths(Merge([]*Layer{base, upper}))
	// Sorted by path.
	want := []string{
		"python-module:" + site + "/torch/version.py",
		"library:usr/local/cuda/lib64/libcublas.so.11.11.3.6",
		"library:usr/local/cuda/lib64/libcudart.so.12.4.127",
	}
	if !slices.Equal(got, want) {
		t.Errorf("merged:\n got %q\nwant %q", got, want)
	}
	merged := Merge([]*Layer{base, upper})
	for _, f := range merged {
		if f.Name == "torch" && f.Version != "2.3.0+cu121" {
			t.Errorf("torch from the lower layer survived: %+v", f)
		}
	}
	// Order matters: the same layers the other way round keep the base's files.
	rev := paths(Merge([]*Layer{upper, base}))
	if !slices.Contains(rev, "library:usr/local/cuda/lib64/libcudart.so.11.8.89") {
		t.Errorf("reverse order lost the base's libcudart: %q", rev)
	}
	// An opaque root hides everything below.
	root := &Layer{Opaque: []string{""}}
	if got := Merge([]*Layer{base, root}); len(got) != 0 {
		t.Errorf("opaque root kept %q", paths(got))
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"./usr/lib/x":    "usr/lib/x",
		"/usr//lib/../x": "usr/x",
		"../../etc/x":    "etc/x",
		"usr/lib/":       "usr/lib",
		"./":             "",
		"a\\b":           "a/b",
	} {
		if got := cleanPath(in); got != want {
			t.Errorf("cleanPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWalkLayerBadTar(t *testing.T) {
	good := imagetest.Tar([]imagetest.File{{Path: "a", Body: bytes.Repeat([]byte("x"), 2000)}})
	_, err := WalkLayer(bytes.NewReader(good[:700]), &Extractor{})
	if err == nil || !strings.Contains(err.Error(), "reading layer tar") {
		t.Errorf("truncated tar: err = %v", err)
	}
}

// FuzzWalkLayer feeds arbitrary bytes as a layer and checks what comes
// out: clean relative paths, no facts without a kind, and that a layer
// whiting out every path it holds leaves nothing.
func FuzzWalkLayer(f *testing.F) {
	f.Add(imagetest.Tar([]imagetest.File{
		{Path: "usr/local/cuda/lib64/libcudart.so.12.4.127", Body: imagetest.CUDALibrary([]int{80}, []int{86}, 10)},
		{Path: "usr/lib/python3/dist-packages/torch/version.py", Body: []byte("__version__ = '2.1.0'\ncuda = '12.1'\n")},
		imagetest.Whiteout("usr/local/cuda/lib64/libcudart.so.11.8.89"),
		imagetest.Opaque("opt/rocm"),
		{Path: "opt/rocm-6.0.2/.info/version", Body: []byte("6.0.2\n")},
	}))
	f.Add(imagetest.Tar([]imagetest.File{{Path: "../../.wh..wh..opq"}, {Path: ".wh."}, {Path: "a/.wh.."}}))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, _ := WalkLayer(bytes.NewReader(b), &Extractor{})
		if l == nil || l.Files < 0 || l.Bytes < 0 {
			t.Fatalf("bad layer %+v", l)
		}
		check := func(p string) {
			if strings.HasPrefix(p, "/") || strings.HasPrefix(p, "./") || slices.Contains(strings.Split(p, "/"), "..") {
				t.Fatalf("unclean path %q", p)
			}
		}
		var wipe Layer
		for _, fct := range l.Facts {
			check(fct.Path)
			if fct.Kind == "" || fct.Path == "" {
				t.Fatalf("fact without kind or path: %+v", fct)
			}
			wipe.Whiteouts = append(wipe.Whiteouts, fct.Path)
		}
		for _, p := range append(l.Whiteouts, l.Opaque...) {
			check(p)
		}
		if got := Merge([]*Layer{l, &wipe}); len(got) != 0 {
			t.Fatalf("whiteouts of every path left %q", paths(got))
		}
		if got := Merge([]*Layer{l}); len(got) > len(l.Facts) {
			t.Fatalf("merge grew facts")
		}
	})
}
