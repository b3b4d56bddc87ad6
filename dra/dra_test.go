package dra

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/snapshot"
)

func TestSemver(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{"535.183.01", "535.183.1", true},
		{"550.144.03", "550.144.3", true},
		{"12.4", "12.4.0", true},
		{"12", "12.0.0", true},
		{"6.16.13", "6.16.13", true},
		{"6.0.2-115", "6.0.2", true},
		{"v9.0", "9.0.0", true},
		{" 7.2.1 ", "7.2.1", true},
		{"1.2.3.4", "1.2.3", true},
		{"12.", "12.0.0", true},
		{"N/A", "", false},
		{"", "", false},
		{"99999999999.1", "", false},
	} {
		got, ok := Semver(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("Semver(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
		if ok && !IsSemver(got) {
			t.Errorf("Semver(%q) = %q is not a strict semantic version", c.in, got)
		}
	}
	for _, bad := range []string{"12.4", "550.144.03", "01.2.3", "1.2", "1.2.3-", "1.2.3+"} {
		if IsSemver(bad) {
			t.Errorf("IsSemver(%q) = true; the API refuses it", bad)
		}
	}
}

func FuzzSemver(f *testing.F) {
	for _, s := range []string{"535.183.01", "12.4", "6.0.2-115", "v1", "", "1..2", "18446744073709551616"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		v, ok := Semver(in)
		if ok && (!IsSemver(v) || len(v) > resourceapi.DeviceAttributeMaxValueLength) {
			t.Fatalf("Semver(%q) = %q: not a valid version attribute", in, v)
		}
		if !ok && v != "" {
			t.Fatalf("Semver(%q) failed but returned %q", in, v)
		}
	})
}

func FuzzNames(f *testing.F) {
	for _, s := range []string{"hgx-h100-03", "GPU Node_7.example.com", "..", "-a-", strings.Repeat("x", 300), "ünïcode", "1g.10gb+me"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if l := DNSLabel(in); l != "" && len(validation.IsDNS1123Label(l)) > 0 {
			t.Fatalf("DNSLabel(%q) = %q: %v", in, l, validation.IsDNS1123Label(l))
		}
		if s := DNSSubdomain(in); s != "" && len(validation.IsDNS1123Subdomain(s)) > 0 {
			t.Fatalf("DNSSubdomain(%q) = %q: %v", in, s, validation.IsDNS1123Subdomain(s))
		}
		if v := labelValue(in); len(validation.IsValidLabelValue(v)) > 0 {
			t.Fatalf("labelValue(%q) = %q: %v", in, v, validation.IsValidLabelValue(v))
		}
	})
}

func str(s string) *string { return &s }

