package topo

import (
	"fmt"
	"strconv"
	"strings"
)

// importedCell reads the pair from an imported matrix (nvidia-smi topo -m,
// rocm-smi --showtopo), taking the class as printed. PCIe classes are rated
// from the two endpoints' own links only, since the bridges between them are
// not known.
func (b *builder) importedCell(i, j int) (Cell, bool) {
	mx := b.s.Matrix
	if mx == nil {
		return Cell{}, false
	}
	mi, oki := b.matrixIndex[b.devs[i].matrixName]
	mj, okj := b.matrixIndex[b.devs[j].matrixName]
	if b.devs[i].matrixName == "" || b.devs[j].matrixName == "" || !oki || !okj {
		return Cell{}, false
	}
	raw := cellAt(mx.Cells, mi, mj)
	if raw == "" {
		raw = cellAt(mx.Cells, mj, mi)
	}
	if raw == "" {
		return Cell{}, false
	}
	origin := fmt.Sprintf("%s as printed by %s", raw, matrixSource(mx))
	cls := strings.ToUpper(raw)
	switch {
	case strings.HasPrefix(cls, "NV") && len(cls) > 2:
		n, err := strconv.Atoi(cls[2:])
		if err != nil || n <= 0 || n > 1000 {
			return Cell{Class: raw, Basis: origin + "; not a class kiln knows"}, true
		}
		return b.nvlinkCell(i, j, n, 0, false, origin), true
	case cls == ClassXGMI:
		p := &pairLinks{}
		if len(mx.Hops) > mi && len(mx.Hops[mi]) > mj {
			p.hops = mx.Hops[mi][mj]
		}
		return b.xgmiCell(i, j, p, origin), true
	case cls == ClassPIX, cls == ClassPXB, cls == ClassPHB, cls == ClassNode, cls == ClassSys, cls == "SOC", cls == "PCIE":
		var hops []hop
		for _, x := range []int{i, j} {
			l := b.endpointLink(x)
			hops = append(hops, hop{child: b.addrOrName(x), childLink: l})
		}
		c := b.rate(raw, "between the two devices' own links; the bridges between are not known", hops)
		c.Basis = origin + "; " + c.Basis
		return c, true
	default:
		return Cell{Class: raw, Basis: origin + "; not a class kiln knows"}, true
	}
}

func cellAt(cells [][]string, i, j int) string {
	if i < 0 || i >= len(cells) || j < 0 || j >= len(cells[i]) {
		return ""
	}
	return strings.TrimSpace(cells[i][j])
}

// sameClass compares classes as printed, treating SOC as SYS.
func sameClass(a, b string) bool {
	norm := func(s string) string {
		s = strings.ToUpper(strings.TrimSpace(s))
		if s == "SOC" {
			return ClassSys
		}
		return s
	}
	return norm(a) == norm(b)
}

// uni formats a per-direction bandwidth with its unit and qualifier.
func uni(gbps float64) string { return gbpsText(gbps) + " GB/s (uni)" }

// bidi formats a bidirectional bandwidth with its unit and qualifier.
func bidi(gbps float64) string { return gbpsText(gbps) + " GB/s (bidi)" }

func gbpsText(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
