package capture

// nvidia-smi -q -x: the <nvidia_smi_log> XML report. Schemas v11 to v13
// differ in a few names (clocks_throttle_reasons became clocks_event_reasons,
// power_readings became gpu_power_readings, power_draw was split into
// average and instant draws); each struct below lists every spelling.

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/unwrap"
)

const kindNvsmiXML = "nvidia-smi-q-xml"

func init() {
	RegisterFile(FileImporter{
		Kind:   kindNvsmiXML,
		Detect: detectNvsmiXML,
		Parse:  func(_ string, data []byte) (*snapshot.Snapshot, error) { return ParseNvidiaSMIXML(data) },
	})
}

func detectNvsmiXML(_ string, data []byte) bool {
	return bytes.Contains(data, []byte("<nvidia_smi_log"))
}

// nvsmiXText is an element's text, with whether the element was there at all.
type nvsmiXText struct {
	set bool
	s   string
}

func (x *nvsmiXText) UnmarshalXML(d *xml.Decoder, start xml.StartElement) error {
	var s string
	if err := d.DecodeElement(&s, &start); err != nil {
		return err
	}
	x.set, x.s = true, strings.TrimSpace(s)
	return nil
}

func (x nvsmiXText) val(tag string) nvVal {
	if !x.set {
		return nvVal{}
	}
	return nvVal{s: x.s, at: "<" + tag + ">"}
}

type nvsmiXLog struct {
	XMLName       xml.Name    `xml:"nvidia_smi_log"`
	Timestamp     nvsmiXText  `xml:"timestamp"`
	DriverVersion nvsmiXText  `xml:"driver_version"`
	CUDAVersion   nvsmiXText  `xml:"cuda_version"`
	AttachedGPUs  nvsmiXText  `xml:"attached_gpus"`
	GPUs          []nvsmiXGPU `xml:"gpu"`
}

type nvsmiXGPU struct {
	ID           string     `xml:"id,attr"`
	ProductName  nvsmiXText `xml:"product_name"`
	Architecture nvsmiXText `xml:"product_architecture"`
	Persistence  nvsmiXText `xml:"persistence_mode"`
	MIGMode      struct {
		Current nvsmiXText `xml:"current_mig"`
		Pending nvsmiXText `xml:"pending_mig"`
	} `xml:"mig_mode"`
	MIGDevices  []nvsmiXMIG `xml:"mig_devices>mig_device"`
	DriverModel nvsmiXText  `xml:"driver_model>current_dm"`
	Serial      nvsmiXText  `xml:"serial"`
	UUID        nvsmiXText  `xml:"uuid"`
	VBIOS       nvsmiXText  `xml:"vbios_version"`
	BoardPart   nvsmiXText  `xml:"board_part_number"`
	GPUPart     nvsmiXText  `xml:"gpu_part_number"`
	InfoROM     struct {
		Image nvsmiXText `xml:"img_version"`
		OEM   nvsmiXText `xml:"oem_object"`
		ECC   nvsmiXText `xml:"ecc_object"`
		Power nvsmiXText `xml:"pwr_object"`
	} `xml:"inforom_version"`
	Virtualization   nvsmiXText     `xml:"gpu_virtualization_mode>virtualization_mode"`
	PCI              nvsmiXPCI      `xml:"pci"`
	FanSpeed         []nvsmiXText   `xml:"fan_speed"`
	PerformanceState nvsmiXText     `xml:"performance_state"`
	ThrottleReasons  nvsmiXElements `xml:"clocks_throttle_reasons"`
	EventReasons     nvsmiXElements `xml:"clocks_event_reasons"`
	EventCounters    nvsmiXElements `xml:"clocks_event_reasons_counters"`
	FB               struct {
		Total nvsmiXText `xml:"total"`
		Used  nvsmiXText `xml:"used"`
	} `xml:"fb_memory_usage"`
	ComputeMode nvsmiXText `xml:"compute_mode"`
	UtilGPU     nvsmiXText `xml:"utilization>gpu_util"`
	ECCMode     struct {
		Current nvsmiXText `xml:"current_ecc"`
		Pending nvsmiXText `xml:"pending_ecc"`
	} `xml:"ecc_mode"`
	ECCErrors *struct {
		Volatile  nvsmiXECC `xml:"volatile"`
		Aggregate nvsmiXECC `xml:"aggregate"`
	} `xml:"ecc_errors"`
	RetiredPages struct {
		SingleBit         nvsmiXText `xml:"multiple_single_bit_retirement>retired_count"`
		DoubleBit         nvsmiXText `xml:"double_bit_retirement>retired_count"`
		PendingBlacklist  nvsmiXText `xml:"pending_blacklist"`
		PendingRetirement nvsmiXText `xml:"pending_retirement"`
	} `xml:"retired_pages"`
	RemappedRows struct {
		Correctable   nvsmiXText `xml:"remapped_row_corr"`
		Uncorrectable nvsmiXText `xml:"remapped_row_unc"`
		Pending       nvsmiXText `xml:"remapped_row_pending"`
		Failure       nvsmiXText `xml:"remapped_row_failure"`
	} `xml:"remapped_rows"`
	// The *_tlimit_threshold forms are margins to a limit, not thresholds,
	// and are not read as thresholds.
	Temperature struct {
		GPU      nvsmiXText `xml:"gpu_temp"`
		Memory   nvsmiXText `xml:"memory_temp"`
		Shutdown nvsmiXText `xml:"gpu_temp_max_threshold"`
		Slowdown nvsmiXText `xml:"gpu_temp_slow_threshold"`
		MaxOp    nvsmiXText `xml:"gpu_temp_max_gpu_threshold"`
		MemMax   nvsmiXText `xml:"gpu_temp_max_mem_threshold"`
	} `xml:"temperature"`
	PowerV11  nvsmiXPower  `xml:"power_readings"`
	Power     nvsmiXPower  `xml:"gpu_power_readings"`
	Clocks    nvsmiXClocks `xml:"clocks"`
	MaxClocks nvsmiXClocks `xml:"max_clocks"`
	Fabric    struct {
		State  nvsmiXText `xml:"state"`
		Status nvsmiXText `xml:"status"`
	} `xml:"fabric"`
	// Processes is nil when the section is missing; its text is "N/A"
	// (or an error) where the tool could not list them.
	Processes *struct {
		Text string     `xml:",chardata"`
		Info []struct{} `xml:"process_info"`
	} `xml:"processes"`
}

