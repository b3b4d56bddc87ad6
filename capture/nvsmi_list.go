package capture

import (
	"bytes"
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// `nvidia-smi -L`: one line per GPU ("GPU 0: NVIDIA H100 80GB HBM3 (UUID:
// GPU-...)") and, under a GPU in MIG mode, one per MIG device ("  MIG
// 3g.40gb Device 0: (UUID: MIG-...)"). It names the GPUs the driver sees,
// with their UUIDs, which ties it to other captures of the machine.
func init() {
	RegisterFile(FileImporter{Kind: "nvidia-smi-list", Detect: detectNvsmiList, Parse: parseNvsmiList})
}

func detectNvsmiList(_ string, data []byte) bool {
	gpus, other := 0, 0
	forEachLine(data[:min(len(data), detectHead)], func(line []byte) bool {
		b := bytes.TrimSpace(line)
		if len(b) == 0 {
			return true
		}
		// Every line is a GPU, a MIG device or a failed GPU's message;
		// the first other line ends the look.
		if !bytes.HasPrefix(b, []byte("GPU ")) && !bytes.HasPrefix(b, []byte("MIG ")) && !mayHoldToolError(b) {
			other++
			return false
		}
		t := string(b)
		switch {
		case isListGPU(t):
			gpus++
		case isListMIG(t) || len(scanToolErrors(b, "")) > 0:
		default:
			other++
		}
		return other == 0 && gpus < 400
	})
	return gpus > 0 && other == 0
}

func isListGPU(t string) bool {
	_, _, uuid, ok := nvlinkSGPU(t)
	return ok && strings.HasPrefix(uuid, "GPU-")
}

// isListMIG reads "MIG 3g.40gb Device 0: (UUID: MIG-...)" and the older
// "MIG 1g.5gb Device 0: (UUID: MIG-GPU-.../7/0)".
func isListMIG(t string) bool {
	return strings.HasPrefix(t, "MIG ") && strings.Contains(t, "Device ") && strings.Contains(t, "(UUID: MIG-")
}

func parseNvsmiList(_ string, data []byte) (*snapshot.Snapshot, error) {
	s := snapshot.New()
	migs := map[int][]string{}
	forEachLine(data, func(line []byte) bool {
		t := strings.TrimSpace(string(line))
		if isListGPU(t) {
			idx, model, uuid, _ := nvlinkSGPU(t)
			s.GPUs = append(s.GPUs, snapshot.GPU{Index: idx, Vendor: snapshot.VendorNVIDIA, Model: model, UUID: uuid})
			return true
		}
		if isListMIG(t) && len(s.GPUs) > 0 {
			// The list names a MIG device's profile but not its GPU
			// instance: MIG is on, the layout is left to captures that
			// give it (nvidia-smi -q).
			g := &s.GPUs[len(s.GPUs)-1]
			g.MIG = &snapshot.MIG{Enabled: true}
			migs[len(s.GPUs)-1] = append(migs[len(s.GPUs)-1], strings.Fields(t)[1])
		}
		return true
	})
	for i, ps := range migs {
		s.Notes = append(s.Notes, snapshot.Note{Source: "nvidia-smi-list",
			Message: fmt.Sprintf("GPU %d has %d MIG devices: %s", s.GPUs[i].Index, len(ps), strings.Join(ps, ", "))})
	}
	s.Events = scanToolErrors(data, "nvidia-smi-list")
	if len(s.GPUs) == 0 {
		return nil, fmt.Errorf("nvidia-smi -L: no GPU line")
	}
	return s, nil
}
