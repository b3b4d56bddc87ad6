package cdi

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"testing"
	"testing/fstest"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/snapshot"
)

const (
	h100Capture = "../testdata/captures/nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt"
	migCapture  = "../testdata/captures/nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml"
	mi210KFD    = "../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie"
	mi300xKFD   = "../testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz"
)

func load(t testing.TB, p string) *snapshot.Snapshot {
	t.Helper()
	s, err := capture.Load(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// procDevices is /proc/devices of a host with the NVIDIA and AMD drivers
// loaded (dynamic majors as the kernel handed them out on one boot).
const procDevices = `Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
226 drm
234 kfd
508 nvidia-caps
510 nvidia-uvm

Block devices:
  8 sd
259 blkext
`

// nvidiaHost is the /proc of an NVIDIA host whose GPUs are numbered in the
// snapshot's order: /proc/driver/nvidia/gpus/<pci>/information files in
// the driver's layout, and mig-minors for GPU minor 0.
func nvidiaHost(s *snapshot.Snapshot) fstest.MapFS {
	m := fstest.MapFS{"proc/devices": {Data: []byte(procDevices)}}
	for i, g := range s.GPUs {
		info := fmt.Sprintf("Model: \t\t %s\nIRQ:   \t\t 17\nGPU UUID: \t %s\nBus Type: \t PCIe\n"+
			"Bus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n", g.Model, g.UUID, g.PCIAddress, i)
		m["proc/driver/nvidia/gpus/"+g.PCIAddress+"/information"] = &fstest.MapFile{Data: []byte(info)}
	}
	// mig-minors as the driver writes it: config 1, monitor 2, then for
	// each GPU instance one access minor followed by its 8 compute
	// instances' (gi1 access 12, gi1/ci0 access 13).
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	minor := 3
	for gi := 0; gi < 15; gi++ {
		fmt.Fprintf(&b, "gpu0/gi%d/access %d\n", gi, minor)
		minor++
		for ci := 0; ci < 8; ci++ {
			fmt.Fprintf(&b, "gpu0/gi%d/ci%d/access %d\n", gi, ci, minor)
			minor++
		}
	}
	m["proc/driver/nvidia-caps/mig-minors"] = &fstest.MapFile{Data: []byte(b.String())}
	return m
}

// kfdHost puts a KFD topology capture (directory or .tar.gz) where the
// kernel shows it, under sys/class/kfd/kfd/topology.
func kfdHost(t testing.TB, p string) fstest.MapFS {
	t.Helper()
	m := fstest.MapFS{"proc/devices": {Data: []byte(procDevices)}}
	const top = "sys/class/kfd/kfd/topology/"
	if strings.HasSuffix(p, ".tar.gz") {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag != tar.TypeReg {
				continue
			}
			name := path.Clean(h.Name)
			i := strings.Index(name, "nodes/")
			if i < 0 {
				continue
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			m[top+name[i:]] = &fstest.MapFile{Data: b}
		}
		return m
	}
	err := fs.WalkDir(os.DirFS(p), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path.Join(p, name))
		m[top+name] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// elfLibrary is a minimal ELF64 shared object whose only content is a
// DT_SONAME entry: enough for the soname reader, no toolchain needed.
func elfLibrary(so string) []byte {
	le := binary.LittleEndian
	dynstr := append(append([]byte{0}, so...), 0)
	var dynamic []byte
	dynamic = le.AppendUint64(dynamic, 14) // DT_SONAME
	dynamic = le.AppendUint64(dynamic, 1)  // offset of the name in .dynstr
	dynamic = le.AppendUint64(dynamic, 0)  // DT_NULL
	dynamic = le.AppendUint64(dynamic, 0)
	shstr := []byte("\x00.dynstr\x00.dynamic\x00.shstrtab\x00")

	off := uint64(64)
	dynstrOff := off
	off += uint64(len(dynstr))
	off = (off + 7) &^ 7
	dynamicOff := off
	off += uint64(len(dynamic))
	shstrOff := off
	off += uint64(len(shstr))
	off = (off + 7) &^ 7
	shOff := off

	out := make([]byte, shOff)
	copy(out, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1})
	le.PutUint16(out[16:], 3)  // ET_DYN
	le.PutUint16(out[18:], 62) // EM_X86_64
	le.PutUint32(out[20:], 1)
	le.PutUint64(out[40:], shOff)
	le.PutUint16(out[52:], 64) // ehsize
	le.PutUint16(out[54:], 56) // phentsize
	le.PutUint16(out[58:], 64) // shentsize
	le.PutUint16(out[60:], 4)  // shnum
	le.PutUint16(out[62:], 3)  // shstrndx
	copy(out[dynstrOff:], dynstr)
	copy(out[dynamicOff:], dynamic)
	copy(out[shstrOff:], shstr)

	section := func(name, typ uint32, offset, size uint64, link uint32, entsize uint64) {
		var h []byte
		h = le.AppendUint32(h, name)
		h = le.AppendUint32(h, typ)
		h = le.AppendUint64(h, 0) // flags
		h = le.AppendUint64(h, 0) // addr
		h = le.AppendUint64(h, offset)
		h = le.AppendUint64(h, size)
		h = le.AppendUint32(h, link)
		h = le.AppendUint32(h, 0)
		h = le.AppendUint64(h, 1)
		h = le.AppendUint64(h, entsize)
		out = append(out, h...)
	}
	section(0, 0, 0, 0, 0, 0)
	section(1, 3, dynstrOff, uint64(len(dynstr)), 0, 0)    // .dynstr SHT_STRTAB
	section(9, 6, dynamicOff, uint64(len(dynamic)), 1, 16) // .dynamic SHT_DYNAMIC
	section(18, 3, shstrOff, uint64(len(shstr)), 0, 0)     // .shstrtab
	return out
}
