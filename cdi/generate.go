package cdi

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"kiln.dev/kiln/snapshot"
)

// generator builds one spec; it never fails on a GPU, it leaves the GPU
// out with a note.
type generator struct {
	opts Options
	host *host
	spec cdispec.Spec
	res  Result
	// names already used in the spec.
	names map[string]bool
	// noted avoids repeating one note per GPU for node-wide facts.
	noted     map[string]bool
	hasNVIDIA bool
	// owner maps a GPU's own node to the GPU that has it.
	owner     map[string]string
	nvMounts  []*cdispec.Mount
	nvMounted bool
}

func newGenerator(opts Options) *generator {
	return &generator{
		opts:  opts,
		host:  newHost(opts.Root),
		spec:  cdispec.Spec{Kind: Kind},
		names: map[string]bool{},
		noted: map[string]bool{},
		owner: map[string]string{},
	}
}

func (g *generator) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if g.noted[msg] {
		return
	}
	g.noted[msg] = true
	g.res.Notes = append(g.res.Notes, msg)
}

func (g *generator) finish() *Result {
	if len(g.spec.Devices) > 0 {
		v, err := cdispec.MinimumRequiredVersion(&g.spec)
		if err != nil || v == "" {
			v = cdispec.CurrentVersion
		}
		g.spec.Version = v
		spec := g.spec
		g.res.Spec = &spec
	}
	return &g.res
}

// add puts one device into the spec under each of names that is valid and
// free; it reports whether any name was added.
func (g *generator) add(d Device, names []string, nodes []*cdispec.DeviceNode, mounts []*cdispec.Mount) bool {
	added := false
	for _, name := range names {
		if err := parser.ValidateDeviceName(name); err != nil {
			g.note("device name %q left out: %v", name, err)
			continue
		}
		if g.names[name] {
			g.note("device name %q is used twice in the snapshot; the second is left out", name)
			continue
		}
		g.names[name] = true
		g.spec.Devices = append(g.spec.Devices, cdispec.Device{
			Name: name,
			ContainerEdits: cdispec.ContainerEdits{
				DeviceNodes: cloneNodes(nodes),
				Mounts:      cloneMounts(mounts),
			},
		})
		d.Name = name
		d.QualifiedName = QualifiedName(name)
		d.Nodes = nodePaths(nodes)
		g.res.Devices = append(g.res.Devices, d)
		added = true
	}
	return added
}

// gpuNames are a whole GPU's names: its index and its UUID.
func gpuNames(gpu *snapshot.GPU) []string {
	var names []string
	if gpu.Index >= 0 {
		names = append(names, GPUName(gpu.Index))
	}
	if gpu.UUID != "" {
		names = append(names, gpu.UUID)
	}
	return names
}

func gpuLabel(gpu *snapshot.GPU) string {
	if gpu.PCIAddress != "" {
		return fmt.Sprintf("%d (%s)", gpu.Index, gpu.PCIAddress)
	}
	return fmt.Sprint(gpu.Index)
}

func gpuDevice(gpu *snapshot.GPU) Device {
	return Device{Vendor: gpu.Vendor, GPUIndex: gpu.Index, PCIAddress: gpu.PCIAddress, UUID: gpu.UUID}
}

// own records that nodes belong to gpu; a GPU whose node another GPU
// already has is left out (two GPUs of a snapshot cannot share a node).
func (g *generator) own(gpu *snapshot.GPU, nodes ...*cdispec.DeviceNode) bool {
	label := gpuLabel(gpu)
	for _, n := range nodes {
		if other, ok := g.owner[n.Path]; ok {
			g.note("GPU %s left out: %s is already GPU %s's", label, n.Path, other)
			return false
		}
	}
	for _, n := range nodes {
		g.owner[n.Path] = label
	}
	return true
}

// charNode is a fully described character device: the runtime needs no
// host lookup to create it.
func charNode(p string, major, minor int64) *cdispec.DeviceNode {
	return &cdispec.DeviceNode{Path: p, Type: "c", Major: major, Minor: minor}
}

// sharedNode describes a node every GPU of a vendor needs (/dev/nvidiactl,
// /dev/kfd). Its major comes from /proc/devices; when that does not name
// the driver but the node exists, the runtime reads the node at injection.
func (g *generator) sharedNode(p, driver string, minor int64) *cdispec.DeviceNode {
	if major, ok := g.host.majors[driver]; ok {
		return charNode(p, major, minor)
	}
	if g.host.exists(p[1:]) {
		return &cdispec.DeviceNode{Path: p}
	}
	if g.opts.AssumeNodes {
		g.note("%s: driver %q not in /proc/devices and no such node on this host; assumed present", p, driver)
		return &cdispec.DeviceNode{Path: p}
	}
	g.note("%s: driver %q not in /proc/devices and no such node on this host; left out of every device", p, driver)
	return nil
}

