package plan

import "fmt"

func fmtSscanInt(s string, n *int) (int, error) { return fmt.Sscan(s, n) }
