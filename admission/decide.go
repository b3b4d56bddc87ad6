package admission

import (
	"fmt"
	"sort"
	"strings"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/textsafe"
)

// Image is one container image with what kiln compat read of it, or why
// it could not be read.
type Image struct {
	Ref          string
	Requirements *compat.Requirements
	// Err is set when the image could not be read (registry down, no
	// such image, no rights).
	Err error
}

// Judged is kiln compat's verdict for one image on one device.
type Judged struct {
	Device Device
	Report compat.GPUReport
}

// Judge runs kiln compat for the image on every device.
func Judge(req *compat.Requirements, devs []Device, k *kb.KB) []Judged {
	if k == nil {
		k = kb.Default()
	}
	out := make([]Judged, 0, len(devs))
	for _, d := range devs {
		nr := compat.Check(req, compat.Node{Name: d.Node, Snapshot: d.snapshot()}, k)
		j := Judged{Device: d}
		if len(nr.GPUs) > 0 {
			j.Report = nr.GPUs[0]
		} else {
			j.Report = compat.GPUReport{Verdict: nr.Verdict, Reasons: nr.Reasons}
		}
		out = append(out, j)
	}
	return out
}

// Decision is the webhook's answer for a Pod.
type Decision struct {
	Allowed bool
	// Message says why a Pod is refused (kiln's verdict and fix).
	Message string
	// Warnings go back to the user with an allowed Pod.
	Warnings []string
}

// maxMessage bounds what goes back into the apiserver's answer.
const maxMessage = 4000

// Pod decides on a Pod that asks for kiln's GPUs: refused when one of its
// images runs on no device of the cluster; allowed with a warning when
// kiln cannot tell, or cannot read an image (never a hang, never a silent
// "runs").
func Pod(images []Image, devs []Device, k *kb.KB) Decision {
	d := Decision{Allowed: true}
	if len(devs) == 0 {
		d.Warnings = append(d.Warnings, "kiln: the cluster publishes no gpu.kiln.dev device, so the images were not checked")
		return d
	}
	var refusals []string
	for _, im := range images {
		if im.Err != nil {
			d.Warnings = append(d.Warnings, fmt.Sprintf("kiln could not read image %s, so it was not checked: %v", im.Ref, im.Err))
			continue
		}
		js := Judge(im.Requirements, devs, k)
		runs, unknown := 0, 0
		for _, j := range js {
			switch {
			case j.Report.Verdict.Runs():
				runs++
			case j.Report.Verdict == compat.Unknown:
				unknown++
			}
		}
		switch {
		case runs > 0:
			if runs < len(js) {
				d.Warnings = append(d.Warnings, fmt.Sprintf("kiln: image %s runs on %d of the cluster's %d GPU devices; its claims are kept to those", im.Ref, runs, len(js)))
			}
		case unknown > 0:
			d.Warnings = append(d.Warnings, fmt.Sprintf("kiln cannot tell whether image %s runs on the cluster's GPUs: %s", im.Ref, why(js, compat.Unknown)))
		default:
			refusals = append(refusals, fmt.Sprintf("image %s runs on no GPU of this cluster: %s", im.Ref, why(js, compat.Fails)))
		}
	}
	if len(refusals) > 0 {
		d.Allowed = false
		d.Message = bound("kiln: " + strings.Join(refusals, "; "))
	}
	for i := range d.Warnings {
		d.Warnings[i] = bound(d.Warnings[i])
	}
	return d
}

// why groups the devices of one verdict by their reason and fix, so a
// reason every device shares is said once.
func why(js []Judged, v compat.Verdict) string {
	type group struct {
		text  string
		where []string
	}
	var groups []*group
	byText := map[string]*group{}
	for _, j := range js {
		if j.Report.Verdict != v {
			continue
		}
		text := strings.Join(j.Report.Reasons, "; ")
		if text == "" {
			text = string(v)
		}
		if len(j.Report.Fix) > 0 {
			text += " (fix: " + strings.Join(j.Report.Fix, "; ") + ")"
		}
		g := byText[text]
		if g == nil {
			g = &group{text: text}
			byText[text] = g
			groups = append(groups, g)
		}
		g.where = append(g.where, deviceLabel(j.Device))
	}
	sort.SliceStable(groups, func(a, b int) bool { return len(groups[a].where) > len(groups[b].where) })
	var parts []string
	for _, g := range groups {
		where := sortedUnique(g.where)
		if len(where) > 3 {
			where = append(where[:3], fmt.Sprintf("%d more", len(where)-3))
		}
		parts = append(parts, g.text+" ["+strings.Join(where, ", ")+"]")
	}
	return strings.Join(parts, "; ")
}

// deviceLabel is "model (cc 9.0)" or "model (gfx942)", what tells devices
// apart for a reader.
func deviceLabel(d Device) string {
	m := d.Model
	if m == "" {
		m = d.Vendor + " GPU"
	}
	switch {
	case d.ComputeCapability != "":
		return m + " (cc " + d.ComputeCapability + ", driver CUDA " + orUnknown(d.CUDADriver) + ")"
	case d.GFXTarget != "":
		return m + " (" + d.GFXTarget + ")"
	}
	return m
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// bound escapes text from outside (image names, reasons built from image
// contents) so it cannot drive the reader's terminal, and cuts it to what
// an answer may carry.
func bound(s string) string {
	s = textsafe.Printable(s)
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage - len(" ...")
	for cut > 0 && s[cut]&0xC0 == 0x80 { // not inside a UTF-8 sequence
		cut--
	}
	return s[:cut] + " ..."
}