type nvsmiXMIG struct {
	GPUInstance     nvsmiXText `xml:"gpu_instance_id"`
	ComputeInstance nvsmiXText `xml:"compute_instance_id"`
	SMs             nvsmiXText `xml:"device_attributes>shared>multiprocessor_count"`
	MemTotal        nvsmiXText `xml:"fb_memory_usage>total"`
	UUID            nvsmiXText `xml:"uuid"`
}

type nvsmiXPCI struct {
	BusID       nvsmiXText `xml:"pci_bus_id"`
	DeviceID    nvsmiXText `xml:"pci_device_id"`
	SubsystemID nvsmiXText `xml:"pci_sub_system_id"`
	Gen         struct {
		Max     nvsmiXText `xml:"max_link_gen"`
		Current nvsmiXText `xml:"current_link_gen"`
		DevCur  nvsmiXText `xml:"device_current_link_gen"`
		DevMax  nvsmiXText `xml:"max_device_link_gen"`
		HostMax nvsmiXText `xml:"max_host_link_gen"`
	} `xml:"pci_gpu_link_info>pcie_gen"`
	Width struct {
		Max     nvsmiXText `xml:"max_link_width"`
		Current nvsmiXText `xml:"current_link_width"`
	} `xml:"pci_gpu_link_info>link_widths"`
	Replays   nvsmiXText `xml:"replay_counter"`
	Rollovers nvsmiXText `xml:"replay_rollover_counter"`
	Tx        nvsmiXText `xml:"tx_util"`
	Rx        nvsmiXText `xml:"rx_util"`
}

type nvsmiXECC struct {
	SRAMCorrectable   nvsmiXText `xml:"sram_correctable"`
	SRAMUncorrectable nvsmiXText `xml:"sram_uncorrectable"`
	SRAMUncParity     nvsmiXText `xml:"sram_uncorrectable_parity"`
	SRAMUncSECDED     nvsmiXText `xml:"sram_uncorrectable_secded"`
	DRAMCorrectable   nvsmiXText `xml:"dram_correctable"`
	DRAMUncorrectable nvsmiXText `xml:"dram_uncorrectable"`
	SingleBitTotal    nvsmiXText `xml:"single_bit>total"`
	DoubleBitTotal    nvsmiXText `xml:"double_bit>total"`
}

