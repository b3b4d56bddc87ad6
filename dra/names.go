package dra

import (
	"strings"
)

// DNSLabel turns s into a DNS label (RFC 1123: at most 63 lowercase
// letters, digits and '-', starting and ending with a letter or digit):
// other characters become '-', runs of '-' are joined, and what is too long
// is cut. It returns "" when nothing usable is left.
func DNSLabel(s string) string { return dnsName(s, 63, false) }

// DNSSubdomain turns s into a DNS subdomain (labels joined by '.', at most
// 253 characters), the form of a node name.
func DNSSubdomain(s string) string { return dnsName(s, 253, true) }

func dnsName(s string, limit int, dots bool) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(strings.TrimSpace(s)) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case r == '.' && dots:
			out := strings.TrimRight(b.String(), "-.")
			b.Reset()
			b.WriteString(out)
			if out != "" {
				b.WriteByte('.')
			}
			dash = true
		default:
			if !dash && b.Len() > 0 {
				b.WriteByte('-')
				dash = true
			}
		}
	}
	out := b.String()
	if dots {
		labels := strings.Split(out, ".")
		for i, l := range labels {
			if len(l) > 63 {
				l = l[:63]
			}
			labels[i] = strings.Trim(l, "-")
		}
		out = strings.Join(labels, ".")
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return strings.Trim(out, "-.")
}

// labelValue turns s into a Kubernetes label value (at most 63 letters,
// digits, '-', '_' and '.', starting and ending with a letter or digit).
func labelValue(s string) string {
	var b strings.Builder
	sep := false
	for _, r := range strings.TrimSpace(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_':
			b.WriteRune(r)
			sep = false
		default:
			if !sep && b.Len() > 0 {
				b.WriteByte('-')
				sep = true
			}
		}
	}
	out := b.String()
	if len(out) > 63 {
		out = out[:63]
	}
	return strings.Trim(out, "-_.")
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n]
}
