package dra

import (
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The limits below are those resource.k8s.io/v1 validation enforces (the
// constants come from k8s.io/api); the control-plane test has a real
// apiserver accept what passes here.

// ValidateSlices checks the slices of one pool against the API's rules:
// device, counter set and counter names, attribute and capacity names and
// values, counts per device and per slice, taints, and that every counter a
// device consumes exists in the pool.
func ValidateSlices(ss []Slice) error {
	var errs []error
	names := map[string]bool{}
	sets := map[string]map[string]bool{}
	for i, s := range ss {
		if len(s.Devices) > 0 && len(s.SharedCounters) > 0 {
			errs = append(errs, fmt.Errorf("slice %d: holds both devices and shared counters", i))
		}
		if len(s.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
			errs = append(errs, fmt.Errorf("slice %d: %d counter sets, at most %d", i, len(s.SharedCounters), resourceapi.ResourceSliceMaxCounterSets))
		}
		for _, cs := range s.SharedCounters {
			if err := dnsLabel("counter set", cs.Name); err != nil {
				errs = append(errs, err)
			}
			if sets[cs.Name] != nil {
				errs = append(errs, fmt.Errorf("counter set %q: defined twice in the pool", cs.Name))
			}
			if len(cs.Counters) == 0 || len(cs.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
				errs = append(errs, fmt.Errorf("counter set %q: %d counters, want 1 to %d", cs.Name, len(cs.Counters), resourceapi.ResourceSliceMaxCountersPerCounterSet))
			}
			sets[cs.Name] = map[string]bool{}
			for c, v := range cs.Counters {
				if err := dnsLabel("counter", c); err != nil {
					errs = append(errs, fmt.Errorf("counter set %q: %w", cs.Name, err))
				}
				if v.Value.Sign() < 0 {
					errs = append(errs, fmt.Errorf("counter set %q: counter %q is negative", cs.Name, c))
				}
				sets[cs.Name][c] = true
			}
		}
		limit := resourceapi.ResourceSliceMaxDevices
		for _, d := range s.Devices {
			if len(d.Taints) > 0 || len(d.ConsumesCounters) > 0 {
				limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
			}
		}
		if len(s.Devices) > limit {
			errs = append(errs, fmt.Errorf("slice %d: %d devices, at most %d", i, len(s.Devices), limit))
		}
		for _, d := range s.Devices {
			if names[d.Name] {
				errs = append(errs, fmt.Errorf("device %q: named twice in the pool", d.Name))
			}
			names[d.Name] = true
			if err := ValidateDevice(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, s := range ss {
		for _, d := range s.Devices {
			for _, c := range d.ConsumesCounters {
				set, ok := sets[c.CounterSet]
				if !ok {
					errs = append(errs, fmt.Errorf("device %q: consumes from counter set %q, which the pool does not define", d.Name, c.CounterSet))
					continue
				}
				for name := range c.Counters {
					if !set[name] {
						errs = append(errs, fmt.Errorf("device %q: consumes counter %q, which set %q does not define", d.Name, name, c.CounterSet))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// ValidateDevice checks one device against the API's rules.
func ValidateDevice(d resourceapi.Device) error {
	var errs []error
	if err := dnsLabel("device", d.Name); err != nil {
		errs = append(errs, err)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		errs = append(errs, fmt.Errorf("device %q: %d attributes and capacities, at most %d", d.Name, n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice))
	}
	seen := map[string]bool{}
	for name, a := range d.Attributes {
		if err := qualifiedName(string(name)); err != nil {
			errs = append(errs, fmt.Errorf("device %q: attribute %w", d.Name, err))
		}
		full := fullName(string(name))
		if seen[full] {
			errs = append(errs, fmt.Errorf("device %q: attribute %q given twice (with and without the driver's domain)", d.Name, name))
		}
		seen[full] = true
		if err := attributeValue(a); err != nil {
			errs = append(errs, fmt.Errorf("device %q: attribute %q: %w", d.Name, name, err))
		}
	}
	for name, c := range d.Capacity {
		if err := qualifiedName(string(name)); err != nil {
			errs = append(errs, fmt.Errorf("device %q: capacity %w", d.Name, err))
		}
		if seen[fullName(string(name))] {
			errs = append(errs, fmt.Errorf("device %q: capacity %q has the name of an attribute", d.Name, name))
		}
		if c.Value.Sign() < 0 {
			errs = append(errs, fmt.Errorf("device %q: capacity %q is negative", d.Name, name))
		}
		if c.RequestPolicy != nil {
			if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
				errs = append(errs, fmt.Errorf("device %q: capacity %q has a request policy, but the device does not allow multiple allocations", d.Name, name))
			}
			if err := requestPolicy(c); err != nil {
				errs = append(errs, fmt.Errorf("device %q: capacity %q: %w", d.Name, name, err))
			}
		}
	}
	if len(d.Taints) > resourceapi.DeviceTaintsMaxLength {
		errs = append(errs, fmt.Errorf("device %q: %d taints, at most %d", d.Name, len(d.Taints), resourceapi.DeviceTaintsMaxLength))
	}
	for _, t := range d.Taints {
		for _, msg := range validation.IsQualifiedName(t.Key) {
			errs = append(errs, fmt.Errorf("device %q: taint key %q: %s", d.Name, t.Key, msg))
		}
		for _, msg := range validation.IsValidLabelValue(t.Value) {
			errs = append(errs, fmt.Errorf("device %q: taint value %q: %s", d.Name, t.Value, msg))
		}
		switch t.Effect {
		case resourceapi.DeviceTaintEffectNone, resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute:
		default:
			errs = append(errs, fmt.Errorf("device %q: taint %q: effect %q is not None, NoSchedule or NoExecute", d.Name, t.Key, t.Effect))
		}
	}
	if len(d.ConsumesCounters) > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
		errs = append(errs, fmt.Errorf("device %q: consumes from %d counter sets, at most %d", d.Name, len(d.ConsumesCounters), resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice))
	}
	for _, c := range d.ConsumesCounters {
		if len(c.Counters) == 0 || len(c.Counters) > resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption {
			errs = append(errs, fmt.Errorf("device %q: consumes %d counters of %q, want 1 to %d", d.Name, len(c.Counters), c.CounterSet, resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption))
		}
	}
	return errors.Join(errs...)
}

func dnsLabel(what, name string) error {
	if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
		return fmt.Errorf("%s name %q: %s", what, name, strings.Join(msgs, "; "))
	}
	return nil
}

// fullName is an attribute name with the driver's domain, the form the
// API compares names in.
func fullName(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return DriverName + "/" + name
}

// qualifiedName checks an attribute or capacity name: an optional domain
// (a DNS subdomain of at most 63 characters) and a C identifier of at most
// 32 characters.
func qualifiedName(name string) error {
	domain, id, ok := strings.Cut(name, "/")
	if !ok {
		domain, id = "", name
	}
	if ok {
		if domain == "" {
			return fmt.Errorf("%q: the domain before '/' is empty", name)
		}
		if len(domain) > resourceapi.DeviceMaxDomainLength {
			return fmt.Errorf("%q: domain longer than %d characters", name, resourceapi.DeviceMaxDomainLength)
		}
		if msgs := validation.IsDNS1123Subdomain(domain); len(msgs) > 0 {
			return fmt.Errorf("%q: domain: %s", name, strings.Join(msgs, "; "))
		}
	}
	if len(id) > resourceapi.DeviceMaxIDLength {
		return fmt.Errorf("%q: name longer than %d characters", name, resourceapi.DeviceMaxIDLength)
	}
	if msgs := validation.IsCIdentifier(id); len(msgs) > 0 {
		return fmt.Errorf("%q: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}

// attributeValue checks that exactly one value is set and that strings and
// versions are within 64 characters, versions strict semantic versions.
func attributeValue(a resourceapi.DeviceAttribute) error {
	n := 0
	for _, set := range []bool{a.IntValue != nil, a.BoolValue != nil, a.StringValue != nil, a.VersionValue != nil,
		a.IntValues != nil, a.BoolValues != nil, a.StringValues != nil, a.VersionValues != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("%d values set, want exactly one", n)
	}
	if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
		return fmt.Errorf("string longer than %d characters", resourceapi.DeviceAttributeMaxValueLength)
	}
	if a.VersionValue != nil {
		v := *a.VersionValue
		if len(v) > resourceapi.DeviceAttributeMaxValueLength {
			return fmt.Errorf("version longer than %d characters", resourceapi.DeviceAttributeMaxValueLength)
		}
		if !IsSemver(v) {
			return fmt.Errorf("version %q is not a semantic version (x.y.z)", v)
		}
	}
	return nil
}

// maxValidValues is the API's limit of a request policy's valid values.
const maxValidValues = 10

// requestPolicy checks a shared capacity's request policy as the API does:
// a default within the capacity, at most one of valid values and a valid
// range, and a default that either allows.
func requestPolicy(c resourceapi.DeviceCapacity) error {
	p := c.RequestPolicy
	within := func(what string, q *resource.Quantity) error {
		if q == nil {
			return nil
		}
		if q.Sign() < 0 {
			return fmt.Errorf("request policy: %s %s is negative", what, q.String())
		}
		if q.Cmp(c.Value) > 0 {
			return fmt.Errorf("request policy: %s %s is above the capacity %s", what, q.String(), c.Value.String())
		}
		return nil
	}
	if err := within("default", p.Default); err != nil {
		return err
	}
	if p.ValidRange != nil && len(p.ValidValues) > 0 {
		return errors.New("request policy: both valid values and a valid range")
	}
	if (p.ValidRange != nil || len(p.ValidValues) > 0) && p.Default == nil {
		return errors.New("request policy: valid values or a range need a default")
	}
	if vs := p.ValidValues; len(vs) > 0 {
		if len(vs) > maxValidValues {
			return fmt.Errorf("request policy: %d valid values, at most %d", len(vs), maxValidValues)
		}
		found := false
		for i := range vs {
			if err := within("valid value", &vs[i]); err != nil {
				return err
			}
			if i > 0 && vs[i].Cmp(vs[i-1]) <= 0 {
				return errors.New("request policy: valid values not in ascending order")
			}
			found = found || vs[i].Cmp(*p.Default) == 0
		}
		if !found {
			return fmt.Errorf("request policy: default %s is not a valid value", p.Default.String())
		}
	}
	if r := p.ValidRange; r != nil {
		if r.Min == nil {
			return errors.New("request policy: a valid range without a minimum")
		}
		if err := within("minimum", r.Min); err != nil {
			return err
		}
		if err := within("maximum", r.Max); err != nil {
			return err
		}
		if p.Default.Cmp(*r.Min) < 0 || (r.Max != nil && (p.Default.Cmp(*r.Max) > 0 || r.Max.Cmp(*r.Min) < 0)) {
			return fmt.Errorf("request policy: default %s is outside the valid range", p.Default.String())
		}
		if r.Step != nil {
			if r.Step.Sign() <= 0 {
				return errors.New("request policy: the step is not positive")
			}
			next := r.Min.DeepCopy()
			next.Add(*r.Step)
			if next.Cmp(c.Value) > 0 {
				return errors.New("request policy: the minimum plus one step is above the capacity")
			}
			for what, q := range map[string]*resource.Quantity{"default": p.Default, "maximum": r.Max} {
				if q == nil {
					continue
				}
				off := q.DeepCopy()
				off.Sub(*r.Min)
				if off.Value()%r.Step.Value() != 0 {
					return fmt.Errorf("request policy: %s %s is not the minimum plus whole steps", what, q.String())
				}
			}
		}
	}
	return nil
}
