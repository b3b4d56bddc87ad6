package hostmem

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mpolBind is MPOL_BIND: allocate only on the nodes of the mask.
const mpolBind = 2

// bind sets the memory policy of mem to node alone (mbind(2)).
func bind(mem []byte, node int) error {
	if node >= maxList {
		return fmt.Errorf("%w: NUMA node %d", ErrPlacement, node)
	}
	mask := make([]uint64, node/64+1)
	mask[node/64] = 1 << (node % 64)
	// The kernel reads maxnode-1 bits of the mask.
	maxnode := uintptr(64*len(mask) + 1)
	_, _, errno := unix.Syscall6(unix.SYS_MBIND, uintptr(unsafe.Pointer(unsafe.SliceData(mem))), uintptr(len(mem)),
		mpolBind, uintptr(unsafe.Pointer(unsafe.SliceData(mask))), maxnode, 0)
	if errno != 0 {
		hint := ""
		if errno == unix.EPERM || errno == unix.ENOSYS {
			hint = " (in a container, mbind needs CAP_SYS_NICE or a seccomp profile that allows it)"
		}
		return fmt.Errorf("%w: mbind to node %d: %v%s", ErrPlacement, node, errno, hint)
	}
	return nil
}