func (g *generator) nvidiaShared() []*cdispec.DeviceNode {
	nodes := []*cdispec.DeviceNode{charNode("/dev/nvidiactl", majorNVIDIA, minorCtl)}
	if n := g.sharedNode("/dev/nvidia-uvm", "nvidia-uvm", 0); n != nil {
		nodes = append(nodes, n)
	}
	if n := g.sharedNode("/dev/nvidia-uvm-tools", "nvidia-uvm", 1); n != nil {
		nodes = append(nodes, n)
	}
	return nodes
}

func (g *generator) nvidia(gpu *snapshot.GPU) []*cdispec.DeviceNode {
	minor, err := g.host.nvidiaMinor(gpu.PCIAddress)
	if err != nil {
		if !g.opts.AssumeNodes || gpu.Index < 0 || gpu.Index >= minorCtl {
			g.note("GPU %s left out: its device minor is unknown: %v", gpuLabel(gpu), err)
			return nil
		}
		minor = int64(gpu.Index)
		g.note("GPU %s: device minor not read from this host (%v); assumed /dev/nvidia%d from its index", gpuLabel(gpu), err, minor)
	}
	gpuNode := charNode(fmt.Sprintf("/dev/nvidia%d", minor), majorNVIDIA, minor)
	if !g.own(gpu, gpuNode) {
		return nil
	}
	g.hasNVIDIA = true
	whole := append([]*cdispec.DeviceNode{gpuNode}, g.nvidiaShared()...)
	mounts := g.nvidiaMounts()
	if !g.add(gpuDevice(gpu), gpuNames(gpu), whole, mounts) {
		g.note("GPU %s left out: it has no usable name", gpuLabel(gpu))
		return nil
	}
	if gpu.MIG == nil || !gpu.MIG.Enabled {
		return whole
	}
	seen := map[MIGRef]bool{}
	for _, mi := range gpu.MIG.Instances {
		ref := MIGRef{GPUInstance: mi.GPUInstance, ComputeInstance: mi.ComputeInstance}
		label := fmt.Sprintf("GPU %s MIG gi %d ci %d", gpuLabel(gpu), ref.GPUInstance, ref.ComputeInstance)
		if seen[ref] {
			g.note("%s is listed twice; the second is left out", label)
			continue
		}
		seen[ref] = true
		if ref.GPUInstance < 0 || ref.ComputeInstance < 0 {
			g.note("%s left out: negative instance id", label)
			continue
		}
		giMinor, ciMinor, err := g.host.migCaps(minor, ref.GPUInstance, ref.ComputeInstance)
		if err != nil {
			g.note("%s left out: %v", label, err)
			continue
		}
		nodes := []*cdispec.DeviceNode{gpuNode, g.capNode(giMinor), g.capNode(ciMinor)}
		nodes = append(nodes, g.nvidiaShared()...)
		d := gpuDevice(gpu)
		d.UUID = mi.UUID
		r := ref
		d.MIG = &r
		names := []string{}
		if gpu.Index >= 0 {
			names = append(names, MIGName(gpu.Index, ref.GPUInstance, ref.ComputeInstance))
		}
		if mi.UUID != "" {
			names = append(names, mi.UUID)
		}
		g.add(d, names, nodes, mounts)
	}
	return whole
}

func (g *generator) capNode(minor int64) *cdispec.DeviceNode {
	p := fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor)
	if major, ok := g.host.majors["nvidia-caps"]; ok {
		return charNode(p, major, minor)
	}
	return &cdispec.DeviceNode{Path: p}
}

func (g *generator) amd(gpu *snapshot.GPU) []*cdispec.DeviceNode {
	render, card, how := g.drm(gpu, true)
	if render == nil {
		return nil
	}
	nodes := drmNodes(render, card)
	if !g.own(gpu, nodes...) {
		return nil
	}
	if kfd := g.sharedNode("/dev/kfd", "kfd", 0); kfd != nil {
		nodes = append(nodes, kfd)
	} else {
		g.note("GPU %s: /dev/kfd is unknown on this host, so ROCm cannot use it (found %s)", gpuLabel(gpu), how)
	}
	if !g.add(gpuDevice(gpu), gpuNames(gpu), nodes, nil) {
		g.note("GPU %s left out: it has no usable name", gpuLabel(gpu))
		return nil
	}
	return nodes
}

