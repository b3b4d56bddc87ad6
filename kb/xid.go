package kb

import (
	"strconv"
	"strings"

	"kiln.dev/kiln/unwrap"
)

// NVIDIA resolution buckets kiln's Xid rule and lookups name. The values are
// the spellings of NVIDIA's Xid catalog ("Guidance Classes" sheet).
const (
	xidResetGPU   = "RESET_GPU"
	xidRestartBM  = "RESTART_BM"
	xidIgnore     = "IGNORE"
	xidContactSup = "CONTACT_SUPPORT"
)

// xidCriticalActions are immediate actions that take the GPU or the node out
// of service: a reset, a reboot, a VM restart, physical service, or a
// workflow whose outcome is one of those (WORKFLOW_XID_48 ends in RESET_GPU
// or DRAIN_AND_RESET; the catalog says Xid 74 needs a GPU reset or node
// reboot to clear).
var xidCriticalActions = map[string]bool{
	xidResetGPU:           true,
	xidRestartBM:          true,
	"RESTART_VM":          true,
	xidContactSup:         true,
	"CHECK_MECHANICALS":   true,
	"WORKFLOW_XID_48":     true,
	"WORKFLOW_NVLINK_ERR": true,
}

// xidWarningActions are application-class actions and workflows, and the
// buckets whose outcome depends on facts kiln cannot read from the code
// alone (WORKFLOW_NVLINK5_ERR decodes to IGNORE or RESET_GPU; CHECK_UVM
// resets only with UVM or vGPU in use; UPDATE_SWFW is a software mismatch).
var xidWarningActions = map[string]bool{
	"RESTART_APP":          true,
	"WORKFLOW_XID_13":      true,
	"WORKFLOW_XID_31":      true,
	"WORKFLOW_XID_45":      true,
	"CHECK_APP/CUDA":       true,
	"XID_154_EVAL":         true,
	"WORKFLOW_NVLINK5_ERR": true,
	"CHECK_UVM":            true,
	"UPDATE_SWFW":          true,
}

// XIDSeverityFor is kiln's severity rule for an Xid, from NVIDIA's immediate
// resolution bucket (action) and investigatory bucket (investigate):
//
//   - critical: RESET_GPU, RESTART_BM, RESTART_VM, CONTACT_SUPPORT,
//     CHECK_MECHANICALS, and the workflows whose outcome is a reset or
//     reboot (WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR);
//   - warning: RESTART_APP and the application workflows (WORKFLOW_XID_13,
//     WORKFLOW_XID_31, WORKFLOW_XID_45, CHECK_APP/CUDA, XID_154_EVAL), the
//     buckets whose outcome kiln cannot decide (WORKFLOW_NVLINK5_ERR,
//     CHECK_UVM, UPDATE_SWFW), and IGNORE when investigate is
//     CONTACT_SUPPORT;
//   - info: IGNORE with any other investigatory bucket;
//   - warning for anything else (NOT_PUBLISHED, XID_154, an unknown bucket).
//
// Bucket names are compared without regard to case or surrounding space.
// Every row of kb/data/xid.yaml follows this rule or carries a
// severity_reason.
func XIDSeverityFor(action, investigate string) string {
	a := strings.ToUpper(strings.TrimSpace(action))
	switch {
	case xidCriticalActions[a]:
		return "critical"
	case xidWarningActions[a]:
		return "warning"
	case a == xidIgnore:
		if strings.ToUpper(strings.TrimSpace(investigate)) == xidContactSup {
			return "warning"
		}
		return "info"
	}
	return "warning"
}

// RuleSeverity is XIDSeverityFor applied to the row's own buckets.
func (x XID) RuleSeverity() string { return XIDSeverityFor(x.Action, x.Investigate) }

// XIDRecoveryAction is one value of the driver's GPU recovery action, the
// state Xid 154 reports as "GPU recovery action changed from 0x0 (None) to
// 0x2 (Node Reboot Required)".
type XIDRecoveryAction struct {
	// Code is the value the message prints in hex ("0x2").
	Code int `json:"code"`
	// Name is the driver's text in the message ("Node Reboot Required");
	// empty where NVIDIA has not published the driver's text.
	Name string `json:"name,omitempty"`
	// NVML is the NVML enum name for the same value.
	NVML string `json:"nvml"`
	// Severity is kiln's rating of a GPU in this state.
	Severity string `json:"severity"`
	// Requests is the NVIDIA bucket the action asks for (RESET_GPU or
	// RESTART_BM), empty when it asks for neither.
	Requests string `json:"requests,omitempty"`
	Source   string `json:"source"`
}

