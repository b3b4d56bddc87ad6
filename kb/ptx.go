package kb

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

// PTXISA is one PTX ISA version and the CUDA release that introduced it
// (kb/data/ptx.yaml). The driver that can JIT-compile it is not stored here:
// MinDriverForPTX takes it from the CUDA release's row in cuda.yaml.
type PTXISA struct {
	ISA  string `json:"isa"`  // "8.5"
	CUDA string `json:"cuda"` // "12.5"
	// AlsoCUDA are later releases that emit the same version ("12.6").
	AlsoCUDA []string `json:"also_cuda,omitempty"`
	// DriverBranch is set only where cuda.yaml has no row for the release
	// (CUDA 9.x, the unreleased 12.7): the branch the PTX ISA document gives,
	// standing as the lowest driver ("565" = any 565.x).
	DriverBranch string `json:"driver_branch,omitempty"`
	Note         string `json:"note,omitempty"`
	Source       string `json:"source"`
}

// PTXTarget is an architecture-specific ("sm_90a") or family-specific
// ("sm_100f") compilation target.
type PTXTarget struct {
	Target string `json:"target"`
	// ISA is the first PTX ISA version that lists the target.
	ISA string `json:"isa"`
	// LastISA is the last version that lists it, where a later one dropped it.
	LastISA string `json:"last_isa,omitempty"`
	// Family lists the compute capabilities an f target runs on; empty for
	// an a target (it runs on the capability in its name only) and for an f
	// target whose members no source gives.
	Family []string `json:"family,omitempty"`
	Note   string   `json:"note,omitempty"`
	Source string   `json:"source"`
}

// PTXRule is one compatibility rule, in kiln's words, with its source.
type PTXRule struct {
	ID     string `json:"id"`
	Text   string `json:"text"`
	Source string `json:"source"`
}

// The ids of the rules SASSRunsOn, PTXRunsOn and PTXDriverRule cite.
const (
	ruleSASS      = "sass"
	ruleSASSTegra = "sass-tegra"
	rulePTX       = "ptx"
	ruleArch      = "arch"
	ruleFamily    = "family"
	rulePTXDriver = "ptx-driver"
)

type ptxDoc struct {
	ISA     []PTXISA    `json:"isa"`
	Targets []PTXTarget `json:"targets"`
	Tegra   ptxTegra    `json:"tegra"`
	Rules   []PTXRule   `json:"rules"`
}

// ptxTegra lists the compute capabilities of Tegra GPUs, which cubin
// compatibility across minor versions does not reach.
type ptxTegra struct {
	CC     []string `json:"cc"`
	Source string   `json:"source"`
}

type lazyPTX struct {
	once sync.Once
	src  fileReader
	doc  ptxDoc
	err  error
}

// ptxTables reads kb/data/ptx.yaml on the first call. A KB built in memory
// has no source and gets empty tables.
func (k *KB) ptxTables() (*ptxDoc, error) {
	p := &k.ptx
	p.once.Do(func() {
		if p.src == nil {
			return
		}
		b, err := p.src.ReadFile("data/ptx.yaml")
		if err != nil {
			p.err = fmt.Errorf("kb: %w", err)
			return
		}
		if err := yaml.UnmarshalStrict(b, &p.doc); err != nil {
			p.err = fmt.Errorf("kb: data/ptx.yaml: %w", err)
			return
		}
		p.err = p.doc.validate()
	})
	return &p.doc, p.err
}

