package capture

import (
	"bytes"
	"errors"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// When the amdgpu driver is not loaded, rocm-smi and amd-smi print only an
// error ("ERROR:root:Driver not initialized (amdgpu not found in modules)",
// "ERROR:root:Drivers not loaded (amdgpu, amd_hsmp ... not found in
// modules)", "Unable to detect any GPU devices, check amdgpu version and
// module status"). That output is a capture of its own: the tool could not
// reach the driver or found no GPU.
func init() {
	RegisterFile(FileImporter{Kind: "amd-smi-error", Fallback: true, Detect: detectAMDToolError, Parse: parseAMDToolError})
}

type amdToolPhrase struct {
	text   string // lower case
	reason string
}

var amdToolPhrases = []amdToolPhrase{
	{"driver not initialized (amdgpu not found in modules)", snapshot.ToolDriverUnreachable},
	{"drivers not loaded (amdgpu", snapshot.ToolDriverUnreachable},
	{"amdsmi_status_driver_not_loaded", snapshot.ToolDriverUnreachable},
	{"unable to detect any gpu devices", snapshot.ToolNoDevices},
}

func detectAMDToolError(_ string, data []byte) bool {
	return len(scanAMDToolErrors(data[:min(len(data), detectHead)])) > 0
}

func parseAMDToolError(_ string, data []byte) (*snapshot.Snapshot, error) {
	s := snapshot.New()
	s.Events = scanAMDToolErrors(data)
	if len(s.Events) == 0 {
		return nil, errors.New("no rocm-smi or amd-smi error message in the file")
	}
	return s, nil
}

func scanAMDToolErrors(data []byte) []snapshot.Event {
	low := bytes.ToLower(data[:min(len(data), 1<<20)])
	if !bytes.Contains(low, []byte("amdgpu")) && !bytes.Contains(low, []byte("gpu devices")) && !bytes.Contains(low, []byte("amdsmi_status")) {
		return nil
	}
	var out []snapshot.Event
	seen := map[string]bool{}
	forEachLine(data, func(line []byte) bool {
		l := strings.TrimSpace(string(line))
		ll := strings.ToLower(l)
		for _, p := range amdToolPhrases {
			if !strings.Contains(ll, p.text) || seen[p.reason] {
				continue
			}
			seen[p.reason] = true
			msg := strings.TrimPrefix(strings.TrimPrefix(l, "ERROR:root:"), "ERROR:")
			if len(msg) > 512 {
				msg = msg[:512]
			}
			out = append(out, snapshot.Event{Source: "amd-smi-error", Kind: snapshot.EventToolError, Reason: p.reason, Message: msg})
		}
		return len(out) < len(amdToolPhrases)
	})
	return out
}
