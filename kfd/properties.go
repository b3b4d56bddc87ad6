package kfd

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// Properties is one KFD "properties" file: one "key value" pair per line,
// values decimal integers. Values are kept as text so that a value too
// large or malformed is reported by the getter that needs it, not by the
// reader.
type Properties map[string]string

// ParseProperties reads a properties file. Blank lines are skipped; a line
// without a value is an error naming the line. The keys and values share
// one copy of data: a tree has thousands of these files (an MI300X in CPX
// mode, 66 nodes of 65 links each), so the reader allocates little per file.
func ParseProperties(data []byte) (Properties, error) {
	p := make(Properties, 16)
	rest := string(data)
	for n := 1; rest != ""; n++ {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		i := strings.IndexFunc(line, unicode.IsSpace)
		if i < 0 {
			return nil, fmt.Errorf("line %d: %q is not a \"key value\" pair", n, truncate(line, 60))
		}
		key, value := line[:i], strings.TrimLeftFunc(line[i:], unicode.IsSpace)
		if strings.IndexFunc(value, unicode.IsSpace) >= 0 {
			return nil, fmt.Errorf("line %d: %q is not a \"key value\" pair", n, truncate(line, 60))
		}
		p[key] = value
	}
	return p, nil
}

// Has says whether the key is present.
func (p Properties) Has(key string) bool {
	_, ok := p[key]
	return ok
}

// Uint returns a key's value as an unsigned integer. ok is false when the
// key is absent; err is set when it is present but not a decimal number.
func (p Properties) Uint(key string) (v uint64, ok bool, err error) {
	s, found := p[key]
	if !found {
		return 0, false, nil
	}
	v, err = strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%s %q is not a decimal number", key, truncate(s, 30))
	}
	return v, true, nil
}

// U returns a key's value, or 0 when it is absent or unreadable.
func (p Properties) U(key string) uint64 {
	v, _, _ := p.Uint(key)
	return v
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