func (d *ptxDoc) validate() error {
	var errs []error
	isas := map[string]bool{}
	for i, r := range d.ISA {
		if r.ISA == "" || r.CUDA == "" || r.Source == "" {
			errs = append(errs, fmt.Errorf("kb: ptx isa row %d: isa, cuda and source are required", i))
		}
		if _, _, ok := parseCC(r.ISA); !ok {
			errs = append(errs, fmt.Errorf("kb: ptx isa row %d: isa %q is not major.minor", i, r.ISA))
		}
		isas[r.ISA] = true
	}
	for i, t := range d.Targets {
		tt, ok := parseTarget(t.Target)
		if !ok || tt.suffix == "" || t.ISA == "" || t.Source == "" {
			errs = append(errs, fmt.Errorf("kb: ptx target row %d (%q): an a or f target, isa and source are required", i, t.Target))
			continue
		}
		if !isas[t.ISA] || (t.LastISA != "" && !isas[t.LastISA]) {
			errs = append(errs, fmt.Errorf("kb: ptx target %s: isa %q / last_isa %q not in the isa rows", t.Target, t.ISA, t.LastISA))
		}
		if tt.suffix == "a" && len(t.Family) > 0 {
			errs = append(errs, fmt.Errorf("kb: ptx target %s: an a target has no family", t.Target))
		}
		for _, cc := range t.Family {
			if _, _, ok := parseCC(cc); !ok {
				errs = append(errs, fmt.Errorf("kb: ptx target %s: family member %q is not major.minor", t.Target, cc))
			}
		}
	}
	if len(d.Tegra.CC) > 0 && d.Tegra.Source == "" {
		errs = append(errs, errors.New("kb: ptx tegra: source is required"))
	}
	have := map[string]bool{}
	for i, r := range d.Rules {
		if r.ID == "" || r.Text == "" || r.Source == "" {
			errs = append(errs, fmt.Errorf("kb: ptx rule %d: id, text and source are required", i))
		}
		have[r.ID] = true
	}
	if len(d.ISA) > 0 {
		for _, id := range []string{ruleSASS, ruleSASSTegra, rulePTX, ruleArch, ruleFamily, rulePTXDriver} {
			if !have[id] {
				errs = append(errs, fmt.Errorf("kb: ptx rules: %q is missing", id))
			}
		}
	}
	return errors.Join(errs...)
}

// PTXISAs returns the PTX ISA table (kb/data/ptx.yaml), oldest first.
func (k *KB) PTXISAs() ([]PTXISA, error) {
	d, err := k.ptxTables()
	return d.ISA, err
}

// PTXTargets returns the architecture- and family-specific targets.
func (k *KB) PTXTargets() ([]PTXTarget, error) {
	d, err := k.ptxTables()
	return d.Targets, err
}

// PTXISA returns the row of a PTX ISA version ("8.5", as a PTX file's
// .version directive gives it).
func (k *KB) PTXISA(isa string) (PTXISA, bool) {
	d, _ := k.ptxTables()
	isa = strings.TrimSpace(isa)
	if isa == "" {
		return PTXISA{}, false
	}
	for _, r := range d.ISA {
		if CompareDriver(r.ISA, isa) == 0 {
			return r, true
		}
	}
	return PTXISA{}, false
}

// MinDriverForPTX returns the lowest Linux driver that can JIT-compile PTX
// of an ISA version, and the CUDA release whose driver it is: the toolkit
// driver (min_driver_linux) of the release that introduced the version
// ("7.8" -> 520.61.05, "11.8"). Minor-version compatibility does not cover
// PTX JIT, so the family's compatibility floor does not apply. For a
// release cuda.yaml lacks it is the driver branch the PTX ISA document
// gives ("8.6" -> "565", "12.7"). ok is false for an unknown version.
func (k *KB) MinDriverForPTX(isa string) (driver, cuda string, ok bool) {
	r, found := k.PTXISA(isa)
	if !found {
		return "", "", false
	}
	if c, found := k.MinDriverForCUDA(r.CUDA); found {
		return c.MinDriverLinux, c.Version, true
	}
	if r.DriverBranch != "" {
		return r.DriverBranch, r.CUDA, true
	}
	return "", "", false
}

// MaxPTXForDriver returns the newest PTX ISA version a Linux driver can
// JIT-compile ("535.104.05" -> "8.2"). ok is false for an empty driver or
// one older than every row.
func (k *KB) MaxPTXForDriver(driver string) (isa string, ok bool) {
	if strings.TrimSpace(driver) == "" {
		return "", false
	}
	d, _ := k.ptxTables()
	for _, r := range d.ISA {
		floor, _, found := k.MinDriverForPTX(r.ISA)
		if !found || CompareDriver(floor, driver) > 0 {
			continue
		}
		if !ok || CompareDriver(r.ISA, isa) > 0 {
			isa, ok = r.ISA, true
		}
	}
	return isa, ok
}