// TestValidateDeviceRefuses checks that each rule of the API is enforced:
// every case must fail for the reason named.
func TestValidateDeviceRefuses(t *testing.T) {
	good := func() resourceapi.Device {
		return resourceapi.Device{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": {StringValue: str("gpu")},
		}}
	}
	if err := ValidateDevice(good()); err != nil {
		t.Fatalf("the good device is refused: %v", err)
	}
	cases := map[string]func(d *resourceapi.Device){
		"name not a DNS label": func(d *resourceapi.Device) { d.Name = "GPU_0" },
		"33 attributes": func(d *resourceapi.Device) {
			for i := 0; i < 32; i++ {
				d.Attributes[resourceapi.QualifiedName("a"+strings.Repeat("x", i%5)+string(rune('a'+i%26))+string(rune('a'+i/26)))] = resourceapi.DeviceAttribute{StringValue: str("v")}
			}
		},
		"string of 65": func(d *resourceapi.Device) {
			d.Attributes["type"] = resourceapi.DeviceAttribute{StringValue: str(strings.Repeat("x", 65))}
		},
		"version 12.4": func(d *resourceapi.Device) {
			d.Attributes["v"] = resourceapi.DeviceAttribute{VersionValue: str("12.4")}
		},
		"version leading zero": func(d *resourceapi.Device) {
			d.Attributes["v"] = resourceapi.DeviceAttribute{VersionValue: str("550.144.03")}
		},
		"two values": func(d *resourceapi.Device) {
			d.Attributes["type"] = resourceapi.DeviceAttribute{StringValue: str("gpu"), VersionValue: str("1.0.0")}
		},
		"no value": func(d *resourceapi.Device) { d.Attributes["type"] = resourceapi.DeviceAttribute{} },
		"identifier of 33": func(d *resourceapi.Device) {
			d.Attributes[resourceapi.QualifiedName(strings.Repeat("a", 33))] = resourceapi.DeviceAttribute{StringValue: str("v")}
		},
		"identifier with -": func(d *resourceapi.Device) {
			d.Attributes["nvlink-island"] = resourceapi.DeviceAttribute{StringValue: str("v")}
		},
		"bad domain": func(d *resourceapi.Device) {
			d.Attributes["Kiln_Dev/x"] = resourceapi.DeviceAttribute{StringValue: str("v")}
		},
		"same name twice": func(d *resourceapi.Device) {
			d.Attributes[DriverName+"/type"] = resourceapi.DeviceAttribute{StringValue: str("gpu")}
		},
		"capacity is attr": func(d *resourceapi.Device) {
			d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"type": {}}
		},
		"negative capacity": func(d *resourceapi.Device) {
			d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("-1")}}
		},
		"taint key invalid": func(d *resourceapi.Device) {
			d.Taints = []resourceapi.DeviceTaint{{Key: "gpu.kiln.dev/bad key", Effect: "NoSchedule"}}
		},
		"taint value long": func(d *resourceapi.Device) {
			d.Taints = []resourceapi.DeviceTaint{{Key: "k", Value: strings.Repeat("v", 64), Effect: "NoSchedule"}}
		},
		"taint effect": func(d *resourceapi.Device) {
			d.Taints = []resourceapi.DeviceTaint{{Key: "k", Effect: "PreferNoSchedule"}}
		},
		"17 taints":      func(d *resourceapi.Device) { d.Taints = make([]resourceapi.DeviceTaint, 17); fillTaints(d.Taints) },
		"3 counter sets": func(d *resourceapi.Device) { d.ConsumesCounters = make([]resourceapi.DeviceCounterConsumption, 3) },
		"no counters in set": func(d *resourceapi.Device) {
			d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "s"}}
		},
	}
	for name, mutate := range cases {
		d := good()
		mutate(&d)
		if err := ValidateDevice(d); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func fillTaints(ts []resourceapi.DeviceTaint) {
	for i := range ts {
		ts[i] = resourceapi.DeviceTaint{Key: "k" + string(rune('a'+i)), Effect: resourceapi.DeviceTaintEffectNone}
	}
}

func TestValidateSlicesRefuses(t *testing.T) {
	one := resource.MustParse("1")
	dev := func(name string) resourceapi.Device { return resourceapi.Device{Name: name} }
	for name, ss := range map[string][]Slice{
		"devices and counters": {{Devices: []resourceapi.Device{dev("a")}, SharedCounters: []resourceapi.CounterSet{{Name: "s", Counters: map[string]resourceapi.Counter{"c": {Value: one}}}}}},
		"device twice":         {{Devices: []resourceapi.Device{dev("a")}}, {Devices: []resourceapi.Device{dev("a")}}},
		"unknown counter set": {{Devices: []resourceapi.Device{{Name: "a", ConsumesCounters: []resourceapi.DeviceCounterConsumption{
			{CounterSet: "s", Counters: map[string]resourceapi.Counter{"c": {Value: one}}}}}}}},
		"unknown counter": {
			{SharedCounters: []resourceapi.CounterSet{{Name: "s", Counters: map[string]resourceapi.Counter{"c": {Value: one}}}}},
			{Devices: []resourceapi.Device{{Name: "a", ConsumesCounters: []resourceapi.DeviceCounterConsumption{
				{CounterSet: "s", Counters: map[string]resourceapi.Counter{"d": {Value: one}}}}}}}},
		"counter not a label": {{SharedCounters: []resourceapi.CounterSet{{Name: "s", Counters: map[string]resourceapi.Counter{"memory_slice": {Value: one}}}}}},
		"65 tainted devices":  {{Devices: tainted(65)}},
		"129 devices":         {{Devices: plain(129)}},
	} {
		if err := ValidateSlices(ss); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := ValidateSlices([]Slice{{Devices: tainted(64)}, {Devices: plain(128)[64:]}}); err != nil {
		t.Errorf("64 tainted devices and 64 plain ones in another slice: %v", err)
	}
}

func plain(n int) []resourceapi.Device {
	out := make([]resourceapi.Device, n)
	for i := range out {
		out[i].Name = DNSLabel("d-" + strings.Repeat("x", i/26) + string(rune('a'+i%26)))
	}
	return out
}

func tainted(n int) []resourceapi.Device {
	out := plain(n)
	for i := range out {
		out[i].Taints = []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNone}}
	}
	return out
}

