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
	// gpm holds, per GPU (by UUID), the last GPM sample and its device's
	// monitor: the next sample's activity is measured from it.
	gpm map[string]gpmState
}

type gpmState struct {
	m    nvmlGPM
	last gpmSample
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
	r, err := collectNVML(ctx, s.lib)
	if err != nil {
		return nil, err
	}
	s.sampleGPM(r)
	return r, nil
}

// sampleGPM takes a GPM sample of every GPU that has GPM and sets the
// activity since the previous one; the first sample of a GPU sets none.
func (s *NVMLSampler) sampleGPM(r *NVMLReadings) {
	if s.gpm == nil {
		s.gpm = map[string]gpmState{}
	}
	seen := map[string]bool{}
	for i := range r.Devices {
		d := &r.Devices[i]
		if d.UUID == "" {
			continue
		}
		dev, err := s.lib.Device(d.Index)
		if err != nil {
			continue
		}
		st, ok := s.gpm[d.UUID]
		if !ok {
			m, err := dev.GPM()
			if err != nil {
				continue // no GPM on this GPU: kiln_gpu_metric_supported says so
			}
			st = gpmState{m: m}
		}
		cur, err := st.m.Sample()
		if err != nil {
			continue
		}
		seen[d.UUID] = true
		if st.last != nil {
			if a, err := st.m.Between(st.last, cur); err == nil {
				d.Activity = &a
			}
			st.m.Free(st.last)
		}
		st.last = cur
		s.gpm[d.UUID] = st
	}
	for uuid, st := range s.gpm {
		if !seen[uuid] {
			if st.last != nil {
				st.m.Free(st.last)
			}
			delete(s.gpm, uuid) // gone, or its sample failed: start again
		}
	}
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
	for _, st := range s.gpm {
		if st.last != nil {
			st.m.Free(st.last)
		}
	}
	s.gpm = nil
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
		g.Activity, g.ProcessesRead = f.Activity, f.ProcessesRead
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
