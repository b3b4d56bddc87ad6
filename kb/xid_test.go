package kb

import (
	"strings"
	"testing"
)

func TestXIDCatalog(t *testing.T) {
	k := Default()
	seen := map[int]bool{}
	for _, x := range xidRows(t, k) {
		if seen[x.Code] {
			t.Errorf("xid %d: listed twice", x.Code)
		}
		seen[x.Code] = true
		if strings.TrimSpace(x.Source) == "" {
			t.Errorf("xid %d: no source", x.Code)
		}
		switch x.Severity {
		case "critical", "warning", "info":
		default:
			t.Errorf("xid %d: severity %q is not critical, warning or info", x.Code, x.Severity)
		}
		if x.Mnemonic == "" || x.Meaning == "" || x.Action == "" || x.Remedy == "" {
			t.Errorf("xid %d: mnemonic, meaning, action and remedy are required", x.Code)
		}
	}
	// Every code of the shared reference table and the common older codes.
	want := []int{8, 13, 31, 32, 38, 43, 44, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 93, 94, 95,
		109, 119, 120, 121, 140, 143, 144, 145, 146, 147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157}
	for _, c := range want {
		if !seen[c] {
			t.Errorf("xid %d: missing from the catalog", c)
		}
	}
}

// NVIDIA's catalog lists every code from 1 to 172; the driver header adds
// 173-176 and the operational-events release notes name 185.
func TestXIDCatalogComplete(t *testing.T) {
	k := Default()
	seen := map[int]bool{}
	for _, x := range xidRows(t, k) {
		seen[x.Code] = true
	}
	for c := 1; c <= 176; c++ {
		if !seen[c] {
			t.Errorf("xid %d: missing; NVIDIA's catalog or driver header lists it", c)
		}
	}
	if !seen[185] {
		t.Error("xid 185: missing; the R620 operational-events release notes name it")
	}
	prev := 0
	for _, x := range xidRows(t, k) {
		if x.Code <= prev {
			t.Errorf("xid %d: rows out of order (after %d)", x.Code, prev)
		}
		prev = x.Code
	}
}

// Buckets as NVIDIA's catalog spells them, plus kiln's NOT_PUBLISHED.
var (
	knownXIDActions = map[string]bool{
		"RESTART_APP": true, "RESET_GPU": true, "RESTART_BM": true, "RESTART_VM": true, "IGNORE": true,
		"CONTACT_SUPPORT": true, "CHECK_MECHANICALS": true, "CHECK_UVM": true, "UPDATE_SWFW": true,
		"WORKFLOW_XID_45": true, "WORKFLOW_XID_48": true, "WORKFLOW_NVLINK_ERR": true,
		"WORKFLOW_NVLINK5_ERR": true, "XID_154": true, "NOT_PUBLISHED": true,
	}
	knownXIDInvestigate = map[string]bool{
		"": true, "CONTACT_SUPPORT": true, "IGNORE": true, "IGNORE (sympathetic)": true, "CHECK_APP/CUDA": true,
		"INVESTIGATE_SW": true, "INVESTIGATE_SW_USER": true, "INVESTIGATE_LINK_SI": true,
		"SYMPATHETIC_REPORT_SOLO": true, "UPDATE_SWFW": true, "XID_137_FLOW": true,
		"WORKFLOW_XID_13": true, "WORKFLOW_XID_31": true, "WORKFLOW_XID_48": true, "WORKFLOW_NVLINK5_ERR": true,
		"Solo: RESTART_FM; Not Solo: IGNORE (follow other Xid)": true,
	}
)

func TestXIDRowsSourcedAndValid(t *testing.T) {
	for _, x := range xidRows(t, Default()) {
		if !knownXIDActions[x.Action] {
			t.Errorf("xid %d: action %q is not one of NVIDIA's buckets (or NOT_PUBLISHED)", x.Code, x.Action)
		}
		if !knownXIDInvestigate[x.Investigate] {
			t.Errorf("xid %d: investigate %q is not one of NVIDIA's investigatory buckets", x.Code, x.Investigate)
		}
		src := x.Source
		if !strings.Contains(src, "CAT") && !strings.Contains(src, "OLD") && !strings.Contains(src, "HDR") &&
			!strings.Contains(src, "GOE") && !strings.Contains(src, "MEM") {
			t.Errorf("xid %d: source %q names none of the header's sources (CAT, OLD, HDR, MEM, GOE)", x.Code, src)
		}
		if x.Investigate != "" && !strings.Contains(src, "CAT") {
			t.Errorf("xid %d: investigate %q without the catalog (CAT) as its source", x.Code, x.Investigate)
		}
		if x.Action == "NOT_PUBLISHED" {
			if x.Investigate != "" {
				t.Errorf("xid %d: NOT_PUBLISHED action with an investigatory bucket %q", x.Code, x.Investigate)
			}
			if strings.Contains(src, "action") {
				t.Errorf("xid %d: NOT_PUBLISHED but the source claims an action: %q", x.Code, src)
			}
		} else if !strings.Contains(src, "CAT") {
			t.Errorf("xid %d: action %q without the catalog (CAT) as its source", x.Code, x.Action)
		}
		if x.SideEffect && !strings.Contains(src, "side_effect:") {
			t.Errorf("xid %d: side_effect without a source (\"side_effect: ...\" in source)", x.Code)
		}
		if !x.SideEffect && strings.Contains(src, "side_effect:") {
			t.Errorf("xid %d: source names a side_effect the row does not set", x.Code)
		}
	}
}