// PTXISAForCUDA returns the PTX ISA version a CUDA toolkit release emits
// ("12.6" and "12.6.3" -> "8.5"). ok is false for a release the table does
// not name.
func (k *KB) PTXISAForCUDA(cuda string) (string, bool) {
	mm := majorMinor(cuda)
	if mm == "" {
		return "", false
	}
	d, _ := k.ptxTables()
	for _, r := range d.ISA {
		if CompareDriver(r.CUDA, mm) == 0 {
			return r.ISA, true
		}
		for _, c := range r.AlsoCUDA {
			if CompareDriver(c, mm) == 0 {
				return r.ISA, true
			}
		}
	}
	return "", false
}

// PTXDriverRule is the rule MinDriverForPTX and MaxPTXForDriver apply, in
// words with its source, for a finding to cite; "" without the table.
func (k *KB) PTXDriverRule() string {
	d, _ := k.ptxTables()
	for _, r := range d.Rules {
		if r.ID == rulePTXDriver {
			return r.Text + " [" + r.Source + "]"
		}
	}
	return ""
}

// PTXTargetInfo returns the row of an a or f target ("sm_100f",
// "compute_100f" and "100f" name the same one).
func (k *KB) PTXTargetInfo(target string) (PTXTarget, bool) {
	t, ok := parseTarget(target)
	if !ok || t.suffix == "" {
		return PTXTarget{}, false
	}
	d, _ := k.ptxTables()
	for _, r := range d.Targets {
		if rt, ok := parseTarget(r.Target); ok && rt == t {
			return r, true
		}
	}
	return PTXTarget{}, false
}

// TargetFirstCUDA returns the first CUDA toolkit release that can emit an a
// or f target: the release of the PTX ISA version that first lists it, or,
// where that release never shipped (12.7), the next one cuda.yaml has
// ("sm_100a" -> "12.8"). Plain targets are in cuda-arch.yaml
// (ToolkitTargets).
func (k *KB) TargetFirstCUDA(target string) (string, bool) {
	t, ok := k.PTXTargetInfo(target)
	if !ok {
		return "", false
	}
	r, ok := k.PTXISA(t.ISA)
	if !ok {
		return "", false
	}
	oldest := ""
	for _, c := range k.CUDA {
		if oldest == "" || CompareDriver(c.Version, oldest) < 0 {
			oldest = c.Version
		}
	}
	if _, found := k.MinDriverForCUDA(r.CUDA); found || oldest == "" || CompareDriver(r.CUDA, oldest) < 0 {
		// In cuda.yaml, or older than it (9.x): the release itself.
		return r.CUDA, true
	}
	next := ""
	for _, c := range k.CUDA {
		v := majorMinor(c.Version)
		if CompareDriver(v, r.CUDA) > 0 && (next == "" || CompareDriver(v, next) < 0) {
			next = v
		}
	}
	return next, next != ""
}

// SASSRunsOn reports whether SASS (a cubin) built for target ("sm_86",
// "sm_90a", "sm_100f") runs on a GPU of compute capability cc ("8.9"), with
// the rule and its source. known is false for a target or capability it
// cannot read, an a or f target not in the table, or an f target whose
// family no source gives. It uses the built-in knowledge base.
func SASSRunsOn(target, cc string) (ok bool, rule string, known bool) {
	return Default().SASSRunsOn(target, cc)
}

// PTXRunsOn reports whether PTX built for target ("compute_80",
// "compute_90a", "compute_100f") can be JIT-compiled for compute capability
// cc: plain PTX for any capability at or above the target's, architecture-
// specific PTX for exactly that capability, family PTX for the family's
// members. The driver's PTX ISA version is not considered (MaxPTXForDriver).
// It uses the built-in knowledge base.
func PTXRunsOn(target, cc string) (ok bool, rule string, known bool) {
	return Default().PTXRunsOn(target, cc)
}