type nvsmiXPower struct {
	Draw         nvsmiXText `xml:"power_draw"`
	AverageDraw  nvsmiXText `xml:"average_power_draw"`
	InstantDraw  nvsmiXText `xml:"instant_power_draw"`
	Limit        nvsmiXText `xml:"power_limit"`
	CurrentLimit nvsmiXText `xml:"current_power_limit"`
	Enforced     nvsmiXText `xml:"enforced_power_limit"`
	Default      nvsmiXText `xml:"default_power_limit"`
	Min          nvsmiXText `xml:"min_power_limit"`
	Max          nvsmiXText `xml:"max_power_limit"`
}

type nvsmiXClocks struct {
	Graphics nvsmiXText `xml:"graphics_clock"`
	SM       nvsmiXText `xml:"sm_clock"`
	Memory   nvsmiXText `xml:"mem_clock"`
}

// nvsmiXElements keeps every child element, for lists whose members change
// between schemas (clock-event reasons).
type nvsmiXElements struct {
	Items []struct {
		XMLName xml.Name
		Value   string `xml:",chardata"`
	} `xml:",any"`
}

// ParseNvidiaSMIXML reads `nvidia-smi -q -x` output (schemas v11 to v13):
// driver and CUDA versions, attached_gpus (as a Claim: a file may hold fewer
// <gpu> elements than it claims, and only the elements are listed as GPUs),
// and for every <gpu> the same fields as ParseNvidiaSMIQ, with clock-event
// reason counters in microseconds where the schema gives them.
func ParseNvidiaSMIXML(data []byte) (*snapshot.Snapshot, error) {
	body, outside := splitNvsmiXML(data)
	var log nvsmiXLog
	cut := false
	if err := xml.Unmarshal(body, &log); err != nil {
		mended, ok := unwrap.CloseXML(body)
		log = nvsmiXLog{} // the failed pass filled part of it
		if !ok || xml.Unmarshal(mended, &log) != nil {
			return nil, fmt.Errorf("not a well-formed nvidia-smi -q -x report: %w", err)
		}
		cut = true
	}
	s := snapshot.New()
	if cut {
		s.Notes = append(s.Notes, snapshot.Note{Source: kindNvsmiXML, Message: "the report is cut short; read up to its last complete element"})
	}
	s.GPUs = []snapshot.GPU{}
	notes := &nvsmiNotes{source: kindNvsmiXML}
	var raws []*nvRaw
	for i := range log.GPUs {
		r := nvsmiXMLRaw(&log.GPUs[i])
		notes.gpu = ""
		g, err := r.build(len(s.GPUs), notes)
		if err != nil {
			return nil, fmt.Errorf("<gpu> element %d: %w", i+1, err)
		}
		s.GPUs = append(s.GPUs, g)
		raws = append(raws, r)
	}
	notes.gpu = ""
	nvsmiNodeLevel(s, kindNvsmiXML, log.DriverVersion.val("driver_version"), log.CUDAVersion.val("cuda_version"),
		log.AttachedGPUs.val("attached_gpus"), log.Timestamp.val("timestamp"))
	s.Drivers.FabricManager = nvsmiFabric(raws)
	s.Notes = append(s.Notes, notes.notes...)
	nvsmiWarnings(s, kindNvsmiXML, outside)
	s.Events = append(s.Events, scanToolErrors([]byte(strings.Join(outside, "\n")), kindNvsmiXML)...)
	return s, nil
}

// splitNvsmiXML separates the XML document from lines printed around it
// (WARNING lines go to stdout before the document).
func splitNvsmiXML(data []byte) (body []byte, outside []string) {
	start := bytes.Index(data, []byte("<nvidia_smi_log"))
	if start < 0 {
		return data, nil
	}
	for _, lead := range [][]byte{[]byte("<?xml"), []byte("<!DOCTYPE")} {
		if i := bytes.Index(data[:start], lead); i >= 0 && i < start {
			start = i
			break
		}
	}
	end := len(data)
	const closing = "</nvidia_smi_log>"
	if i := bytes.LastIndex(data, []byte(closing)); i >= start {
		end = i + len(closing)
	}
	outside = append(strings.Split(string(data[:start]), "\n"), strings.Split(string(data[end:]), "\n")...)
	return data[start:end], outside
}