// Every row follows XIDSeverityFor or says why not; a reason on a row that
// follows the rule is stale.
func TestXIDSeverityRule(t *testing.T) {
	for _, x := range xidRows(t, Default()) {
		rule := x.RuleSeverity()
		switch {
		case x.Severity != rule && strings.TrimSpace(x.SeverityReason) == "":
			t.Errorf("xid %d: severity %s but the rule gives %s (action %s, investigate %q) and no severity_reason",
				x.Code, x.Severity, rule, x.Action, x.Investigate)
		case x.Severity == rule && x.SeverityReason != "":
			t.Errorf("xid %d: severity_reason set but the severity follows the rule (%s)", x.Code, rule)
		}
	}
	// The exceptions the catalog's own text argues for.
	for _, c := range []int{154, 155, 156} {
		x, _ := Default().XIDInfo(c)
		if x.SeverityReason == "" {
			t.Errorf("xid %d: expected a severity_reason", c)
		}
	}
}

func TestXIDSeverityFor(t *testing.T) {
	tests := []struct {
		action, investigate, want string
	}{
		{"RESET_GPU", "CONTACT_SUPPORT", "critical"},
		{"RESTART_BM", "CONTACT_SUPPORT", "critical"},
		{"RESTART_VM", "CONTACT_SUPPORT", "critical"},
		{"CONTACT_SUPPORT", "", "critical"},
		{"CHECK_MECHANICALS", "CONTACT_SUPPORT", "critical"},
		{"WORKFLOW_XID_48", "WORKFLOW_XID_48", "critical"},
		{"WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", "critical"},
		{"RESTART_APP", "CONTACT_SUPPORT", "warning"},
		{"RESTART_APP", "WORKFLOW_XID_13", "warning"},
		{"WORKFLOW_XID_45", "Solo: RESTART_FM; Not Solo: IGNORE (follow other Xid)", "warning"},
		{"WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "warning"},
		{"CHECK_UVM", "SYMPATHETIC_REPORT_SOLO", "warning"},
		{"UPDATE_SWFW", "UPDATE_SWFW", "warning"},
		{"IGNORE", "CONTACT_SUPPORT", "warning"},
		{"IGNORE", "IGNORE", "info"},
		{"IGNORE", "INVESTIGATE_SW", "info"},
		{"IGNORE", "", "info"},
		{" ignore ", " contact_support ", "warning"},
		{"reset_gpu", "", "critical"},
		{"XID_154", "", "warning"},
		{"NOT_PUBLISHED", "", "warning"},
		{"", "", "warning"},
		{"SOMETHING_NEW", "CONTACT_SUPPORT", "warning"},
	}
	for _, tt := range tests {
		if got := XIDSeverityFor(tt.action, tt.investigate); got != tt.want {
			t.Errorf("XIDSeverityFor(%q, %q) = %s, want %s", tt.action, tt.investigate, got, tt.want)
		}
	}
}

func TestXIDSeverity(t *testing.T) {
	k := Default()
	tests := []struct {
		code     int
		severity string
		action   string
		mnemonic string
	}{
		{13, "warning", "RESTART_APP", "ROBUST_CHANNEL_GR_EXCEPTION"},
		{31, "warning", "RESTART_APP", "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT"},
		{43, "warning", "IGNORE", "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR"},
		{45, "warning", "WORKFLOW_XID_45", "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL"},
		{109, "critical", "RESET_GPU", "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR"},
		{48, "critical", "WORKFLOW_XID_48", "ROBUST_CHANNEL_GPU_ECC_DBE"},
		{62, "critical", "RESET_GPU", "PMU_HALT_ERROR"},
		{63, "info", "IGNORE", "INFOROM_DRAM_RETIREMENT_EVENT"},
		{64, "critical", "RESET_GPU", "INFOROM_DRAM_RETIREMENT_FAILURE"},
		{74, "critical", "WORKFLOW_NVLINK_ERR", "NVLINK_ERROR"},
		{79, "critical", "RESTART_BM", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"},
		{95, "critical", "RESET_GPU", "ROBUST_CHANNEL_UNCONTAINED_ERROR"},
		{119, "critical", "RESET_GPU", "GSP_RPC_TIMEOUT"},
		{120, "critical", "RESET_GPU", "GSP_ERROR"},
		{140, "critical", "RESET_GPU", "UNRECOVERABLE_ECC_ERROR_ESCAPE"},
		{154, "info", "XID_154", "GPU_RECOVERY_ACTION_CHANGED"},
		// Added rows.
		{1, "critical", "CONTACT_SUPPORT", "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD"},
		{11, "warning", "RESTART_APP", "ROBUST_CHANNEL_GR_ERROR_MISSING_HW"},
		{37, "info", "IGNORE", "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD"},
		{39, "warning", "RESTART_APP", "ROBUST_CHANNEL_CE0_ERROR"},
		{54, "critical", "CHECK_MECHANICALS", "SILENT_RUNNING_PWR_REDUCED_CLOCKING"},
		{78, "warning", "UPDATE_SWFW", "VGPU_START_ERROR"},
		{106, "info", "IGNORE", "SMBPBI_TEST_MESSAGE"},
		{110, "critical", "RESET_GPU", "SEC_FAULT_ERROR"},
		{150, "critical", "WORKFLOW_NVLINK5_ERR", "NVLINK_MSE_ERROR"},
		{159, "warning", "CHECK_UVM", "ROBUST_CHANNEL_CHI_NON_DATA_ERROR"},
		{160, "info", "IGNORE", "CHANNEL_RETIREMENT_EVENT"},
		{171, "warning", "NOT_PUBLISHED", "UNCORRECTABLE_DRAM_ERROR"},
	}
	for _, tt := range tests {
		x, ok := k.XIDInfo(tt.code)
		if !ok {
			t.Errorf("XIDInfo(%d): not found", tt.code)
			continue
		}
		if x.Severity != tt.severity || x.Action != tt.action || x.Mnemonic != tt.mnemonic {
			t.Errorf("XIDInfo(%d) = %s/%s/%s, want %s/%s/%s", tt.code, x.Severity, x.Action, x.Mnemonic,
				tt.severity, tt.action, tt.mnemonic)
		}
	}
	if _, ok := k.XIDInfo(9999); ok {
		t.Error("XIDInfo(9999) found a row for a code that does not exist")
	}
}

func TestXIDInvestigateAndSideEffect(t *testing.T) {
	k := Default()
	inv := map[int]string{
		8: "CONTACT_SUPPORT", 13: "WORKFLOW_XID_13", 31: "WORKFLOW_XID_31", 48: "WORKFLOW_XID_48",
		63: "IGNORE", 94: "IGNORE (sympathetic)", 119: "INVESTIGATE_SW", 136: "INVESTIGATE_LINK_SI",
		137: "XID_137_FLOW", 154: "", 155: "INVESTIGATE_SW_USER", 1: "", 171: "",
	}
	for c, want := range inv {
		x, _ := k.XIDInfo(c)
		if x.Investigate != want {
			t.Errorf("xid %d: investigate %q, want %q", c, x.Investigate, want)
		}
	}
	side := map[int]bool{45: true, 94: true, 95: true, 154: true, 159: true, 171: true, 172: true,
		13: false, 48: false, 74: false, 79: false, 119: false}
	for c, want := range side {
		x, _ := k.XIDInfo(c)
		if x.SideEffect != want {
			t.Errorf("xid %d: side_effect %v, want %v", c, x.SideEffect, want)
		}
	}
}

func TestXIDRecoveryActionTable(t *testing.T) {
	codes := map[int]bool{}
	names := map[string]bool{}
	for _, a := range xidRecoveryActions {
		if codes[a.Code] {
			t.Errorf("recovery action 0x%x listed twice", a.Code)
		}
		codes[a.Code] = true
		if a.Name != "" {
			if names[a.Name] {
				t.Errorf("recovery action name %q listed twice", a.Name)
			}
			names[a.Name] = true
		}
		if a.Source == "" || a.NVML == "" {
			t.Errorf("recovery action 0x%x: source and NVML name are required", a.Code)
		}
		switch a.Severity {
		case "critical", "warning", "info":
		default:
			t.Errorf("recovery action 0x%x: severity %q", a.Code, a.Severity)
		}
		if (a.Requests != "") != (a.Severity == "critical" && a.Code != 5) {
			t.Errorf("recovery action 0x%x: requests %q does not fit severity %s", a.Code, a.Requests, a.Severity)
		}
	}
	// The strings NVIDIA's catalog says Xid 154 prints.
	for _, n := range []string{"None", "Drain P2P", "Drain and Reset", "GPU Reset Required", "Node Reboot Required"} {
		if !names[n] {
			t.Errorf("recovery action %q missing", n)
		}
	}
}

func TestXIDRecoveryActionFor(t *testing.T) {
	tests := []struct {
		text     string
		ok       bool
		code     int
		severity string
	}{
		{"None", true, 0, "info"},
		{"Drain P2P", true, 3, "warning"},
		{"Drain and Reset", true, 4, "critical"},
		{"GPU Reset Required", true, 1, "critical"},
		{"Node Reboot Required", true, 2, "critical"},
		{"Recover IMEX Domain", true, 5, "critical"},
		{"node reboot required", true, 2, "critical"},
		{"  drain   p2p  ", true, 3, "warning"},
		{"0x0", true, 0, "info"},
		{"0x2", true, 2, "critical"},
		{"3", true, 3, "warning"},
		{"0x6", true, 6, "critical"},
		{"0x7", true, 7, "critical"},
		{"0x2 (Node Reboot Required)", true, 2, "critical"},
		{"0x3 (Drain P2P).", true, 3, "warning"},
		{"0x7 (Unknown)", true, 7, "critical"},
		{"NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", true, 4, "critical"},
		{"GPU_RESET", true, 1, "critical"},
		{"GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", true, 2, "critical"},
		{"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", true, 1, "critical"},
		{"GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", true, 0, "info"},
		{"GPU recovery action changed from 0x2 (Node Reboot Required) to 0x3 (Drain P2P)", true, 3, "warning"},
		// Negative cases.
		{"", false, 0, ""},
		{"Unknown", false, 0, ""},
		{"0x9", false, 0, ""},
		{"0x9 (Unknown)", false, 0, ""},
		{"Reboot", false, 0, ""},
		{"Drain", false, 0, ""},
		{"GPU Reset", false, 0, ""},
		{"-1", false, 0, ""},
	}
	for _, tt := range tests {
		a, ok := XIDRecoveryActionFor(tt.text)
		if ok != tt.ok {
			t.Errorf("XIDRecoveryActionFor(%q) ok = %v, want %v", tt.text, ok, tt.ok)
			continue
		}
		if ok && (a.Code != tt.code || a.Severity != tt.severity) {
			t.Errorf("XIDRecoveryActionFor(%q) = 0x%x %s, want 0x%x %s", tt.text, a.Code, a.Severity, tt.code, tt.severity)
		}
	}
}

func TestXIDResetRequest(t *testing.T) {
	tests := []struct {
		message string
		want    string // "" for no request
	}{
		{"NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.", "RESET_GPU"},
		{"Row Remapper: New row (0x0000000000abcdef) marked for remapping, RESET GPU TO ACTIVATE.", "RESET_GPU"},
		{"XID 63 Dynamic Page Retirement: New retired page, reload the driver to activate.", "RESET_GPU"},
		{"GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "RESET_GPU"},
		{"GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "RESTART_BM"},
		{"GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 (Node Reboot Required)", "RESTART_BM"},
		{"GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "RESET_GPU"},
		{"GPU recovery action changed from 0x0 (None) to 0x7 (Unknown)", "RESTART_BM"},
		{"ECC Unrecovered Error. Reset the GPU, and if the problem persists, contact your hardware vendor.", "RESET_GPU"},
		{"Fatal error on the GPU. Reboot the system.", "RESTART_BM"},
		{"node reboot required", "RESTART_BM"},
		{"GPU Reset Required; Node Reboot Required", "RESTART_BM"},
		{"No GPU reset required. reset the GPU", "RESET_GPU"},
		// Negative cases.
		{"", ""},
		{"NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception", ""},
		{"NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus.", ""},
		{"GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", ""},
		{"GPU recovery action changed from 0x2 (Node Reboot Required) to 0x3 (Drain P2P)", ""},
		{"No GPU reset required. If power smoothing functionality is desired, resolve the thermal events.", ""},
		{"Do not reset the GPU while jobs run", ""},
		{"GPU reset completed", ""},
		{"reboot", ""},
		{"Row Remapper: New row marked for remapping", ""},
	}
	for _, tt := range tests {
		got, ok := XIDResetRequest(tt.message)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("XIDResetRequest(%q) = %q, %v; want %q", tt.message, got, ok, tt.want)
		}
	}
}

func xidRows(t *testing.T, k *KB) []XID {
	t.Helper()
	rows, err := k.XIDTable()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatal("the Xid catalogue is empty")
	}
	return rows
}

// TestRecoveryActionNonASCII: text before the action whose lower case is
// longer than itself does not shift what is read.
func TestRecoveryActionNonASCII(t *testing.T) {
	a, ok := XIDRecoveryActionFor(strings.Repeat("İ", 40) + " GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")
	if !ok || a.Severity != "critical" {
		t.Errorf("got %+v, %v", a, ok)
	}
}
