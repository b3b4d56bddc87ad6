package capture

import (
	"context"
	"os"
	"testing"
	"testing/fstest"
)

func TestKFDTopologyLoad(t *testing.T) {
	for _, tc := range []struct {
		path       string
		gpus       int
		partitions int
		hives      int
	}{
		{"../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie", 8, 8, 2},
		{"../testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz", 8, 63, 1},
	} {
		s, err := Load(context.Background(), tc.path)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		if len(s.Sources) != 1 || s.Sources[0].Kind != "kfd-topology" || s.Sources[0].Path != tc.path {
			t.Errorf("%s: sources %+v", tc.path, s.Sources)
		}
		nodes := 0
		hives := map[string]bool{}
		for _, g := range s.GPUs {
			nodes += len(g.KFDNodes)
			hives[g.XGMIHive] = true
		}
		if len(s.GPUs) != tc.gpus || nodes != tc.partitions || len(hives) != tc.hives {
			t.Errorf("%s: %d GPUs, %d KFD nodes, %d hives; want %d, %d, %d",
				tc.path, len(s.GPUs), nodes, len(hives), tc.gpus, tc.partitions, tc.hives)
		}
	}
}

func TestKFDTopologyDetect(t *testing.T) {
	imp := treeImporterFor(t, "kfd-topology")
	if !imp.Detect(os.DirFS("../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie")) {
		t.Error("MI210 copy not detected")
	}
	for name, fsys := range map[string]fstest.MapFS{
		"pci sysfs copy":         {"devices/0000:03:00.0/vendor": {Data: []byte("0x1002\n")}},
		"nodes without KFD keys": {"nodes/0/properties": {Data: []byte("hello world\n")}},
		"two top folders": {
			"a/nodes/0/properties": {Data: []byte("simd_count 0\ncpu_cores_count 4\n")},
			"b/x":                  {Data: []byte("1")},
		},
	} {
		if imp.Detect(fsys) {
			t.Errorf("%s: detected as a KFD topology", name)
		}
	}
}

func treeImporterFor(t *testing.T, kind string) TreeImporter {
	t.Helper()
	for _, imp := range treeImporters {
		if imp.Kind == kind {
			return imp
		}
	}
	t.Fatalf("no tree importer %s", kind)
	return TreeImporter{}
}
