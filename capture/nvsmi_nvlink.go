package capture

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// The nvidia-smi-nvlink importer reads `nvidia-smi nvlink -s` (--status):
//
//	GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5269b708-...)
//	         Link 0: 25 GB/s
//	         Link 3: <inactive>
//
// The speed nvidia-smi prints is per direction.

const kindNVLinkS = "nvidia-smi-nvlink"

func init() {
	RegisterFile(FileImporter{
		Kind:   kindNVLinkS,
		Detect: detectNVLinkS,
		Parse: func(_ string, data []byte) (*snapshot.Snapshot, error) {
			return ParseNvidiaSMINVLink(data)
		},
	})
}

// nvlinkSGPU reads "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)".
func nvlinkSGPU(line string) (idx int, model, uuid string, ok bool) {
	rest, found := strings.CutPrefix(line, "GPU ")
	if !found {
		return 0, "", "", false
	}
	num, rest, found := strings.Cut(rest, ": ")
	if !found {
		return 0, "", "", false
	}
	idx, err := strconv.Atoi(num)
	if err != nil || idx < 0 {
		return 0, "", "", false
	}
	model = rest
	if i := strings.LastIndex(rest, " (UUID: "); i >= 0 && strings.HasSuffix(rest, ")") {
		model = rest[:i]
		uuid = strings.TrimSpace(rest[i+len(" (UUID: ") : len(rest)-1])
	}
	return idx, strings.TrimSpace(model), uuid, true
}

// nvlinkSLink reads "Link 0: 25 GB/s" or "Link 3: <inactive>".
func nvlinkSLink(t string) (link int, val string, ok bool) {
	rest, found := strings.CutPrefix(t, "Link ")
	if !found {
		return 0, "", false
	}
	num, val, found := strings.Cut(rest, ":")
	if !found {
		return 0, "", false
	}
	link, err := strconv.Atoi(num)
	if err != nil || link < 0 {
		return 0, "", false
	}
	return link, strings.TrimSpace(val), true
}

// detectNVLinkS recognises a GPU line with a UUID followed by an indented
// "Link N:" line. `nvidia-smi -L` prints the GPU lines alone and is not
// claimed.
func detectNVLinkS(_ string, data []byte) bool {
	if len(data) > 64<<10 {
		data = data[:64<<10]
	}
	gpu := false
	for raw := range bytes.Lines(data) {
		line := strings.TrimRight(string(raw), "\r\n")
		if strings.TrimSpace(line) == "" {
			continue
		}
		if !gpu {
			_, _, uuid, ok := nvlinkSGPU(line)
			if !ok || !strings.HasPrefix(uuid, "GPU-") {
				return false
			}
			gpu = true
			continue
		}
		if strings.HasPrefix(line, "NVML: Unable to retrieve NVLink") {
			return true
		}
		if line[0] != ' ' && line[0] != '\t' {
			return false
		}
		_, _, ok := nvlinkSLink(strings.TrimSpace(line))
		return ok
	}
	return false
}

// ParseNvidiaSMINVLink reads `nvidia-smi nvlink -s`. It fills one GPU per
// "GPU n:" line (Index, Model, UUID) with its NVLinks: state active with the
// printed per-direction speed, or inactive/disabled.
func ParseNvidiaSMINVLink(data []byte) (*snapshot.Snapshot, error) {
	snap := snapshot.New()
	cur := -1
	lineNo := 0
	for raw := range strings.Lines(string(data)) {
		lineNo++
		line := strings.TrimRight(raw, "\r\n")
		t := strings.TrimSpace(line)
		if t == "" {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' && !strings.HasPrefix(line, "NVML: ") {
			idx, model, uuid, ok := nvlinkSGPU(line)
			if !strings.HasSuffix(raw, "\n") && uuid == "" && cur >= 0 {
				// The file's last line, cut short in the copy.
				snap.Notes = append(snap.Notes, snapshot.Note{Source: kindNVLinkS, Message: fmt.Sprintf("line %d is cut short and was not read", lineNo)})
				break
			}
			if !ok {
				return nil, fmt.Errorf("nvidia-smi nvlink -s: line %d: cannot read %q as a GPU line (\"GPU 0: <name> (UUID: GPU-...)\")", lineNo, lspciClip(line))
			}
			snap.GPUs = append(snap.GPUs, snapshot.GPU{Index: idx, Vendor: snapshot.VendorNVIDIA, Model: model, UUID: uuid})
			cur = len(snap.GPUs) - 1
			continue
		}
		if cur < 0 {
			return nil, fmt.Errorf("nvidia-smi nvlink -s: line %d: %q comes before any GPU line", lineNo, lspciClip(t))
		}
		link, val, ok := nvlinkSLink(t)
		if !ok {
			// Messages such as "NVML: Unable to retrieve NVLink information as all links are inActive".
			snap.Notes = append(snap.Notes, snapshot.Note{Source: kindNVLinkS, Message: fmt.Sprintf("GPU %d: %s", snap.GPUs[cur].Index, t)})
			continue
		}
		nl, err := nvlinkSState(link, val)
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi nvlink -s: line %d: %w", lineNo, err)
		}
		snap.GPUs[cur].NVLinks = append(snap.GPUs[cur].NVLinks, nl)
	}
	if len(snap.GPUs) == 0 {
		return nil, fmt.Errorf("nvidia-smi nvlink -s: no GPU line found")
	}
	return snap, nil
}

// nvlinkSState reads a link's value: "25 GB/s", "26.562 GB/s", "<inactive>".
func nvlinkSState(link int, val string) (snapshot.NVLink, error) {
	nl := snapshot.NVLink{Link: link}
	low := strings.ToLower(strings.Trim(val, "<> "))
	switch {
	case strings.Contains(low, "inactive"):
		nl.State = "inactive"
		return nl, nil
	case strings.Contains(low, "disabled"):
		nl.State = "disabled"
		return nl, nil
	}
	num, unit, ok := strings.Cut(val, " ")
	if ok && strings.TrimSpace(unit) == "GB/s" {
		v, err := strconv.ParseFloat(num, 64)
		if err == nil && v >= 0 && v < 1e6 {
			nl.State = "active"
			nl.SpeedGBps = v
			return nl, nil
		}
	}
	return nl, fmt.Errorf("link %d: cannot read %q as a link speed (\"25 GB/s\") or state (\"<inactive>\")", link, val)
}