// SASSRunsOn is the package function SASSRunsOn on this knowledge base.
func (k *KB) SASSRunsOn(target, cc string) (ok bool, rule string, known bool) {
	return k.runsOn(target, cc, true)
}

// PTXRunsOn is the package function PTXRunsOn on this knowledge base.
func (k *KB) PTXRunsOn(target, cc string) (ok bool, rule string, known bool) {
	return k.runsOn(target, cc, false)
}

func (k *KB) runsOn(target, cc string, sass bool) (bool, string, bool) {
	d, err := k.ptxTables()
	t, okT := parseTarget(target)
	maj, mnr, okC := parseCC(cc)
	if err != nil || !okT || !okC {
		return false, "", false
	}
	kind := "PTX"
	if sass {
		kind = "SASS"
	}
	say := func(ok bool, id string, family ...string) (bool, string, bool) {
		for _, r := range d.Rules {
			if r.ID == id {
				verdict := "does not run"
				if ok {
					verdict = "runs"
				}
				text := r.Text
				if len(family) > 0 {
					text += " (" + strings.Join(family, ", ") + ")"
				}
				return ok, fmt.Sprintf("%s for %s %s on %d.%d: %s [%s]", kind, target, verdict, maj, mnr, text, r.Source), true
			}
		}
		return false, "", false // table without its rules
	}
	switch t.suffix {
	case "a":
		if _, found := k.PTXTargetInfo(target); !found {
			return false, "", false
		}
		return say(t.major == maj && t.minor == mnr, ruleArch)
	case "f":
		row, found := k.PTXTargetInfo(target)
		if !found || len(row.Family) == 0 {
			return false, "", false
		}
		in := false
		for _, m := range row.Family {
			if a, b, ok := parseCC(m); ok && a == maj && b == mnr {
				in = true
			}
		}
		return say(in, ruleFamily, row.Family...)
	}
	if !sass {
		return say(maj > t.major || maj == t.major && mnr >= t.minor, rulePTX)
	}
	if maj != t.major || mnr < t.minor {
		return say(false, ruleSASS)
	}
	if mnr != t.minor && (d.tegra(t.major, t.minor) || d.tegra(maj, mnr)) {
		return say(false, ruleSASSTegra)
	}
	return say(true, ruleSASS)
}

func (d *ptxDoc) tegra(major, minor int) bool {
	for _, cc := range d.Tegra.CC {
		if a, b, ok := parseCC(cc); ok && a == major && b == minor {
			return true
		}
	}
	return false
}

// ptxTarget is a compilation target read from "sm_90a", "compute_100f" or
// "86": the compute capability and the a/f suffix ("" for a plain target).
type ptxTarget struct {
	major, minor int
	suffix       string
}

// parseTarget reads "sm_XY[a|f]" or "compute_XY[a|f]" (also without the
// prefix); the last digit is the minor version.
func parseTarget(s string) (ptxTarget, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	for _, p := range []string{"sm_", "compute_"} {
		if strings.HasPrefix(s, p) {
			s = s[len(p):]
			break
		}
	}
	var t ptxTarget
	if n := len(s); n > 0 && (s[n-1] == 'a' || s[n-1] == 'f') {
		t.suffix, s = s[n-1:], s[:n-1]
	}
	if len(s) < 2 || len(s) > 3 {
		return ptxTarget{}, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return ptxTarget{}, false
		}
	}
	t.major, _ = strconv.Atoi(s[:len(s)-1])
	t.minor = int(s[len(s)-1] - '0')
	if t.major == 0 {
		return ptxTarget{}, false
	}
	return t, true
}

// parseCC reads a compute capability or version "X.Y" (both numbers).
func parseCC(s string) (major, minor int, ok bool) {
	a, b, found := strings.Cut(strings.TrimSpace(s), ".")
	if !found || a == "" || b == "" || strings.Contains(b, ".") {
		return 0, 0, false
	}
	x, err1 := strconv.Atoi(a)
	y, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || x < 0 || y < 0 {
		return 0, 0, false
	}
	return x, y, true
}
