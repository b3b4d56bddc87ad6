package hostmem

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseList(t *testing.T) {
	for in, want := range map[string][]int{
		"":            nil,
		"0":           {0},
		"0-1\n":       {0, 1},
		"0-3,8,10-11": {0, 1, 2, 3, 8, 10, 11},
		"3,1,1-2":     {1, 2, 3},
	} {
		got, err := ParseList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"4 - 5", "0-", "a", "5-2", "-1", "0-4294967296", "0,,1"} {
		if got, err := ParseList(in); err == nil {
			t.Errorf("%q: accepted as %v", in, got)
		}
	}
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{"0-1", "0-3,8,10-11", "", "1,1", "0-65535", "7-3", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseList(s)
		if err != nil {
			return
		}
		if len(got) > maxList {
			t.Fatalf("%q: %d entries", s, len(got))
		}
		if !slices.IsSorted(got) {
			t.Fatalf("%q: not sorted: %v", s, got)
		}
		for i := 1; i < len(got); i++ {
			if got[i] == got[i-1] {
				t.Fatalf("%q: duplicate %d", s, got[i])
			}
		}
	})
}

func TestNodesAndDeviceNode(t *testing.T) {
	root := t.TempDir()
	write := func(rel, s string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := Nodes(root); err != nil || n != nil {
		t.Errorf("no sysfs: %v %v", n, err)
	}
	write("sys/devices/system/node/online", "0-3\n")
	write("sys/devices/system/node/has_memory", "0,2\n")
	if n, err := Nodes(root); err != nil || !slices.Equal(n, []int{0, 2}) {
		t.Errorf("nodes %v %v, want [0 2] (has_memory before online)", n, err)
	}
	write("sys/bus/pci/devices/0000:19:00.0/numa_node", "1\n")
	write("sys/bus/pci/devices/0000:1a:00.0/numa_node", "-1\n")
	write("sys/bus/pci/devices/0000:1b:00.0/numa_node", "x\n")
	if n := DeviceNode(root, "0000:19:00.0"); n == nil || *n != 1 {
		t.Errorf("node %v, want 1", n)
	}
	if n := DeviceNode(root, "0000:1a:00.0"); n == nil || *n != -1 {
		t.Errorf("node %v, want -1", n)
	}
	for _, bad := range []string{"0000:1b:00.0", "0000:99:00.0", "../../etc", ""} {
		if n := DeviceNode(root, bad); n != nil {
			t.Errorf("%q: node %d", bad, *n)
		}
	}
}

func TestAlloc(t *testing.T) {
	r, err := Alloc(1<<20, -1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Len() != 1<<20 || r.Addr() == 0 || r.Node != -1 {
		t.Errorf("region %d bytes at %#x node %d", r.Len(), r.Addr(), r.Node)
	}
	if err := r.Free(); err != nil {
		t.Fatal(err)
	}
	if err := r.Free(); err != nil {
		t.Errorf("second free: %v", err)
	}
	// Node 0 exists wherever Linux runs with NUMA; without NUMA support
	// the error says the memory could not be placed.
	r, err = Alloc(1<<20, 0)
	switch {
	case err == nil:
		if r.Node != 0 {
			t.Errorf("node %d", r.Node)
		}
		_ = r.Free()
	case !errors.Is(err, ErrPlacement):
		t.Errorf("placing on node 0: %v", err)
	}
	if _, err := Alloc(1<<20, 4000); !errors.Is(err, ErrPlacement) {
		t.Errorf("node 4000: %v, want ErrPlacement", err)
	}
	if _, err := Alloc(0, -1); err == nil {
		t.Error("0 bytes accepted")
	}
}
