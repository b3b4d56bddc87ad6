package capture

import (
	"bytes"
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/unwrap"
)

// A GPU tool that fails says why, and that text is the best evidence of a
// dead or hung GPU there is: "Unable to determine the device handle for GPU
// 0000:3b:00.0: GPU is lost", "No devices were found", "NVIDIA-SMI has
// failed because it couldn't communicate with the NVIDIA driver". kiln
// reads it as a capture of its own (the tool printed nothing else) and
// inside the other formats (nvidia-smi prints it before the GPUs it could
// read).
func init() {
	RegisterFile(FileImporter{Kind: "nvidia-smi-error", Fallback: true, Detect: detectToolError, Parse: parseToolError})
}

// toolPhrase is one failure message; reason classifies it. device says
// whether a PCI address follows the phrase.
type toolPhrase struct {
	text   string // lower case
	reason string
	device bool
}

var toolPhrases = []toolPhrase{
	{"unable to determine the device handle for gpu", "", true},
	// Without "driver": the message wraps there on narrow terminals.
	{"nvidia-smi has failed because it couldn't communicate with the nvidia", snapshot.ToolDriverUnreachable, false},
	{"couldn't communicate with the nvidia driver", snapshot.ToolDriverUnreachable, false},
	{"failed to initialize nvml: driver/library version mismatch", snapshot.ToolVersionMismatch, false},
	{"failed to initialize nvml", snapshot.ToolDriverUnreachable, false},
	{"nvidia-smi couldn't find libnvidia-ml.so", snapshot.ToolDriverUnreachable, false},
	{"unable to query number of gpus", snapshot.ToolDriverUnreachable, false},
	{"unable to determine the number of gpus", snapshot.ToolDriverUnreachable, false},
	{"no devices were found", snapshot.ToolNoDevices, false},
	{"no nvidia gpu found", snapshot.ToolNoDevices, false},
}

func detectToolError(_ string, data []byte) bool {
	evs := scanToolErrors(data[:min(len(data), detectHead)], "nvidia-smi")
	return len(evs) > 0
}

func parseToolError(_ string, data []byte) (*snapshot.Snapshot, error) {
	s := snapshot.New()
	s.Events = scanToolErrors(data, "nvidia-smi")
	if len(s.Events) == 0 {
		return nil, fmt.Errorf("no nvidia-smi error message in the file")
	}
	for _, e := range s.Events {
		if e.Device == "" {
			continue
		}
		// The GPU the tool named exists, even if nothing else of it can
		// be read.
		s.GPUs = append(s.GPUs, snapshot.GPU{Vendor: snapshot.VendorNVIDIA, PCIAddress: e.Device, Index: len(s.GPUs)})
	}
	return s, nil
}

// maxToolErrors bounds the error events one file gives.
const maxToolErrors = 1024

// scanToolErrors finds the failure messages in data. A message the tool
// wrapped over two lines ("... GPU is lost.  Reboot" / "the system to
// recover this GPU") is read whole.
func scanToolErrors(data []byte, source string) []snapshot.Event {
	if !mayHoldToolError(data) {
		return nil
	}
	var out []snapshot.Event
	seen := map[string]bool{}
	var prev string
	forEachLine(data, func(line []byte) bool {
		l := strings.TrimSpace(string(line))
		if l == "" {
			prev = ""
			return true
		}
		low := unwrap.ASCIILower(l)
		for _, p := range toolPhrases {
			i := strings.Index(low, p.text)
			if i < 0 {
				continue
			}
			ev := snapshot.Event{Source: source, Kind: snapshot.EventToolError, Reason: p.reason, Message: l[i:]}
			if p.device {
				rest := l[i+len(p.text):]
				addr, tail := leadingPCI(rest)
				if addr == "" {
					break
				}
				ev.Device = addr
				ev.Reason = deviceReason(tail)
			}
			key := ev.Reason + "|" + ev.Device
			if !seen[key] && len(out) < maxToolErrors {
				seen[key] = true
				out = append(out, ev)
			}
			prev = key
			return true
		}
		// A continuation of the message before ("the system to recover
		// this GPU", "NVML library version: 570.124").
		if prev != "" && len(out) > 0 && len(out[len(out)-1].Message) < 512 {
			last := &out[len(out)-1]
			if last.Reason+"|"+last.Device == prev && (strings.HasPrefix(low, "the system") || strings.HasPrefix(low, "nvml library version") || strings.HasPrefix(low, "make sure")) {
				last.Message += " " + l
			}
		}
		prev = ""
		return true
	})
	// "Failed to initialize NVML: Driver/library version mismatch" says
	// why NVML failed; the bare "Failed to initialize NVML" (a line cut
	// short, a second report) adds nothing to it.
	mismatch := false
	for _, e := range out {
		mismatch = mismatch || e.Reason == snapshot.ToolVersionMismatch
	}
	if mismatch {
		kept := out[:0]
		for _, e := range out {
			if e.Reason == snapshot.ToolDriverUnreachable && strings.HasPrefix(strings.ToLower(e.Message), "failed to initialize nvml") {
				continue
			}
			kept = append(kept, e)
		}
		out = kept
	}
	return out
}

// mayHoldToolError is a cheap test before the line scan, without copying:
// the phrases are looked for without their first letter, which a message
// may or may not capitalise.
func mayHoldToolError(data []byte) bool {
	data = data[:min(len(data), 1<<20)]
	for _, p := range toolMarkers {
		if bytes.Contains(data, p) {
			return true
		}
	}
	return false
}

var toolMarkers = [][]byte{
	[]byte("nable to determine"), []byte("ouldn't communicate"), []byte("ailed to initialize NVML"), []byte("ailed to initialize nvml"),
	[]byte("o devices were found"), []byte("ouldn't find libnvidia-ml"), []byte("o NVIDIA GPU found"), []byte("o nvidia gpu found"),
	[]byte("nable to query number"), []byte("NABLE TO DETERMINE"),
}

// leadingPCI reads the PCI address at the start of s ("0000:3b:00.0: GPU
// is lost", "00000000:3B:00.0", " 0000:09:00.0"), returning it canonical
// and the text after it.
func leadingPCI(s string) (string, string) {
	s = strings.TrimLeft(s, " \t")
	end := 0
	for end < len(s) && end < 20 && (isHex(s[end]) || s[end] == ':' || s[end] == '.') {
		end++
	}
	cand := strings.TrimRight(s[:end], ":.")
	a, err := snapshot.CanonicalPCI(cand)
	if err != nil {
		return "", s
	}
	return a, strings.TrimLeft(s[len(cand):], ": ")
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// deviceReason classifies what nvidia-smi says after a device's address.
func deviceReason(tail string) string {
	l := strings.ToLower(tail)
	if strings.Contains(l, "gpu is lost") || strings.Contains(l, "fallen off") {
		return snapshot.ToolGPULost
	}
	return snapshot.ToolGPUError
}
