package require

import (
	"strings"
	"testing"
)

// cuda120 is NVIDIA_REQUIRE_CUDA of the nvidia/cuda 12.0.0 base image
// (Ubuntu 22.04), as reproduced in shared reference cuda-driver-compat.md.
const cuda120 = "cuda>=12.0 brand=tesla,driver>=450,driver<451 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 brand=nvidiartx,driver>=470,driver<471 brand=geforce,driver>=470,driver<471 brand=geforcertx,driver>=470,driver<471 brand=quadro,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471 brand=titan,driver>=470,driver<471 brand=titanrtx,driver>=470,driver<471 brand=tesla,driver>=510,driver<511 brand=unknown,driver>=510,driver<511 brand=nvidia,driver>=510,driver<511 brand=nvidiartx,driver>=510,driver<511 brand=geforce,driver>=510,driver<511 brand=geforcertx,driver>=510,driver<511 brand=quadro,driver>=510,driver<511 brand=quadrortx,driver>=510,driver<511 brand=titan,driver>=510,driver<511 brand=titanrtx,driver>=510,driver<511 brand=tesla,driver>=515,driver<516 brand=unknown,driver>=515,driver<516 brand=nvidia,driver>=515,driver<516 brand=nvidiartx,driver>=515,driver<516 brand=geforce,driver>=515,driver<516 brand=geforcertx,driver>=515,driver<516 brand=quadro,driver>=515,driver<516 brand=quadrortx,driver>=515,driver<516 brand=titan,driver>=515,driver<516 brand=titanrtx,driver>=515,driver<516"

func TestParseOfficialImage(t *testing.T) {
	e, err := Parse(cuda120)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Clauses) != 32 {
		t.Errorf("clauses = %d, want 32", len(e.Clauses))
	}
	if got := e.MinCUDA(); got != "12.0" {
		t.Errorf("MinCUDA = %q, want 12.0", got)
	}
	if got := e.Clauses[2].String(); got != "brand=tesla,driver>=470,driver<471" {
		t.Errorf("clause 2 = %q", got)
	}
	br := e.ForwardCompatBranches()
	if got := strings.Join(br["tesla"], ","); got != "450,470,510,515" {
		t.Errorf("tesla branches = %q, want 450,470,510,515", got)
	}
	if e.String() != cuda120 {
		t.Errorf("String() does not give the input back")
	}
}

func TestEval(t *testing.T) {
	e, err := Parse(cuda120)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		f      Facts
		ok     bool
		clause int
	}{
		{"driver supports 12.2", Facts{CUDA: "12.2", Driver: "535.183.01", Brands: []string{"tesla"}}, true, 0},
		{"tesla on 470 via compat", Facts{CUDA: "11.4", Driver: "470.82.01", Brands: []string{"tesla"}}, true, 2},
		{"geforce on 470 admitted too in 12.0", Facts{CUDA: "11.4", Driver: "470.82.01", Brands: []string{"geforce"}}, true, 6},
		{"tesla on 460 refused", Facts{CUDA: "11.2", Driver: "460.32.03", Brands: []string{"tesla"}}, false, -1},
		{"unknown brand on 460 refused", Facts{CUDA: "11.2", Driver: "460.32.03"}, false, -1},
		{"driver unknown", Facts{}, false, -1},
	} {
		ok, clause := e.Eval(tc.f)
		if ok != tc.ok || clause != tc.clause {
			t.Errorf("%s: Eval = %v, %d; want %v, %d", tc.name, ok, clause, tc.ok, tc.clause)
		}
	}
	// Empty requirement holds.
	if ok, _ := (Expr{}).Eval(Facts{}); !ok {
		t.Error("empty expression must hold")
	}
}

func TestOperators(t *testing.T) {
	for _, tc := range []struct {
		expr string
		f    Facts
		want bool
	}{
		{"cuda>=12.4", Facts{CUDA: "12.4"}, true},
		{"cuda>12.4", Facts{CUDA: "12.4"}, false},
		{"cuda<=12.4", Facts{CUDA: "12.3"}, true},
		{"cuda<12.4", Facts{CUDA: "12.4"}, false},
		{"cuda==12.4", Facts{CUDA: "12.4.0"}, true},
		{"cuda=12.4", Facts{CUDA: "12.5"}, false},
		{"cuda!=12.4", Facts{CUDA: "12.5"}, true},
		{"arch>=8.0", Facts{Arch: "9.0"}, true},
		{"arch>=8.0", Facts{Arch: "7.5"}, false},
		{"brand!=geforce", Facts{Brands: []string{"tesla"}}, true},
		{"BRAND=Tesla", Facts{Brands: []string{"tesla"}}, true},
		{"driver>=470,driver<471", Facts{Driver: "471.0"}, false},
		// A fact that is no version is unknown and meets no condition (it
		// used to count as 0, so "N/A" was below 470 and not 470).
		{"driver<470", Facts{Driver: "N/A"}, false},
		{"driver!=470", Facts{Driver: "N/A"}, false},
		{"cuda<12.4", Facts{CUDA: "unknown"}, false},
		{"cuda>=12.4", Facts{CUDA: "unknown"}, false},
		{"driver<470", Facts{Driver: " "}, false},
	} {
		e, err := Parse(tc.expr)
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		if got, _ := e.Eval(tc.f); got != tc.want {
			t.Errorf("%s with %+v = %v, want %v", tc.expr, tc.f, got, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		"cuda", "cuda>=", ">=12", "cuda>=12..4", "cuda>=x", "gpu>=1", "cuda>=12,", "brand>tesla", "cuda=>12", "cuda>=1<2",
	} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted bad input", in)
		} else if !strings.Contains(err.Error(), "NVIDIA_REQUIRE_CUDA") {
			t.Errorf("Parse(%q) error %q does not name the variable", in, err)
		}
	}
	if e, err := Parse("  "); err != nil || len(e.Clauses) != 0 {
		t.Errorf("blank value: %v %v", e, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(cuda120)
	f.Add("cuda>=12.4 brand=tesla,driver>=535,driver<536")
	f.Add("cuda>=13.0")
	f.Add("arch>=7.5,cuda!=12.1")
	f.Add("brand=unknown,driver>=470,driver<471 ,,")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := Parse(s)
		if err != nil {
			return
		}
		// Every clause has conditions with a known key and operator.
		for _, c := range e.Clauses {
			if len(c.Conditions) == 0 {
				t.Fatalf("empty clause from %q", s)
			}
			for _, d := range c.Conditions {
				switch d.Key {
				case KeyCUDA, KeyDriver, KeyArch, KeyBrand:
				default:
					t.Fatalf("key %q from %q", d.Key, s)
				}
				if d.Value == "" {
					t.Fatalf("empty value from %q", s)
				}
			}
		}
		// Written back, it parses to the same expression.
		again, err := Parse(e.String())
		if err != nil {
			t.Fatalf("String() %q of %q does not parse: %v", e.String(), s, err)
		}
		if again.String() != e.String() {
			t.Fatalf("round trip changed %q to %q", e.String(), again.String())
		}
		e.Eval(Facts{CUDA: "12.2", Driver: "535.54.03", Arch: "9.0", Brands: []string{"tesla"}})
		e.ForwardCompatBranches()
	})
}
