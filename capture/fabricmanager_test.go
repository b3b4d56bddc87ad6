package capture

import (
	"os"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/snapshot"
)

const fmCapture = "../testdata/captures/fabricmanager/hgx-fabricmanager-nvswitch-nonfatal.log"

func TestFabricManagerNonFatal(t *testing.T) {
	b, err := os.ReadFile(fmCapture)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseBytes(fmCapture, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Sources) != 1 || s.Sources[0].Kind != "fabricmanager" {
		t.Fatalf("read as %+v, want fabricmanager", s.Sources)
	}
	if len(s.Events) != 1 {
		t.Fatalf("events %+v, want the one NVSwitch error", s.Events)
	}
	e := s.Events[0]
	if e.Kind != snapshot.EventNVSwitch || e.Code != 12028 || e.Device != "0000:86:00.0" || e.Source != "fabricmanager" {
		t.Errorf("event %+v, want nvswitch 12028 on 0000:86:00.0", e)
	}
	if want := time.Date(2025, 2, 27, 15, 10, 2, 0, time.UTC); !e.Time.Equal(want) {
		t.Errorf("time %v, want %v", e.Time, want)
	}
	if !strings.Contains(e.Message, "non-fatal") || !strings.Contains(e.Message, "physical id 3 port 61") {
		t.Errorf("message %q lacks severity or port", e.Message)
	}
	fm := s.Drivers.FabricManager
	if fm == nil || fm.Installed == nil || !*fm.Installed {
		t.Fatalf("fabric manager %+v, want installed", fm)
	}
	// The excerpt has no start-up lines: running and version stay unknown.
	if fm.Running != nil || fm.Version != "" {
		t.Errorf("fabric manager running %v version %q, want unknown", fm.Running, fm.Version)
	}
	if len(s.Notes) != 0 {
		t.Errorf("notes %+v, want none", s.Notes)
	}
}

func TestFabricManagerStartFatalAndJournal(t *testing.T) {
	log := "[Jul 23 2024 07:40:01] [INFO] [tid 841] Fabric Manager version 535.183.01 is running with the following configuration options\n" +
		"[Jul 23 2024 07:40:01] [INFO] [tid 841] Logging level = 4\n" +
		"[Jul 23 2024 07:40:12] [INFO] [tid 841] Successfully configured all the available NVSwitches to route GPU NVLink traffic.\n" +
		"[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:85:00.0 physical id 2 port 33\n" +
		"[Jul 23 2024 07:54:00] [ERROR] [tid 2999877] failed to find the GPU handle 10187860174420860981 in the multicast team request setup\n" +
		"Jul 23 07:55:00 node nv-fabricmanager[841]: [Jul  3 2024 07:55:00] [ERROR] [tid 841] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61\n"
	if !detectFabricManager("fm.log", []byte(log)) {
		t.Fatal("not detected")
	}
	s, err := parseFabricManager("fm.log", []byte(log))
	if err != nil {
		t.Fatal(err)
	}
	fm := s.Drivers.FabricManager
	if fm.Version != "535.183.01" || fm.Running == nil || !*fm.Running {
		t.Errorf("fabric manager %+v, want 535.183.01 running", fm)
	}
	if len(s.Events) != 2 {
		t.Fatalf("events %+v, want 2", s.Events)
	}
	if e := s.Events[0]; e.Code != 20034 || e.Device != "0000:85:00.0" || !strings.HasPrefix(e.Message, "detected NVSwitch fatal error") {
		t.Errorf("fatal event %+v", e)
	}
	if e := s.Events[1]; e.Code != 12028 || !e.Time.Equal(time.Date(2024, 7, 3, 7, 55, 0, 0, time.UTC)) {
		t.Errorf("journald-wrapped event %+v", e)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, "failed to find the GPU handle") {
		t.Errorf("notes %+v, want the unrecognised error line", s.Notes)
	}

	stopped := log + "[Jul 23 2024 08:00:00] [ERROR] [tid 9] detected number of NVSwitches don't match with any supported system topology, aborting fabric manager\n"
	s, err = parseFabricManager("fm.log", []byte(stopped))
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Drivers.FabricManager.Running; r == nil || *r {
		t.Errorf("running %v after the fabric manager aborted, want false", r)
	}
}

func FuzzFabricManager(f *testing.F) {
	b, err := os.ReadFile(fmCapture)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte("[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 33\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = detectFabricManager("x", data)
		s, err := parseFabricManager("x", data)
		if err != nil {
			t.Fatalf("parse error on in-memory data: %v", err)
		}
		if s.Drivers.FabricManager == nil {
			t.Fatal("no fabric manager state")
		}
		if len(s.Notes) > fmMaxNotes+1 {
			t.Fatalf("%d notes, want at most %d", len(s.Notes), fmMaxNotes+1)
		}
		for _, e := range s.Events {
			if e.Kind != snapshot.EventNVSwitch || e.Code < 0 {
				t.Fatalf("bad event %+v", e)
			}
			if e.Device != "" {
				if c, err := snapshot.CanonicalPCI(e.Device); err != nil || c != e.Device {
					t.Fatalf("event device %q is not canonical", e.Device)
				}
			}
		}
	})
}