func (g *generator) intel(gpu *snapshot.GPU) []*cdispec.DeviceNode {
	render, card, _ := g.drm(gpu, false)
	if render == nil {
		return nil
	}
	nodes := drmNodes(render, card)
	if !g.own(gpu, nodes...) {
		return nil
	}
	if !g.add(gpuDevice(gpu), gpuNames(gpu), nodes, nil) {
		g.note("GPU %s left out: it has no usable name", gpuLabel(gpu))
		return nil
	}
	return nodes
}

// drm finds a GPU's render nodes (minors) and card nodes: from its KFD
// nodes' drm_render_minor (one per AMD partition), else from sysfs.
func (g *generator) drm(gpu *snapshot.GPU, kfd bool) (render, card []int64, how string) {
	var kfdErr error
	if kfd && len(gpu.KFDNodes) > 0 {
		seen := map[int64]bool{}
		for _, n := range gpu.KFDNodes {
			m, err := g.host.kfdRenderMinor(n)
			if err != nil {
				kfdErr = err
				render = nil
				break
			}
			if !seen[m] {
				seen[m] = true
				render = append(render, m)
			}
		}
		if render != nil {
			return render, nil, "KFD topology"
		}
	}
	r, c, err := g.host.drmNodes(gpu.PCIAddress)
	if err == nil {
		for _, n := range r {
			if m, err := parseSuffix(n, "renderD"); err == nil {
				render = append(render, m)
			}
		}
		for _, n := range c {
			if m, err := parseSuffix(n, "card"); err == nil {
				card = append(card, m)
			}
		}
		return render, card, "sysfs drm"
	}
	if kfdErr != nil {
		err = fmt.Errorf("%v; %w", kfdErr, err)
	}
	if g.opts.AssumeNodes && gpu.Index >= 0 && gpu.Index < 64 {
		m := int64(128 + gpu.Index)
		g.note("GPU %s: render node not read from this host (%v); assumed /dev/dri/renderD%d from its index", gpuLabel(gpu), err, m)
		return []int64{m}, nil, "assumed"
	}
	g.note("GPU %s left out: its render node is unknown: %v", gpuLabel(gpu), err)
	return nil, nil, ""
}

// parseSuffix reads the number after prefix ("renderD128" -> 128); the
// host reader only lists names whose suffix is digits.
func parseSuffix(s, prefix string) (int64, error) {
	return strconv.ParseInt(strings.TrimPrefix(s, prefix), 10, 32)
}

func drmNodes(render, card []int64) []*cdispec.DeviceNode {
	var nodes []*cdispec.DeviceNode
	for _, m := range card {
		nodes = append(nodes, charNode(fmt.Sprintf("/dev/dri/card%d", m), majorDRM, m))
	}
	for _, m := range render {
		nodes = append(nodes, charNode(fmt.Sprintf("/dev/dri/renderD%d", m), majorDRM, m))
	}
	return nodes
}

// appendNodes adds nodes whose path is not there yet.
func appendNodes(to []*cdispec.DeviceNode, nodes ...*cdispec.DeviceNode) []*cdispec.DeviceNode {
	for _, n := range nodes {
		dup := false
		for _, t := range to {
			if t.Path == n.Path {
				dup = true
				break
			}
		}
		if !dup {
			to = append(to, n)
		}
	}
	return to
}

func cloneNodes(nodes []*cdispec.DeviceNode) []*cdispec.DeviceNode {
	out := make([]*cdispec.DeviceNode, 0, len(nodes))
	for _, n := range nodes {
		c := *n
		out = append(out, &c)
	}
	return out
}

func cloneMounts(ms []*cdispec.Mount) []*cdispec.Mount {
	if len(ms) == 0 {
		return nil
	}
	out := make([]*cdispec.Mount, 0, len(ms))
	for _, m := range ms {
		c := *m
		c.Options = append([]string(nil), m.Options...)
		out = append(out, &c)
	}
	return out
}

func nodePaths(nodes []*cdispec.DeviceNode) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Path)
	}
	return out
}

// cleanAbs reports whether p is an absolute, clean path other than "/".
func cleanAbs(p string) bool {
	return path.IsAbs(p) && path.Clean(p) == p && p != "/"
}
