package cdi

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// Character device majors that the kernel reserves (Documentation/admin-guide/devices.txt).
const (
	majorNVIDIA = 195 // /dev/nvidia0.., /dev/nvidiactl (minor 255)
	majorDRM    = 226 // /dev/dri/card*, /dev/dri/renderD*
	minorCtl    = 255
)

// host reads the facts a snapshot does not hold: device minors, dynamic
// majors from /proc/devices, MIG capability minors, DRM nodes.
type host struct {
	root fs.FS
	// majors maps a /proc/devices character driver name to its major.
	majors map[string]int64
	// migMinors maps "gpu0/gi1/access" and "gpu0/gi1/ci0/access" to the
	// nvidia-caps minor.
	migMinors map[string]int64
	migErr    error
}

func newHost(root fs.FS) *host {
	h := &host{root: root, majors: map[string]int64{}}
	if b, err := h.read("proc/devices"); err == nil {
		h.majors = parseProcDevices(b)
	}
	b, err := h.read("proc/driver/nvidia-caps/mig-minors")
	if err != nil {
		h.migErr = err
	} else {
		h.migMinors = parseMIGMinors(b)
	}
	return h
}

// maxHostFile bounds what kiln reads from one /proc or /sys file.
const maxHostFile = 1 << 20

func (h *host) read(name string) ([]byte, error) {
	f, err := h.root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxHostFile))
}

func (h *host) exists(name string) bool {
	_, err := fs.Stat(h.root, name)
	return err == nil
}

// parseProcDevices reads the "Character devices:" block of /proc/devices.
func parseProcDevices(b []byte) map[string]int64 {
	m := map[string]int64{}
	inChar := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			inChar = true
			continue
		case strings.HasSuffix(line, "devices:"):
			inChar = false
			continue
		}
		if !inChar {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil || n < 0 {
			continue
		}
		if _, dup := m[f[1]]; !dup {
			m[f[1]] = n
		}
	}
	return m
}

// parseMIGMinors reads /proc/driver/nvidia-caps/mig-minors: lines of
// "gpu0/gi1/ci0/access 13".
func parseMIGMinors(b []byte) map[string]int64 {
	m := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 32)
		if err != nil || n < 0 {
			continue
		}
		m[f[0]] = n
	}
	return m
}

// nvidiaMinor reads "Device Minor:" from /proc/driver/nvidia/gpus/<pci>/information.
func (h *host) nvidiaMinor(pci string) (int64, error) {
	pci, err := hostPCI(pci)
	if err != nil {
		return 0, err
	}
	name := path.Join("proc/driver/nvidia/gpus", pci, "information")
	b, err := h.read(name)
	if err != nil {
		return 0, fmt.Errorf("/%s: %w", name, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "Device Minor" {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil || n < 0 || n >= minorCtl {
			return 0, fmt.Errorf("/%s: cannot read %q as a device minor", name, strings.TrimSpace(v))
		}
		return n, nil
	}
	return 0, fmt.Errorf("/%s: no \"Device Minor\" line", name)
}

// migCaps returns the nvidia-caps minors that grant access to one MIG
// instance (its GPU instance and its compute instance).
func (h *host) migCaps(gpuMinor int64, gi, ci int) (giMinor, ciMinor int64, err error) {
	if h.migErr != nil {
		return 0, 0, fmt.Errorf("/proc/driver/nvidia-caps/mig-minors: %w", h.migErr)
	}
	gk := fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi)
	ck := fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci)
	g, ok1 := h.migMinors[gk]
	c, ok2 := h.migMinors[ck]
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("/proc/driver/nvidia-caps/mig-minors has no %s or %s", gk, ck)
	}
	return g, c, nil
}

// kfdRenderMinor reads drm_render_minor of one KFD topology node.
func (h *host) kfdRenderMinor(node int) (int64, error) {
	name := fmt.Sprintf("sys/class/kfd/kfd/topology/nodes/%d/properties", node)
	b, err := h.read(name)
	if err != nil {
		return 0, fmt.Errorf("/%s: %w", name, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "drm_render_minor" {
			n, err := strconv.ParseInt(f[1], 10, 32)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("/%s: cannot read drm_render_minor %q as a render node minor", name, f[1])
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("/%s: no drm_render_minor", name)
}

// drmNodes lists the DRM nodes ("renderD128", "card0") of a PCI function,
// read from /sys/bus/pci/devices/<pci>/drm.
func (h *host) drmNodes(pci string) (render, card []string, err error) {
	pci, err = hostPCI(pci)
	if err != nil {
		return nil, nil, err
	}
	dir := path.Join("sys/bus/pci/devices", pci, "drm")
	ents, err := fs.ReadDir(h.root, dir)
	if err != nil {
		return nil, nil, fmt.Errorf("/%s: %w", dir, err)
	}
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, "renderD") && isDigits(n[len("renderD"):]):
			render = append(render, n)
		case strings.HasPrefix(n, "card") && isDigits(n[len("card"):]):
			card = append(card, n)
		}
	}
	sort.Strings(render)
	sort.Strings(card)
	if len(render) == 0 {
		return nil, nil, fmt.Errorf("/%s: no renderD node", dir)
	}
	return render, card, nil
}

// hostPCI checks a snapshot's PCI address before it becomes part of a
// host path: only a canonical dddd:bb:dd.f is used.
func hostPCI(pci string) (string, error) {
	if pci == "" {
		return "", fmt.Errorf("the snapshot gives no PCI address")
	}
	c, err := snapshot.CanonicalPCI(pci)
	if err != nil || c != pci {
		return "", fmt.Errorf("PCI address %q is not canonical", pci)
	}
	return c, nil
}

func isDigits(s string) bool {
	if s == "" || len(s) > 6 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