func nvsmiXMLRaw(x *nvsmiXGPU) *nvRaw {
	r := &nvRaw{}
	r.busID = x.PCI.BusID.val("pci_bus_id")
	if !r.busID.known() && x.ID != "" {
		r.busID = nvVal{s: x.ID, at: "<gpu id>"}
	}
	r.product = x.ProductName.val("product_name")
	r.arch = x.Architecture.val("product_architecture")
	r.deviceID = x.PCI.DeviceID.val("pci_device_id")
	r.subsysID = x.PCI.SubsystemID.val("pci_sub_system_id")
	r.uuid = x.UUID.val("uuid")
	r.serial = x.Serial.val("serial")
	r.boardPart = x.BoardPart.val("board_part_number")
	r.gpuPartAsBoard = x.GPUPart.val("gpu_part_number")
	r.vbios = x.VBIOS.val("vbios_version")
	r.infoImage = x.InfoROM.Image.val("img_version")
	r.infoOEM = x.InfoROM.OEM.val("oem_object")
	r.infoECC = x.InfoROM.ECC.val("ecc_object")
	r.infoPwr = x.InfoROM.Power.val("pwr_object")
	r.fbTotal = x.FB.Total.val("fb_memory_usage/total")
	r.fbUsed = x.FB.Used.val("fb_memory_usage/used")
	r.computeMode = x.ComputeMode.val("compute_mode")
	r.persistence = x.Persistence.val("persistence_mode")
	r.driverModel = x.DriverModel.val("current_dm")
	r.virtualization = x.Virtualization.val("virtualization_mode")
	r.pstate = x.PerformanceState.val("performance_state")
	r.utilGPU = x.UtilGPU.val("gpu_util")

	pw := x.Power
	if !pw.Draw.set && !pw.AverageDraw.set && !pw.CurrentLimit.set {
		pw = x.PowerV11
	}
	r.powerDraw = nvsmiFirstKnown(pw.Draw.val("power_draw"), pw.AverageDraw.val("average_power_draw"), pw.InstantDraw.val("instant_power_draw"))
	r.powerLimit = nvsmiFirstKnown(pw.CurrentLimit.val("current_power_limit"), pw.Limit.val("power_limit"))
	r.powerEnforced = pw.Enforced.val("enforced_power_limit")
	r.powerDefault = pw.Default.val("default_power_limit")
	r.powerMin = pw.Min.val("min_power_limit")
	r.powerMax = pw.Max.val("max_power_limit")

	r.clkGraphics = x.Clocks.Graphics.val("clocks/graphics_clock")
	r.clkSM = x.Clocks.SM.val("clocks/sm_clock")
	r.clkMem = x.Clocks.Memory.val("clocks/mem_clock")
	r.maxGraphics = x.MaxClocks.Graphics.val("max_clocks/graphics_clock")
	r.maxSM = x.MaxClocks.SM.val("max_clocks/sm_clock")
	r.maxMem = x.MaxClocks.Memory.val("max_clocks/mem_clock")

	t := x.Temperature
	r.tempGPU = t.GPU.val("gpu_temp")
	r.tempMem = t.Memory.val("memory_temp")
	r.tempShutdown = t.Shutdown.val("gpu_temp_max_threshold")
	r.tempSlowdown = t.Slowdown.val("gpu_temp_slow_threshold")
	r.tempMaxOp = t.MaxOp.val("gpu_temp_max_gpu_threshold")
	r.tempMemMax = t.MemMax.val("gpu_temp_max_mem_threshold")

	for _, f := range x.FanSpeed {
		r.fans = append(r.fans, f.val("fan_speed"))
	}

	r.eccCurrent = x.ECCMode.Current.val("current_ecc")
	r.eccPending = x.ECCMode.Pending.val("pending_ecc")
	r.eccSeen = x.ECCMode.Current.set || x.ECCMode.Pending.set || x.ECCErrors != nil
	if e := x.ECCErrors; e != nil {
		r.eccVolCorr, r.eccVolUnc = e.Volatile.counts()
		r.eccAggCorr, r.eccAggUnc = e.Aggregate.counts()
	}
	rp := x.RetiredPages
	r.retiredSBE = rp.SingleBit.val("multiple_single_bit_retirement/retired_count")
	r.retiredDBE = rp.DoubleBit.val("double_bit_retirement/retired_count")
	r.retiredPending = nvsmiFirstKnown(rp.PendingBlacklist.val("pending_blacklist"), rp.PendingRetirement.val("pending_retirement"))
	rr := x.RemappedRows
	r.remapCorr = rr.Correctable.val("remapped_row_corr")
	r.remapUnc = rr.Uncorrectable.val("remapped_row_unc")
	r.remapPending = rr.Pending.val("remapped_row_pending")
	r.remapFailure = rr.Failure.val("remapped_row_failure")

	for _, list := range []nvsmiXElements{x.ThrottleReasons, x.EventReasons} {
		for _, it := range list.Items {
			name := it.XMLName.Local
			for _, p := range []string{"clocks_event_reason_", "clocks_throttle_reason_"} {
				name = strings.TrimPrefix(name, p)
			}
			r.reasons = append(r.reasons, nvReason{label: name, value: nvVal{s: strings.TrimSpace(it.Value), at: "<" + it.XMLName.Local + ">"}})
		}
	}
	for _, it := range x.EventCounters.Items {
		name := strings.TrimPrefix(it.XMLName.Local, "clocks_event_reasons_counters_")
		r.counters = append(r.counters, nvReason{label: name, value: nvVal{s: strings.TrimSpace(it.Value), at: "<" + it.XMLName.Local + ">"}})
	}

	p := x.PCI
	r.genMax = p.Gen.Max.val("max_link_gen")
	r.genCur = p.Gen.Current.val("current_link_gen")
	r.genDevMax = p.Gen.DevMax.val("max_device_link_gen")
	r.genDevCur = p.Gen.DevCur.val("device_current_link_gen")
	r.genHostMax = p.Gen.HostMax.val("max_host_link_gen")
	r.widthMax = p.Width.Max.val("max_link_width")
	r.widthCur = p.Width.Current.val("current_link_width")
	r.replays = p.Replays.val("replay_counter")
	r.rollovers = p.Rollovers.val("replay_rollover_counter")
	r.txUtil = p.Tx.val("tx_util")
	r.rxUtil = p.Rx.val("rx_util")

	r.migCurrent = x.MIGMode.Current.val("current_mig")
	r.migPending = x.MIGMode.Pending.val("pending_mig")
	for _, d := range x.MIGDevices {
		r.migDevices = append(r.migDevices, nvMIG{
			gi:       d.GPUInstance.val("gpu_instance_id"),
			ci:       d.ComputeInstance.val("compute_instance_id"),
			sms:      d.SMs.val("multiprocessor_count"),
			memTotal: d.MemTotal.val("mig_device/fb_memory_usage/total"),
			uuid:     d.UUID.val("mig_device/uuid"),
		})
	}
	r.fabricState = x.Fabric.State.val("fabric/state")
	r.fabricStatus = x.Fabric.Status.val("fabric/status")
	if p := x.Processes; p != nil {
		r.processes = len(p.Info)
		t := strings.TrimSpace(p.Text)
		r.processesRead = len(p.Info) > 0 || t == "" || t == "None"
	}
	return r
}

func (e nvsmiXECC) counts() (corr, unc []nvVal) {
	add := func(list []nvVal, x nvsmiXText, tag string) []nvVal {
		if x.set {
			list = append(list, x.val(tag))
		}
		return list
	}
	corr = add(corr, e.SRAMCorrectable, "sram_correctable")
	corr = add(corr, e.DRAMCorrectable, "dram_correctable")
	corr = add(corr, e.SingleBitTotal, "single_bit/total")
	unc = add(unc, e.SRAMUncorrectable, "sram_uncorrectable")
	unc = add(unc, e.SRAMUncParity, "sram_uncorrectable_parity")
	unc = add(unc, e.SRAMUncSECDED, "sram_uncorrectable_secded")
	unc = add(unc, e.DRAMUncorrectable, "dram_uncorrectable")
	unc = add(unc, e.DoubleBitTotal, "double_bit/total")
	return corr, unc
}
