package server

import (
	"reflect"
	"testing"
	"time"

	"kiln.dev/kiln/api"
)

func f64(v float64) *float64 { return &v }

// TestHistory: a reading is kept as the last at once, and enters the
// hour's ring once per step; the ring holds an hour, oldest first; a
// forgotten node's readings go.
func TestHistory(t *testing.T) {
	h := newHistory()
	t0 := time.Unix(1_700_000_000, 0)
	ch := h.changed()
	h.record("n", []api.GPUSample{{GPU: 0, Utilization: f64(10)}, {GPU: 1, PowerW: f64(300)}}, t0)
	select {
	case <-ch:
	default:
		t.Error("new readings did not signal a change")
	}
	h.record("n", []api.GPUSample{{GPU: 0, Utilization: f64(20)}}, t0.Add(5*time.Second))
	if p := h.latest("n")[0]; !p.hasUtil || p.util != 20 {
		t.Errorf("last reading %+v, want 20%%", p)
	}
	if n := len(h.series("n", 0)); n != 1 {
		t.Errorf("%d points after two readings 5 s apart, want 1 (one per %s)", n, historyStep)
	}
	for i := 1; i <= historyPoints+10; i++ {
		h.record("n", []api.GPUSample{{GPU: 0, Utilization: f64(float64(i % 100))}}, t0.Add(time.Duration(i)*historyStep))
	}
	s := h.series("n", 0)
	if len(s) != historyPoints {
		t.Fatalf("%d points, want an hour's %d", len(s), historyPoints)
	}
	for i := 1; i < len(s); i++ {
		if s[i].at <= s[i-1].at {
			t.Fatalf("points out of order at %d: %d after %d", i, s[i].at, s[i-1].at)
		}
	}
	if last := s[len(s)-1]; last.at != t0.Add(time.Duration(historyPoints+10)*historyStep).Unix() {
		t.Errorf("the newest point is at %d", last.at)
	}
	if p := h.latest("n")[1]; !p.hasPower || p.hasUtil {
		t.Errorf("GPU 1: %+v, want power and no utilization", p)
	}
	h.forget("n")
	if len(h.latest("n")) != 0 || h.series("n", 0) != nil {
		t.Error("a forgotten node kept its readings")
	}
}

// TestCheckSamples refuses what no GPU reads.
func TestCheckSamples(t *testing.T) {
	nan := 0.0
	nan = nan / nan
	for _, tc := range []struct {
		name string
		ss   []api.GPUSample
		ok   bool
	}{
		{"good", []api.GPUSample{{GPU: 0, Utilization: f64(50), PowerW: f64(700), TemperatureC: f64(40)}, {GPU: 7}}, true},
		{"index twice", []api.GPUSample{{GPU: 1}, {GPU: 1}}, false},
		{"negative index", []api.GPUSample{{GPU: -1}}, false},
		{"index too high", []api.GPUSample{{GPU: 256}}, false},
		{"utilization above 100", []api.GPUSample{{GPU: 0, Utilization: f64(101)}}, false},
		{"NaN", []api.GPUSample{{GPU: 0, PowerW: &nan}}, false},
		{"below absolute zero", []api.GPUSample{{GPU: 0, TemperatureC: f64(-300)}}, false},
		{"too many", make([]api.GPUSample, 300), false},
	} {
		if err := checkSamples(tc.ss); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// A GPU's hour of points holds no pointer, so the collector never scans
// it: with a thousand 8-GPU nodes that would be 77 MB a cycle.
func TestHistoryHoldsNoPointers(t *testing.T) {
	var walk func(reflect.Type) string
	walk = func(ty reflect.Type) string {
		switch ty.Kind() {
		case reflect.Pointer, reflect.Map, reflect.Slice, reflect.String, reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
			return ty.String()
		case reflect.Array:
			return walk(ty.Elem())
		case reflect.Struct:
			for i := range ty.NumField() {
				if p := walk(ty.Field(i).Type); p != "" {
					return ty.Field(i).Name + ": " + p
				}
			}
		}
		return ""
	}
	if p := walk(reflect.TypeFor[gpuHistory]()); p != "" {
		t.Errorf("gpuHistory holds a pointer (%s)", p)
	}
}
