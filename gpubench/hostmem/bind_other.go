//go:build unix && !linux

package hostmem

import "fmt"

func bind(mem []byte, node int) error {
	return fmt.Errorf("%w: NUMA placement is only done on Linux", ErrPlacement)
}
