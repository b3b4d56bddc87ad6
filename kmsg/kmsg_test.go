package kmsg

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/snapshot"
)

const captures = "../testdata/captures/dmesg/"

func parseFile(t *testing.T, name string) *Log {
	t.Helper()
	f, err := os.Open(captures + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := Parse(f)
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return l
}

func parseString(t *testing.T, s string) *Log {
	t.Helper()
	l, err := Parse(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type evKey struct {
	kind   string
	code   int
	device string
}

func count(evs []snapshot.Event) map[evKey]int {
	m := map[evKey]int{}
	for _, e := range evs {
		m[evKey{e.Kind, e.Code, e.Device}]++
	}
	return m
}

func TestXid119GSPTimeout(t *testing.T) {
	l := parseFile(t, "h100-xid119-gsp-rpc-timeout.log")
	if len(l.Events) != 5 {
		for _, e := range l.Events {
			t.Logf("%+v", e)
		}
		t.Fatalf("got %d events, want 5 Xid 119 (RPC history dumps must not make events)", len(l.Events))
	}
	for _, e := range l.Events {
		if e.Kind != snapshot.EventXid || e.Code != 119 || e.Device != "0000:9b:00.0" {
			t.Errorf("event %+v: want xid 119 on 0000:9b:00.0", e)
		}
	}
	procs := []string{"nvidia-smi", "nvidia-smi", "nvidia-smi", "cache_mgr_main", "gpud"}
	pids := []int{2024380, 2024380, 2024380, 1263500, 1240590}
	for i, e := range l.Events {
		if e.Process != procs[i] || e.PID != pids[i] {
			t.Errorf("event %d: process %q pid %d, want %q %d", i, e.Process, e.PID, procs[i], pids[i])
		}
	}
	first := l.Events[0]
	if want := time.Date(2025, 2, 23, 16, 24, 18, 0, time.UTC); !first.Time.Equal(want) {
		t.Errorf("first event time %v, want %v", first.Time, want)
	}
	if !strings.Contains(first.Message, "RPC history (CPU -> GSP)") || !strings.Contains(first.Message, "UCODE_LIBOS_PRINT") {
		t.Errorf("first event does not hold its RPC history dump:\n%s", first.Message)
	}
	if strings.Contains(first.Message, "Call Trace") {
		t.Errorf("the kernel stack trace is not an NVRM detail line:\n%s", first.Message)
	}
	if !strings.Contains(l.Events[2].Message, "The GPU likely needs to be reset") {
		t.Errorf("third event lacks the rate-limit note that followed it:\n%s", l.Events[2].Message)
	}
	if len(l.Devices) != 1 {
		t.Fatalf("devices %+v, want GPU 0000:9b:00.0", l.Devices)
	}
	d := l.Devices[0]
	if d.Address != "0000:9b:00.0" || d.UUID != "GPU-509665ad-b600-ac93-3616-d754b23d636d" || d.Serial != "1650124014249" {
		t.Errorf("device %+v", d)
	}
	if l.Format != "dmesg-ctime" {
		t.Errorf("format %q, want dmesg-ctime", l.Format)
	}
}

func TestXid13And109(t *testing.T) {
	l := parseFile(t, "h100-xid13-xid109-ctxsw-timeout.log")
	got := count(l.Events)
	want := map[evKey]int{
		{snapshot.EventXid, 13, "0000:cb:00.0"}:  3,
		{snapshot.EventXid, 109, "0000:cb:00.0"}: 1,
	}
	if len(got) != len(want) {
		t.Errorf("events %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%v: %d events, want %d", k, got[k], n)
		}
	}
	for _, e := range l.Events[:3] {
		if e.PID != 0 || e.Process != "" {
			t.Errorf("pid='<unknown>' must stay unknown, got pid %d process %q", e.PID, e.Process)
		}
	}
	if e := l.Events[3]; e.PID != 1797828 || e.Process != "pt_main_thread" || !strings.Contains(e.Message, "CTX SWITCH TIMEOUT") {
		t.Errorf("Xid 109 event %+v", e)
	}
}

func TestFallenOffBusWithoutXid(t *testing.T) {
	l := parseFile(t, "nvrm-fallen-off-bus-no-xid.log")
	if len(l.Events) != 2 {
		t.Fatalf("events %+v, want fallen-off-bus and probe-failed", l.Events)
	}
	e := l.Events[0]
	if e.Kind != snapshot.EventFallenOffBus || e.Device != "0000:b3:00.0" || e.Code != 0 || e.RawTime != "1843.308145" {
		t.Errorf("event %+v, want fallen-off-bus on 0000:b3:00.0 at 1843.308145 without code", e)
	}
	if want := "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and is not responding to commands."; e.Message != want {
		t.Errorf("message %q, want the three lines joined: %q", e.Message, want)
	}
	if p := l.Events[1]; p.Kind != snapshot.EventProbeFailed || !strings.Contains(p.Message, "failed for 1 device(s)") {
		t.Errorf("event %+v, want probe-failed", p)
	}
	if l.NVIDIA == nil || l.NVIDIA.Version != "570.158.01" || !l.NVIDIA.Open {
		t.Errorf("driver %+v, want 570.158.01 open", l.NVIDIA)
	}
	if len(l.Devices) != 1 || l.Devices[0].DeviceID != "26b5" || l.Devices[0].VendorID != "10de" {
		t.Errorf("devices %+v, want 0000:b3:00.0 10de:26b5", l.Devices)
	}
}

func TestHGXBootLog(t *testing.T) {
	l := parseFile(t, "h100-hgx-boot-dmesg-iso.log")
	if len(l.Events) != 0 {
		t.Errorf("a clean boot log gave events: %+v", l.Events)
	}
	if l.NVIDIA == nil || l.NVIDIA.Version != "550.90.07" || l.NVIDIA.Open {
		t.Errorf("driver %+v, want 550.90.07 proprietary", l.NVIDIA)
	}
	var switches []string
	for _, p := range l.PCI {
		if p.VendorID == "10de" && p.DeviceID == "22a3" {
			switches = append(switches, p.Address+"/"+p.Class)
		}
	}
	if want := "0000:83:00.0/068000 0000:84:00.0/068000 0000:85:00.0/068000 0000:86:00.0/068000"; strings.Join(switches, " ") != want {
		t.Errorf("NVSwitches %v, want %s", switches, want)
	}
	var drm []string
	for _, d := range l.Devices {
		if d.Driver == "nvidia-drm" {
			drm = append(drm, d.Address)
		}
	}
	if want := "0000:19:00.0 0000:3b:00.0 0000:4c:00.0 0000:5d:00.0 0000:9b:00.0 0000:bb:00.0 0000:cb:00.0 0000:db:00.0"; strings.Join(drm, " ") != want {
		t.Errorf("nvidia-drm devices %v, want %s", drm, want)
	}
	if l.Format != "dmesg-iso" || l.Lines < 2381 {
		t.Errorf("format %q lines %d", l.Format, l.Lines)
	}
}

// The same reports in the other forms admins collect.
func TestFormats(t *testing.T) {
	tests := []struct {
		name, in   string
		kind       string
		code       int
		device     string
		source     string
		raw        string
		time       time.Time
		msgHas     string
		wantEvents int
	}{
		{
			name: "journalctl -k",
			in:   "Feb 27 15:10:02 gpu-node-7 kernel: NVRM: Xid (PCI:0000:9b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n",
			kind: snapshot.EventXid, code: 79, device: "0000:9b:00.0", source: "journal", raw: "Feb 27 15:10:02",
			msgHas: "fallen off the bus", wantEvents: 1,
		},
		{
			name: "journalctl -k, fallen off in three records",
			in: "Feb 27 15:10:02 n1 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0\n" +
				"Feb 27 15:10:02 n1 kernel: NVRM: (PCI ID: 10de:26b5) installed in this system has\n" +
				"Feb 27 15:10:02 n1 kernel: NVRM: fallen off the bus and is not responding to commands.\n",
			kind: snapshot.EventFallenOffBus, device: "0000:b3:00.0", source: "journal", raw: "Feb 27 15:10:02",
			msgHas: "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off", wantEvents: 1,
		},
		{
			name: "dmesg iso, fallen off in three records",
			in: "kern  :err   : 2025-01-17T15:36:15,345059+00:00 NVRM: The NVIDIA GPU 0000:b3:00.0\n" +
				"kern  :err   : 2025-01-17T15:36:15,345060+00:00 NVRM: (PCI ID: 10de:26b5) installed in this system has\n" +
				"kern  :err   : 2025-01-17T15:36:15,345061+00:00 NVRM: fallen off the bus and is not responding to commands.\n",
			kind: snapshot.EventFallenOffBus, device: "0000:b3:00.0", source: "dmesg",
			time:   time.Date(2025, 1, 17, 15, 36, 15, 345059000, time.UTC),
			msgHas: "has fallen off the bus", wantEvents: 1,
		},
		{
			name: "Xid 79 with its GPU-at header: one xid event",
			in: "[  100.1] NVRM: GPU at PCI:0000:3b:00: GPU-11111111-2222-3333-4444-555555555555\n" +
				"[  100.1] NVRM: GPU Board Serial Number: 1234\n" +
				"[  100.2] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n" +
				"[  100.3] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n",
			kind: snapshot.EventXid, code: 79, device: "0000:3b:00.0", source: "dmesg", raw: "100.2",
			msgHas: "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", wantEvents: 1,
		},
		{
			name: "/dev/kmsg record",
			in:   "3,1234,5678901,-;NVRM: Xid (PCI:0000:9b:00): 48, pid=77, name=train, An uncorrectable double bit error\n SUBSYSTEM=pci\n DEVICE=+pci:0000:9b:00.0\n",
			kind: snapshot.EventXid, code: 48, device: "0000:9b:00.0", source: "kmsg", raw: "5.678901",
			msgHas: "double bit error", wantEvents: 1,
		},
		{
			name: "/dev/kmsg multi-line record",
			in:   "3,88,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.\n",
			kind: snapshot.EventFallenOffBus, device: "0000:b3:00.0", source: "kmsg", raw: "1843.308145",
			msgHas: "(PCI ID: 10de:26b5) installed in this system has fallen off the bus", wantEvents: 1,
		},
		{
			name: "SXid with its severity and data lines",
			in: "[ 5.0] nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 61 egress non-posted PRIV error (First)\n" +
				"[ 5.0] nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Severity 0 Engine instance 61 Sub-engine instance 00\n" +
				"[ 5.0] nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Data {0x00000000, 0x00000000}\n",
			kind: snapshot.EventSXid, code: 12028, device: "0000:86:00.0", source: "dmesg", raw: "5.0",
			msgHas: "Data {0x00000000", wantEvents: 1,
		},
		{
			name: "amdgpu ring timeout with process and reset",
			in: "[127033.279661] amdgpu 0000:c5:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=2662395, emitted seq=2662397\n" +
				"[127033.279667] amdgpu 0000:c5:00.0: amdgpu:  Process code pid 1048641 thread code:cs0 pid 1048662\n" +
				"[127035.492298] amdgpu 0000:c5:00.0: amdgpu: Ring gfx_0.0.0 reset failed\n" +
				"[127035.492304] amdgpu 0000:c5:00.0: amdgpu: GPU reset begin!\n" +
				"[127037.807536] amdgpu 0000:c5:00.0: amdgpu: GPU reset succeeded, trying to resume\n",
			kind: snapshot.EventAMDGPU, device: "0000:c5:00.0", source: "dmesg", raw: "127033.279661",
			msgHas: "GPU reset begin!", wantEvents: 1,
		},
		{
			name: "amdgpu drm error without an address takes the only amdgpu device",
			in: "[ 1.0] amdgpu 0000:03:00.0: amdgpu: SMU is initialized successfully!\n" +
				"[ 2.0] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring sdma0 timeout, signaled seq=121570, emitted seq=121572\n" +
				"[ 2.0] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process chrome pid 2379 thread chrome:cs0 pid 2391\n",
			kind: snapshot.EventAMDGPU, device: "0000:03:00.0", source: "dmesg", raw: "2.0",
			msgHas: "Process information", wantEvents: 1,
		},
		{
			name: "amdgpu RAS",
			in:   "[ 9.0] amdgpu 0000:c1:00.0: amdgpu: socket: 0, die: 0 1 uncorrectable hardware errors detected in UMC block\n",
			kind: snapshot.EventAMDGPU, device: "0000:c1:00.0", source: "dmesg", raw: "9.0",
			msgHas: "uncorrectable", wantEvents: 1,
		},
		{
			name: "AER corrected report",
			in: "[ 3.1] pcieport 0000:00:01.1: AER: Corrected error received: 0000:01:00.0\n" +
				"[ 3.1] nvidia 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)\n" +
				"[ 3.1] nvidia 0000:01:00.0:   device [10de:2204] error status/mask=00000001/0000a000\n" +
				"[ 3.1] nvidia 0000:01:00.0:    [ 0] RxErr                  (First)\n",
			kind: snapshot.EventAER, device: "0000:01:00.0", source: "dmesg", raw: "3.1",
			msgHas: "RxErr", wantEvents: 1,
		},
		{
			name: "AER uncorrected, newer wording",
			in:   "[ 3.1] pcieport 0000:00:03.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:05:00.0\n",
			kind: snapshot.EventAER, device: "0000:05:00.0", source: "dmesg", raw: "3.1",
			msgHas: "severity=Uncorrected (Non-Fatal)", wantEvents: 1,
		},
		{
			name: "dmesg -t: no timestamps",
			in:   "NVRM: Xid (PCI:0000:01:00): 31, pid=42, name=a.out, Ch 00000010, intr 00000000. MMU Fault\n",
			kind: snapshot.EventXid, code: 31, device: "0000:01:00.0", source: "dmesg",
			msgHas: "MMU Fault", wantEvents: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := parseString(t, tt.in)
			if len(l.Events) != tt.wantEvents {
				for _, e := range l.Events {
					t.Logf("%+v", e)
				}
				t.Fatalf("%d events, want %d", len(l.Events), tt.wantEvents)
			}
			e := l.Events[0]
			if e.Kind != tt.kind || e.Code != tt.code || e.Device != tt.device || e.Source != tt.source || e.RawTime != tt.raw {
				t.Errorf("event %+v\nwant kind %s code %d device %s source %s raw %q", e, tt.kind, tt.code, tt.device, tt.source, tt.raw)
			}
			if !e.Time.Equal(tt.time) {
				t.Errorf("time %v, want %v", e.Time, tt.time)
			}
			if !strings.Contains(e.Message, tt.msgHas) {
				t.Errorf("message %q lacks %q", e.Message, tt.msgHas)
			}
		})
	}
}

func TestAMDProcessAndBoot(t *testing.T) {
	l := parseString(t, "[ 0.5] pci 0000:c1:00.0: [1002:74a1] type 00 class 0x038000\n"+
		"[ 0.6] pci 0000:c1:00.1: [1002:ab20] type 00 class 0x040300\n"+
		"[ 7.0] [drm] Initialized amdgpu 3.57.0 20150101 for 0000:c1:00.0 on minor 1\n"+
		"[ 9.0] amdgpu 0000:c1:00.0: amdgpu: ring comp_1.0.1 timeout, signaled seq=45, emitted seq=47\n"+
		"[ 9.0] amdgpu 0000:c1:00.0: amdgpu:  Process gnome-shell pid 5244 thread gnome-shel:cs0 pid 5284\n")
	if len(l.Events) != 1 || l.Events[0].Process != "gnome-shell" || l.Events[0].PID != 5244 {
		t.Errorf("events %+v, want one amdgpu event from gnome-shell pid 5244", l.Events)
	}
	if len(l.PCI) != 2 || l.PCI[0].Class != "038000" || l.PCI[0].DeviceID != "74a1" {
		t.Errorf("pci %+v", l.PCI)
	}
	if len(l.Devices) != 1 || l.Devices[0].Driver != "amdgpu" || l.Devices[0].Address != "0000:c1:00.0" {
		t.Errorf("devices %+v", l.Devices)
	}
}

// Lines that look alarming but are no GPU fault.
func TestNoFalseEvents(t *testing.T) {
	l := parseString(t, "[ 1.0] pci 0000:17:02.0: BAR 14: failed to assign [mem size 0x00100000]\n"+
		"[ 1.1] RAS: Correctable Errors collector initialized.\n"+
		"[ 1.2] acpi PNP0A08:29: _OSC: platform does not support [SHPCHotplug AER DPC]\n"+
		"[ 1.3] amdgpu 0000:33:00.0: amdgpu: RAS: optional ras ta ucode is not available\n"+
		"[ 1.4] [drm] amdgpu kernel modesetting enabled.\n"+
		"[ 1.5] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"+
		"[ 1.6] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing\n"+
		"Feb 27 15:10:02 n1 nv-fabricmanager[29850]: NVRM: Xid (PCI:0000:9b:00): 79, from a user program\n")
	if len(l.Events) != 0 {
		t.Errorf("events %+v, want none", l.Events)
	}
	if l.NVIDIA == nil || l.NVIDIA.Version != "535.183.01" {
		t.Errorf("driver %+v", l.NVIDIA)
	}
}

func TestReaderStreams(t *testing.T) {
	pr, pw := io.Pipe()
	rd := NewReader(pr)
	go func() {
		io.WriteString(pw, "[ 1.0] NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=a, x\n")
		io.WriteString(pw, "[ 2.0] NVRM: Xid (PCI:0000:02:00): 43, pid=2, name=b, y\n")
		// The reader must hand out the first event before the input ends.
		pw.CloseWithError(errors.New("device went away"))
	}()
	var codes []int
	for {
		e, err := rd.Next()
		if err != nil {
			if !strings.Contains(err.Error(), "device went away") {
				t.Errorf("error %v, want the read error", err)
			}
			break
		}
		codes = append(codes, e.Code)
	}
	if len(codes) != 2 || codes[0] != 13 || codes[1] != 43 {
		t.Errorf("codes %v, want [13 43] before the error", codes)
	}
	if _, err := Parse(iotest{}); err == nil {
		t.Error("Parse of a failing reader returned no error")
	}
}

type iotest struct{}

func (iotest) Read([]byte) (int, error) { return 0, errors.New("boom") }

func TestLongLinesAndManyDetails(t *testing.T) {
	var b strings.Builder
	b.WriteString("[ 1.0] NVRM: Xid (PCI:0000:01:00): 119, pid=1, name=a, " + strings.Repeat("x", 3*MaxLine) + "\n")
	for i := 0; i < 500; i++ {
		b.WriteString("[ 1.0] NVRM:     -1    103  GSP_RM_ALLOC          0x0000000000002080\n")
	}
	l := parseString(t, b.String())
	if len(l.Events) != 1 {
		t.Fatalf("%d events, want 1", len(l.Events))
	}
	if n := len(l.Events[0].Message); n > MaxLine+maxMessage {
		t.Errorf("message of %d bytes is not bounded", n)
	}
}

func TestSniff(t *testing.T) {
	yes := []string{"h100-hgx-boot-dmesg-iso.log", "h100-xid119-gsp-rpc-timeout.log",
		"h100-xid13-xid109-ctxsw-timeout.log", "nvrm-fallen-off-bus-no-xid.log"}
	for _, n := range yes {
		b, err := os.ReadFile(captures + n)
		if err != nil {
			t.Fatal(err)
		}
		if !Sniff(b) {
			t.Errorf("Sniff(%s) = false", n)
		}
	}
	no := []string{"../lspci/h100-hgx-x8-lspci-vvv.txt", "../lspci/gb200-lspci.txt",
		"../nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt", "../nvidia-smi-summary/h100x8-550.90.07.txt",
		"../nvidia-smi-topo/b300x8-cx8-bond-topo-m.txt", "../fabricmanager/hgx-fabricmanager-nvswitch-nonfatal.log",
		"../rocm-smi/mi300x-x8-concise.txt", "../nvidia-smi-q-xml/a10g-aws-515.105.01.xml"}
	for _, n := range no {
		b, err := os.ReadFile(captures + n)
		if err != nil {
			t.Fatal(err)
		}
		if Sniff(b) {
			t.Errorf("Sniff(%s) = true", n)
		}
	}
}

// TestStormIsBounded: a storm of one Xid keeps keepPerKind events, the
// newest standing for the rest, and messages past the first few are cut to
// their first line.
func TestStormIsBounded(t *testing.T) {
	var b strings.Builder
	const n = 5000
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[ %d.0] NVRM: Xid (PCI:0000:01:00): 13, pid=%d, name=a, Graphics Exception\n", i, i+1)
		b.WriteString("[ 0.0] NVRM: a detail line of the report\n")
	}
	l := parseString(t, b.String())
	total := 0
	for _, e := range l.Events {
		total += 1 + e.Repeats
	}
	if len(l.Events) != keepPerKind || total != n {
		t.Fatalf("%d events kept standing for %d, want %d for %d", len(l.Events), total, keepPerKind, n)
	}
	last := l.Events[len(l.Events)-1]
	if last.PID != n || strings.Contains(last.Message, "\n") {
		t.Errorf("last event %+v: want the newest (pid %d), first line only", last, n)
	}
	if !strings.Contains(l.Events[0].Message, "\n") {
		t.Errorf("the first events keep their detail lines: %q", l.Events[0].Message)
	}
}
