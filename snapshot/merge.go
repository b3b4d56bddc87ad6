package snapshot

import (
	"reflect"
	"sort"
)

// New returns an empty Snapshot with the current schema version.
func New() *Snapshot {
	return &Snapshot{SchemaVersion: SchemaVersion}
}

// Merge folds several snapshots of one machine into one. Captures of one
// machine complement each other (nvidia-smi -q gives clocks and ECC, lspci
// gives the PCIe tree, dmesg gives events); Merge joins GPUs by PCI address,
// then by UUID, then by matrix name or index when a source knows neither,
// and fills each field from the first snapshot that has it. Lists of events,
// notes, claims and sources are concatenated.
func Merge(parts ...*Snapshot) *Snapshot {
	out := New()
	for _, p := range parts {
		if p == nil {
			continue
		}
		if out.CollectedAt.IsZero() {
			out.CollectedAt = p.CollectedAt
		}
		out.Sources = append(out.Sources, p.Sources...)
		fill(reflect.ValueOf(&out.Host).Elem(), reflect.ValueOf(p.Host))
		fill(reflect.ValueOf(&out.Drivers).Elem(), reflect.ValueOf(p.Drivers))
		for _, g := range p.GPUs {
			mergeGPU(out, g)
		}
		for _, d := range p.PCI {
			mergePCI(out, d)
		}
		for _, l := range p.Links {
			mergeLink(out, l)
		}
		if out.Matrix == nil && p.Matrix != nil {
			m := *p.Matrix
			out.Matrix = &m
		}
		if out.Measurements == nil && p.Measurements != nil {
			m := *p.Measurements
			out.Measurements = &m
		}
		out.Events = append(out.Events, p.Events...)
		out.Claims = append(out.Claims, p.Claims...)
		out.Notes = append(out.Notes, p.Notes...)
	}
	sortGPUs(out.GPUs)
	sort.SliceStable(out.PCI, func(i, j int) bool { return out.PCI[i].Address < out.PCI[j].Address })
	if len(parts) > 0 {
		for i := range out.GPUs {
			out.GPUs[i].Index = i
		}
	}
	return out
}

func sortGPUs(gs []GPU) {
	sort.SliceStable(gs, func(i, j int) bool {
		a, b := gs[i], gs[j]
		if a.PCIAddress != "" && b.PCIAddress != "" {
			return a.PCIAddress < b.PCIAddress
		}
		return a.Index < b.Index
	})
}

func mergeGPU(out *Snapshot, g GPU) {
	for i := range out.GPUs {
		o := &out.GPUs[i]
		same := false
		switch {
		case g.PCIAddress != "" && o.PCIAddress != "":
			same = g.PCIAddress == o.PCIAddress
		case g.UUID != "" && o.UUID != "":
			same = g.UUID == o.UUID
		case g.MatrixName != "" && o.MatrixName != "":
			same = g.MatrixName == o.MatrixName
		}
		if same {
			fill(reflect.ValueOf(o).Elem(), reflect.ValueOf(g))
			return
		}
	}
	out.GPUs = append(out.GPUs, g)
}

func mergePCI(out *Snapshot, d PCIDevice) {
	for i := range out.PCI {
		if out.PCI[i].Address == d.Address {
			fill(reflect.ValueOf(&out.PCI[i]).Elem(), reflect.ValueOf(d))
			return
		}
	}
	out.PCI = append(out.PCI, d)
}

func mergeLink(out *Snapshot, l Link) {
	for i := range out.Links {
		o := &out.Links[i]
		if o.Kind == l.Kind && ((o.A == l.A && o.B == l.B) || (o.A == l.B && o.B == l.A)) {
			fill(reflect.ValueOf(o).Elem(), reflect.ValueOf(l))
			return
		}
	}
	out.Links = append(out.Links, l)
}

// fill sets every zero field of dst from src, recursing into structs and
// pointers to structs. Slices and maps are taken whole when dst has none.
func fill(dst, src reflect.Value) {
	switch dst.Kind() {
	case reflect.Struct:
		if dst.Type().String() == "time.Time" {
			if dst.IsZero() {
				dst.Set(src)
			}
			return
		}
		for i := 0; i < dst.NumField(); i++ {
			if !dst.Field(i).CanSet() {
				continue
			}
			fill(dst.Field(i), src.Field(i))
		}
	case reflect.Pointer:
		if src.IsNil() {
			return
		}
		if dst.IsNil() {
			c := reflect.New(src.Elem().Type())
			c.Elem().Set(src.Elem())
			dst.Set(c)
			return
		}
		if dst.Elem().Kind() == reflect.Struct {
			fill(dst.Elem(), src.Elem())
		}
	default:
		if dst.IsZero() && !src.IsZero() {
			dst.Set(src)
		}
	}
}
