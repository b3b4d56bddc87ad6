//go:build unix

package hostmem

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Alloc maps bytes of anonymous memory, binds it to NUMA node node (-1:
// not bound) and touches every page, so the pages exist on that node
// before a driver pins them or a copy reads them.
func Alloc(bytes int64, node int) (*Region, error) {
	if bytes <= 0 || bytes > 1<<40 {
		return nil, fmt.Errorf("host memory of %d bytes: want 1 byte to 1 TiB", bytes)
	}
	mem, err := unix.Mmap(-1, 0, int(bytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes of host memory: %w", bytes, err)
	}
	r := &Region{mem: mem, Node: -1}
	if node >= 0 {
		if err := bind(mem, node); err != nil {
			_ = unix.Munmap(mem)
			return nil, err
		}
		r.Node = node
	}
	page := os.Getpagesize()
	for i := 0; i < len(mem); i += page {
		mem[i] = 0
	}
	return r, nil
}

// Addr is the region's address in this process.
func (r *Region) Addr() uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(r.mem))))
}

// Free unmaps the region; its address must not be used again.
func (r *Region) Free() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem = nil
	return err
}