// Sources of the recovery-action table.
const (
	srcRecoveryCAT  = "CAT Xid 154 trigger conditions (expected strings); "
	srcRecoveryDrv  = "NV2080_CTRL_GPU_RECOVERY_ACTION (value) in open-gpu-kernel-modules src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080gpu.h, driver 595.45.04"
	srcRecoveryName = "_gpuRecoveryActionName (string) in open-gpu-kernel-modules src/nvidia/src/kernel/gpu/gpu.c, driver 595.45.04; "
	srcRecoveryNVML = "NVML nvmlDeviceGpuRecoveryAction_t (value, meaning), cuda-python cuda.bindings.nvml.DeviceGpuRecoveryAction docs; driver text for this value not published"
)

// xidRecoveryActions is the driver's recovery-action enum. Severity: None
// needs nothing (info); Drain P2P asks to stop peer-to-peer traffic and
// query again, after which the driver reports one of the other values
// (warning); every other value takes the GPU, the node or the IMEX domain
// out of service until acted on (critical). Meanings per NVIDIA GPU Memory
// Error Management, "Error Recovery and Response Flags".
var xidRecoveryActions = []XIDRecoveryAction{
	{Code: 0, Name: "None", NVML: "NVML_GPU_RECOVERY_ACTION_NONE", Severity: "info",
		Source: srcRecoveryCAT + srcRecoveryDrv},
	{Code: 1, Name: "GPU Reset Required", NVML: "NVML_GPU_RECOVERY_ACTION_GPU_RESET", Severity: "critical", Requests: xidResetGPU,
		Source: srcRecoveryCAT + srcRecoveryDrv},
	{Code: 2, Name: "Node Reboot Required", NVML: "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT", Severity: "critical", Requests: xidRestartBM,
		Source: srcRecoveryCAT + srcRecoveryDrv},
	{Code: 3, Name: "Drain P2P", NVML: "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P", Severity: "warning",
		Source: srcRecoveryCAT + srcRecoveryDrv},
	{Code: 4, Name: "Drain and Reset", NVML: "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", Severity: "critical", Requests: xidResetGPU,
		Source: srcRecoveryCAT + srcRecoveryDrv},
	{Code: 5, Name: "Recover IMEX Domain", NVML: "NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN", Severity: "critical",
		Source: srcRecoveryName + srcRecoveryDrv},
	{Code: 6, NVML: "NVML_GPU_RECOVERY_ACTION_BUS_RESET", Severity: "critical", Requests: xidResetGPU,
		Source: srcRecoveryNVML},
	{Code: 7, NVML: "NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT", Severity: "critical", Requests: xidRestartBM,
		Source: srcRecoveryNVML},
}

// XIDRecoveryActionFor maps the action text kiln reads from an Xid 154
// message to its recovery action. It accepts the driver's name ("Drain
// P2P", any case), the value ("0x3" or "3"), both ("0x3 (Drain P2P)"), the
// NVML enum name with or without its NVML_GPU_RECOVERY_ACTION_ prefix, or
// the whole message, in which case the new action (after "to") is used. A
// known name wins over the value; a name the driver prints for values it
// does not know ("Unknown") falls back to the value.
func XIDRecoveryActionFor(text string) (XIDRecoveryAction, bool) {
	s := strings.TrimSpace(text)
	if tail, ok := recoveryActionTail(s); ok {
		s = tail
	}
	s = strings.TrimRight(strings.TrimSpace(s), ".,;")
	name, num := s, ""
	if i := strings.Index(s, "("); i >= 0 {
		if j := strings.LastIndex(s, ")"); j > i {
			num, name = strings.TrimSpace(s[:i]), s[i+1:j]
		}
	} else if _, err := strconv.ParseInt(s, 0, 32); err == nil {
		num, name = s, ""
	}
	if a, ok := recoveryActionByName(name); ok {
		return a, true
	}
	if num != "" {
		if v, err := strconv.ParseInt(num, 0, 32); err == nil {
			for _, a := range xidRecoveryActions {
				if int64(a.Code) == v {
					return a, true
				}
			}
		}
	}
	return XIDRecoveryAction{}, false
}

