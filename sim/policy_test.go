package sim

import (
	"slices"
	"strings"
	"testing"
)

func TestParseSeeds(t *testing.T) {
	good := map[string][]int64{
		"42-45":       {42, 43, 44, 45},
		"42,43, 50":   {42, 43, 50},
		"40-41,7":     {40, 41, 7},
		" 9 ":         {9},
		"-3":          {-3},
		"5-5":         {5},
		"1,,2":        {1, 2},
		"0-999":       nil, // 1000 seeds: checked by length below
		"1000-1999,3": nil,
	}
	for in, want := range good {
		got, err := ParseSeeds(in)
		if err != nil {
			t.Errorf("ParseSeeds(%q): %v", in, err)
			continue
		}
		if want != nil && !slices.Equal(got, want) {
			t.Errorf("ParseSeeds(%q) = %v, want %v", in, got, want)
		}
	}
	for in, msg := range map[string]string{
		"":                     "no seed",
		"51-42":                "seed range",
		"a":                    "as a seed",
		"1-b":                  "seed range",
		"0-1000":               "more than 1000",
		"4.5":                  "as a seed",
		",":                    "no seed",
		"1-2-3":                "seed range",
		"99999999999999999999": "as a seed",
	} {
		if _, err := ParseSeeds(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseSeeds(%q): %v, want an error saying %q", in, err, msg)
		}
	}
}

func TestParsePolicies(t *testing.T) {
	got, err := ParsePolicies(" FGD, kiln,fgd ")
	if err != nil || !slices.Equal(got, []string{"fgd", "kiln"}) {
		t.Errorf("ParsePolicies: %v, %v; want [fgd kiln]", got, err)
	}
	if all, err := ParsePolicies("all"); err != nil || len(all) != len(Policies) {
		t.Errorf("ParsePolicies(all): %v, %v", all, err)
	}
	for _, bad := range []string{"", "fgd,best", " , "} {
		if _, err := ParsePolicies(bad); err == nil {
			t.Errorf("ParsePolicies(%q) accepted", bad)
		}
	}
}
