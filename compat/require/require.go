// Package require parses and evaluates NVIDIA_REQUIRE_CUDA, the condition a
// CUDA container image sets for the driver it needs, as the NVIDIA container
// runtime reads it at container start.
//
// Grammar: clauses separated by spaces are alternatives (OR); the
// conditions of one clause are joined by commas (AND). A condition is
// KEY OP VALUE with KEY one of cuda, driver, arch, brand and OP one of
// =, ==, !=, <, <=, >, >=:
//
//	cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536
//
// reads "the driver supports CUDA 12.4, or it is a Tesla-brand GPU on a 470
// or a 535 driver" (the brand clauses admit older driver branches through
// the CUDA forward-compatibility package the image carries).
package require

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/version"
)

// Keys a condition may test.
const (
	KeyCUDA   = "cuda"
	KeyDriver = "driver"
	KeyArch   = "arch"
	KeyBrand  = "brand"
)

// Condition is one KEY OP VALUE test.
type Condition struct {
	Key   string `json:"key"`
	Op    string `json:"op"`
	Value string `json:"value"`
}

// Clause is a set of conditions that must all hold.
type Clause struct {
	Conditions []Condition `json:"conditions"`
}

// Expr is a parsed NVIDIA_REQUIRE_CUDA: it holds when any clause holds.
type Expr struct {
	Clauses []Clause `json:"clauses"`
}

// maxLen bounds the input: real values are a few hundred bytes.
const maxLen = 64 << 10

var ops = []string{">=", "<=", "==", "!=", ">", "<", "="}

// Parse reads an NVIDIA_REQUIRE_CUDA value. An empty value is an empty
// expression (no requirement).
func Parse(s string) (Expr, error) {
	if len(s) > maxLen {
		return Expr{}, fmt.Errorf("NVIDIA_REQUIRE_CUDA: %d bytes is longer than any real requirement (limit %d)", len(s), maxLen)
	}
	var e Expr
	for _, word := range strings.Fields(s) {
		var c Clause
		for _, part := range strings.Split(word, ",") {
			if part == "" {
				return Expr{}, fmt.Errorf("NVIDIA_REQUIRE_CUDA: clause %q has an empty condition", word)
			}
			cond, err := parseCondition(part)
			if err != nil {
				return Expr{}, fmt.Errorf("NVIDIA_REQUIRE_CUDA: clause %q: %w", word, err)
			}
			c.Conditions = append(c.Conditions, cond)
		}
		e.Clauses = append(e.Clauses, c)
	}
	return e, nil
}

func parseCondition(s string) (Condition, error) {
	i := strings.IndexAny(s, "<>=!")
	if i <= 0 {
		return Condition{}, fmt.Errorf("cannot read %q as KEY OP VALUE (like cuda>=12.4)", s)
	}
	key := strings.ToLower(s[:i])
	rest := s[i:]
	op := ""
	for _, o := range ops {
		if strings.HasPrefix(rest, o) {
			op = o
			break
		}
	}
	if op == "" {
		return Condition{}, fmt.Errorf("%q: unknown operator in %q", key, s)
	}
	val := rest[len(op):]
	if val == "" || strings.ContainsAny(val, "<>=!") {
		return Condition{}, fmt.Errorf("%q: cannot read value %q", s, val)
	}
	switch key {
	case KeyCUDA, KeyDriver, KeyArch:
		if !isVersion(val) {
			return Condition{}, fmt.Errorf("%q: %q is not a version", s, val)
		}
	case KeyBrand:
		if op != "=" && op != "==" && op != "!=" {
			return Condition{}, fmt.Errorf("%q: a brand is compared with = or != only", s)
		}
		val = strings.ToLower(val)
	default:
		return Condition{}, fmt.Errorf("unknown key %q in %q (want cuda, driver, arch or brand)", key, s)
	}
	return Condition{Key: key, Op: op, Value: val}, nil
}

// isVersion accepts dotted decimal numbers: "12", "12.4", "470.82.01".
func isVersion(v string) bool {
	if v == "" || v[0] == '.' || v[len(v)-1] == '.' || strings.Contains(v, "..") {
		return false
	}
	for i := 0; i < len(v); i++ {
		if (v[i] < '0' || v[i] > '9') && v[i] != '.' {
			return false
		}
	}
	return true
}