// recoveryActionTail returns the text after the last " to " of an Xid 154
// "recovery action changed from A to B" message.
func recoveryActionTail(s string) (string, bool) {
	l := unwrap.ASCIILower(s)
	if !strings.Contains(l, "recovery action changed") {
		return "", false
	}
	i := strings.LastIndex(l, " to ")
	if i < 0 {
		return "", false
	}
	return s[i+len(" to "):], true
}

func recoveryActionByName(name string) (XIDRecoveryAction, bool) {
	n := strings.ToUpper(strings.Join(strings.Fields(name), " "))
	if n == "" {
		return XIDRecoveryAction{}, false
	}
	for _, a := range xidRecoveryActions {
		if a.Name != "" && strings.ToUpper(a.Name) == n {
			return a, true
		}
		short := strings.TrimPrefix(a.NVML, "NVML_GPU_RECOVERY_ACTION_")
		if n == a.NVML || n == short {
			return a, true
		}
	}
	return XIDRecoveryAction{}, false
}

// xidResetPhrase is text with which an Xid message asks for a reset or a
// reboot, and the NVIDIA bucket it asks for.
type xidResetPhrase struct {
	phrase   string // lower case
	requests string
	source   string
}

// xidResetPhrases, strongest request first.
var xidResetPhrases = []xidResetPhrase{
	{"node reboot required", xidRestartBM, "driver text of recovery action 0x2 (CAT Xid 154 trigger conditions)"},
	{"reboot the system", xidRestartBM, "NVML GPU_RECOVERY_ACTION_SYSTEM_REBOOT description (cuda-python DeviceGpuRecoveryAction docs)"},
	{"gpu reset required", xidResetGPU, "driver text of recovery action 0x1 (CAT Xid 154 trigger conditions)"},
	{"drain and reset", xidResetGPU, "driver text of recovery action 0x4 (CAT Xid 154 trigger conditions)"},
	{"reset gpu to activate", xidResetGPU, "Xid 63 row-remapper message (stas00/ml-engineering debug.md example); remapping takes effect at the next GPU reset (NVIDIA GPU Memory Error Management, Error Recovery and Response Flags)"},
	{"reset the gpu", xidResetGPU, "CAT Xid 140 trigger conditions; NVIDIA GPU Memory Error Management, Error Recovery and Response Flags (reset action)"},
	{"reload the driver to activate", xidResetGPU, "Xid 63 dynamic page retirement message (NVIDIA Dynamic Page Retirement, Visibility)"},
}

// XIDResetRequest reports whether an Xid message's own text asks for a GPU
// reset or a node reboot, and which: RESTART_BM for a reboot, RESET_GPU for
// a reset (a reboot wins when both are asked). Matching ignores case. A
// phrase negated just before it ("No GPU reset required") does not count.
// For Xid 154 ("recovery action changed from A to B") only the new action B
// counts, so a change back to None asks for nothing.
func XIDResetRequest(message string) (string, bool) {
	if tail, ok := recoveryActionTail(message); ok {
		if a, ok := XIDRecoveryActionFor(tail); ok {
			return a.Requests, a.Requests != ""
		}
		message = tail
	}
	l := strings.ToLower(message)
	for _, p := range xidResetPhrases {
		for from := 0; ; {
			i := strings.Index(l[from:], p.phrase)
			if i < 0 {
				break
			}
			i += from
			if !negatedBefore(l[:i]) {
				return p.requests, true
			}
			from = i + len(p.phrase)
		}
	}
	return "", false
}

// negatedBefore reports whether one of the three words just before a
// phrase, within the same clause, negates it ("no", "not", "without",
// "never", "don't").
func negatedBefore(before string) bool {
	if i := strings.LastIndexAny(before, ".,;:!?()"); i >= 0 {
		before = before[i+1:]
	}
	words := strings.FieldsFunc(before, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r == '\'')
	})
	if len(words) > 3 {
		words = words[len(words)-3:]
	}
	for _, w := range words {
		switch w {
		case "no", "not", "without", "never", "don't", "doesn't", "needn't":
			return true
		}
	}
	return false
}
