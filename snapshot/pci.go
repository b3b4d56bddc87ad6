package snapshot

import (
	"fmt"
	"strconv"
	"strings"
)

// CanonicalPCI returns a PCI address in kiln's canonical form dddd:bb:dd.f
// (lowercase hex, 4-digit domain). It accepts the forms tools print:
// "00000000:75:00.0" (nvidia-smi, 8-digit domain), "0000:75:00.0" (sysfs),
// "75:00.0" (lspci without -D), and "0000:9b:00" (kernel log, no function:
// function 0 is assumed).
func CanonicalPCI(s string) (string, error) {
	if isCanonical(s) {
		return s, nil
	}
	in := strings.TrimSpace(s)
	t := strings.ToLower(in)
	t = strings.TrimPrefix(t, "pci:")
	if t == "" {
		return "", fmt.Errorf("empty PCI address")
	}
	fn := "0"
	if i := strings.LastIndexByte(t, '.'); i >= 0 {
		fn = t[i+1:]
		t = t[:i]
	}
	parts := strings.Split(t, ":")
	var dom, bus, dev string
	switch len(parts) {
	case 2:
		dom, bus, dev = "0", parts[0], parts[1]
	case 3:
		dom, bus, dev = parts[0], parts[1], parts[2]
	default:
		return "", fmt.Errorf("PCI address %q: want [domain:]bus:device.function", in)
	}
	d, err1 := strconv.ParseUint(dom, 16, 32)
	b, err2 := strconv.ParseUint(bus, 16, 8)
	v, err3 := strconv.ParseUint(dev, 16, 8)
	f, err4 := strconv.ParseUint(fn, 16, 8)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || v > 0x1f || f > 7 || d > 0xffff {
		return "", fmt.Errorf("PCI address %q: want [domain:]bus:device.function in hex", in)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", d, b, v, f), nil
}

// isCanonical is the fast path for addresses already in canonical form.
func isCanonical(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i, c := range []byte(s) {
		if i == 4 || i == 7 || i == 10 {
			continue
		}
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	// device 00-1f, function 0-7
	return s[8] <= '1' && s[11] <= '7'
}

// Ptr returns a pointer to v; sources use it to set optional fields.
func Ptr[T any](v T) *T { return &v }