// String writes the expression back in NVIDIA_REQUIRE_CUDA form.
func (e Expr) String() string {
	words := make([]string, len(e.Clauses))
	for i, c := range e.Clauses {
		words[i] = c.String()
	}
	return strings.Join(words, " ")
}

// String writes one clause ("brand=tesla,driver>=535,driver<536").
func (c Clause) String() string {
	parts := make([]string, len(c.Conditions))
	for i, d := range c.Conditions {
		parts[i] = d.Key + d.Op + d.Value
	}
	return strings.Join(parts, ",")
}

// Facts are what the runtime knows about a GPU and its driver.
type Facts struct {
	// CUDA is the newest CUDA version the driver supports ("12.2").
	CUDA string
	// Driver is the driver version ("535.183.01").
	Driver string
	// Arch is the GPU's compute capability ("9.0").
	Arch string
	// Brands are the product brands the GPU may report, lowercase
	// ("tesla", "nvidia"); empty when unknown.
	Brands []string
}

// Eval says whether the expression holds and which clause made it hold
// (-1 when none did). An empty expression holds. A condition on a fact that
// is unknown does not hold.
func (e Expr) Eval(f Facts) (bool, int) {
	if len(e.Clauses) == 0 {
		return true, -1
	}
	for i, c := range e.Clauses {
		if c.Eval(f) {
			return true, i
		}
	}
	return false, -1
}

// Eval says whether every condition of the clause holds.
func (c Clause) Eval(f Facts) bool {
	for _, d := range c.Conditions {
		if !d.Eval(f) {
			return false
		}
	}
	return true
}

// Eval tests one condition.
func (d Condition) Eval(f Facts) bool {
	var have string
	switch d.Key {
	case KeyCUDA:
		have = f.CUDA
	case KeyDriver:
		have = f.Driver
	case KeyArch:
		have = f.Arch
	case KeyBrand:
		in := false
		for _, b := range f.Brands {
			if strings.EqualFold(b, d.Value) {
				in = true
			}
		}
		if len(f.Brands) == 0 {
			return false
		}
		if d.Op == "!=" {
			return !in
		}
		return in
	default:
		return false
	}
	// A version that does not parse ("", "N/A") is unknown and meets no
	// condition, not even a "<" or "!=".
	c, known := version.Compare(have, d.Value)
	if !known {
		return false
	}
	switch d.Op {
	case "=", "==":
		return c == 0
	case "!=":
		return c != 0
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	case ">":
		return c > 0
	case ">=":
		return c >= 0
	}
	return false
}

// MinCUDA is the CUDA version the expression asks of the driver: the value
// of the first cuda>= (or cuda>, cuda=) condition, "" when there is none.
func (e Expr) MinCUDA() string {
	for _, c := range e.Clauses {
		for _, d := range c.Conditions {
			if d.Key == KeyCUDA && (d.Op == ">=" || d.Op == ">" || d.Op == "=" || d.Op == "==") {
				return d.Value
			}
		}
	}
	return ""
}

// Brands are the brands a clause names with brand= (lowercase).
func (c Clause) Brands() []string {
	var out []string
	for _, d := range c.Conditions {
		if d.Key == KeyBrand && d.Op != "!=" {
			out = append(out, d.Value)
		}
	}
	return out
}

// DriverBranch is the driver branch a clause admits: "535" for
// driver>=535,driver<536; "" when the clause has no lower driver bound.
func (c Clause) DriverBranch() string {
	for _, d := range c.Conditions {
		if d.Key == KeyDriver && (d.Op == ">=" || d.Op == "=" || d.Op == "==") {
			return d.Value
		}
	}
	return ""
}

// ForwardCompatBranches lists the driver branches the brand clauses admit,
// per brand: {"tesla": ["470", "535"]}.
func (e Expr) ForwardCompatBranches() map[string][]string {
	out := map[string][]string{}
	for _, c := range e.Clauses {
		br := c.DriverBranch()
		if br == "" {
			continue
		}
		for _, b := range c.Brands() {
			out[b] = append(out[b], br)
		}
	}
	return out
}