// twoGPUs is a small node: two H100s on their own root ports.
func twoGPUs() *snapshot.Snapshot {
	zero := 0
	return &snapshot.Snapshot{
		SchemaVersion: snapshot.SchemaVersion,
		Host:          snapshot.Host{Hostname: "Node-A"},
		Drivers:       snapshot.Drivers{NVIDIAUser: "550.144.03", CUDADriver: "12.4"},
		GPUs: []snapshot.GPU{
			{Index: 0, Vendor: "nvidia", Model: "H100-SXM5-80GB", PCIAddress: "0000:19:00.0", UUID: "GPU-a", NUMANode: &zero},
			{Index: 1, Vendor: "nvidia", Model: "H100-SXM5-80GB", PCIAddress: "0000:3b:00.0", UUID: "GPU-b", NUMANode: &zero},
		},
	}
}

func TestHealthTaints(t *testing.T) {
	rep := &doctor.Report{Findings: []doctor.Finding{
		{ID: "xid-error", Severity: doctor.Critical, Code: 79, Devices: []string{"0000:19:00.0"}},
		{ID: "xid-error", Severity: doctor.Warning, Code: 13, Devices: []string{"0000:19:00.0"}},
		{ID: "pcie-replays", Severity: doctor.Warning, Devices: []string{"0000:3b:00.0"}},
		{ID: "persistence-off", Severity: doctor.Info, Devices: []string{"0000:3b:00.0"}},
	}}
	r, err := Build(context.Background(), Input{Snapshot: twoGPUs(), Report: rep})
	if err != nil {
		t.Fatal(err)
	}
	if r.NodeName != "node-a" {
		t.Errorf("node name %q, want node-a (the host name as a DNS name)", r.NodeName)
	}
	ds := r.Devices()
	if len(ds) != 2 {
		t.Fatalf("%d devices, want 2", len(ds))
	}
	want0 := []resourceapi.DeviceTaint{{Key: "gpu.kiln.dev/xid-error", Value: "xid-error-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	if !equalTaints(ds[0].Taints, want0) {
		t.Errorf("gpu-0 taints %v, want %v", ds[0].Taints, want0)
	}
	want1 := []resourceapi.DeviceTaint{{Key: "gpu.kiln.dev/pcie-replays", Value: "warning", Effect: resourceapi.DeviceTaintEffectNone}}
	if !equalTaints(ds[1].Taints, want1) {
		t.Errorf("gpu-1 taints %v, want %v", ds[1].Taints, want1)
	}
	if h := *ds[0].Attributes[AttrHealth].StringValue; h != HealthCritical {
		t.Errorf("gpu-0 health %q", h)
	}
	if h := *ds[1].Attributes[AttrHealth].StringValue; h != HealthWarning {
		t.Errorf("gpu-1 health %q", h)
	}
	if v := *ds[0].Attributes[AttrDriverVersion].VersionValue; v != "550.144.3" {
		t.Errorf("driverVersion %q", v)
	}
	if v := *ds[0].Attributes[AttrCUDADriverVersion].VersionValue; v != "12.4.0" {
		t.Errorf("cudaDriverVersion %q", v)
	}

	// A critical finding that names no GPU makes every GPU unusable.
	rep = &doctor.Report{Findings: []doctor.Finding{{ID: "fabric-manager-down", Severity: doctor.Critical}}}
	r, err = Build(context.Background(), Input{Snapshot: twoGPUs(), Report: rep})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range r.Devices() {
		if len(d.Taints) != 1 || d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("%s: taints %v, want the node-wide finding as NoSchedule", d.Name, d.Taints)
		}
	}

	// The re-check passed: no finding, no taint, healthy.
	r, err = Build(context.Background(), Input{Snapshot: twoGPUs(), Report: &doctor.Report{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range r.Devices() {
		if len(d.Taints) != 0 || *d.Attributes[AttrHealth].StringValue != HealthHealthy {
			t.Errorf("%s: taints %v after a clean report", d.Name, d.Taints)
		}
	}
}

func equalTaints(a, b []resourceapi.DeviceTaint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || a[i].Value != b[i].Value || a[i].Effect != b[i].Effect {
			return false
		}
	}
	return true
}

func TestBuildNeedsNodeName(t *testing.T) {
	s := twoGPUs()
	s.Host.Hostname = ""
	if _, err := Build(context.Background(), Input{Snapshot: s, Report: &doctor.Report{}}); err == nil || !strings.Contains(err.Error(), "node") {
		t.Errorf("no host name and no node name: %v", err)
	}
	if _, err := Build(context.Background(), Input{Snapshot: s, Report: &doctor.Report{}, NodeName: "Bad_Name"}); err == nil {
		t.Error("a node name that is not a DNS name was accepted")
	}
}

// TestFitDropsAttributes checks the guard against the 32-item limit.
func TestFitDropsAttributes(t *testing.T) {
	d := resourceapi.Device{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
	a := attrs(d.Attributes)
	for i := 0; i < 30; i++ {
		a.int("x"+string(rune('a'+i%26))+string(rune('a'+i/26)), 1)
	}
	a.str(AttrVBIOS, "96.00")
	a.int(AttrPCIeLinkGen, 5)
	d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: {Value: resource.MustParse("1Gi")}}
	b := &builder{res: &Result{}}
	b.fit(&d)
	if err := ValidateDevice(d); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Attributes[AttrVBIOS]; ok {
		t.Error("vbiosVersion kept; it is the first to go")
	}
	if len(b.res.Notes) != 1 {
		t.Errorf("notes %v, want one saying what was left out", b.res.Notes)
	}
}

// FuzzParseShared: any --shared text gives an error or indices, never a
// panic; "all" is every GPU and indices come back as given.
func FuzzParseShared(f *testing.F) {
	for _, s := range []string{"", "all", "none", "0,2", " 1 , 3 ", "-1", "x", "0,,1", "99999999999999999999"} {
		f.Add(s)
	}
	snap := &snapshot.Snapshot{GPUs: []snapshot.GPU{{Index: 0}, {Index: 1}, {Index: 3}}}
	f.Fuzz(func(t *testing.T, spec string) {
		got, err := ParseShared(spec, snap)
		if err != nil {
			return
		}
		for _, i := range got {
			if i < 0 {
				t.Fatalf("%q gave the negative index %d", spec, i)
			}
		}
		if strings.TrimSpace(spec) == "all" && len(got) != len(snap.GPUs) {
			t.Fatalf("all gave %v", got)
		}
	})
}
