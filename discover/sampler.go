package discover

import (
	"context"
	"errors"
	"sync"

	"kiln.dev/kiln/snapshot"
)

// NVMLSampler reads NVIDIA GPUs again and again with one loaded NVML, for
// the agent's metrics: loading and initialising NVML costs far more than
// reading a GPU, so it is done once. Like CollectNVML, it only reads.
type NVMLSampler struct {
	mu  sync.Mutex
	lib nvmlLib
}

// OpenNVMLSampler loads NVML (libPath as for CollectNVML). The error wraps
// ErrNoNVML when the library or the driver is missing.
func OpenNVMLSampler(libPath string) (*NVMLSampler, error) {
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	lib, err := openNVML(libPath)
	if err != nil {
		return nil, err
	}
	return &NVMLSampler{lib: lib}, nil
}

// errSamplerClosed is Sample's error after Close.
var errSamplerClosed = errors.New("nvml: the sampler is closed")

// Sample reads every GPU.
func (s *NVMLSampler) Sample(ctx context.Context) (*NVMLReadings, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lib == nil {
		return nil, errSamplerClosed
	}
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	return collectNVML(ctx, s.lib)
}

// Close unloads NVML.
func (s *NVMLSampler) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lib == nil {
		return nil
	}
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	err := s.lib.Shutdown()
	s.lib = nil
	return err
}

// Resample returns base with the changing readings of its NVIDIA GPUs
// (memory in use, power, clocks, temperatures, fans, utilization,
// processes, throttle reasons, ECC and row remapping counts, PCIe link and
// replays, NVLink and MIG state where NVML read them) replaced by r's. What does not change
// while the node runs (model, UUID, topology, the kernel log) stays
// base's. A GPU of base that r does not have keeps no changing reading: a
// sample says what it read, not what an earlier one did. base is not
// changed.
func Resample(base *snapshot.Snapshot, r *NVMLReadings) *snapshot.Snapshot {
	out := *base
	out.GPUs = append([]snapshot.GPU(nil), base.GPUs...)
	fresh := map[int]snapshot.GPU{}
	if r != nil {
		for i := range r.Devices {
			d := r.Devices[i]
			if d.PCIBusID != "" {
				a, err := snapshot.CanonicalPCI(d.PCIBusID)
				if err != nil {
					continue
				}
				d.PCIBusID = a
			}
			if d.PCIBusID == "" && d.UUID == "" {
				continue
			}
			g := d.gpu()
			if i := findGPU(out.GPUs, g); i >= 0 {
				fresh[i] = g
			}
		}
	}
	for i := range out.GPUs {
		g := &out.GPUs[i]
		if g.Vendor != snapshot.VendorNVIDIA {
			continue
		}
		f := fresh[i] // zero when NVML did not read it
		g.MemoryUsedBytes, g.MemoryUsedPercent = f.MemoryUsedBytes, f.MemoryUsedPercent
		if f.MemoryTotalBytes > 0 {
			g.MemoryTotalBytes = f.MemoryTotalBytes
		}
		g.Power, g.Clocks, g.Temperature, g.Fans = f.Power, f.Clocks, f.Temperature, f.Fans
		g.PerformanceState, g.UtilizationGPU, g.Processes, g.ProcessList = f.PerformanceState, f.UtilizationGPU, f.Processes, f.ProcessList
		g.ECC, g.RetiredPages, g.RemappedRows, g.Throttle = f.ECC, f.RetiredPages, f.RemappedRows, f.Throttle
		// The link's rated and host-side figures come from sysfs and stay.
		if f.PCIe != nil && g.PCIe != nil {
			l := *g.PCIe
			l.CurrentGen, l.CurrentWidth, l.Replays, l.ReplayRollovers = f.PCIe.CurrentGen, f.PCIe.CurrentWidth, f.PCIe.Replays, f.PCIe.ReplayRollovers
			l.TxKBps, l.RxKBps = f.PCIe.TxKBps, f.PCIe.RxKBps
			g.PCIe = &l
		} else {
			g.PCIe = f.PCIe
		}
		if len(f.NVLinks) > 0 {
			g.NVLinks = f.NVLinks
		}
		if f.MIG != nil {
			g.MIG = f.MIG
		}
	}
	return &out
}
