package kb

import (
	"strings"
	"testing"
)

func TestXIDCatalog(t *testing.T) {
	k := Default()
	seen := map[int]bool{}
	for _, x := range k.XIDs {
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
		{109, "warning", "RESET_GPU", "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR"},
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
