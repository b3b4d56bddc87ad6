package capture

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"kiln.dev/kiln/snapshot"
)

// The fabricmanager importer reads NVIDIA fabric manager logs
// (/var/log/fabricmanager.log, also as journald copies of nv-fabricmanager):
// NVSwitch fatal and non-fatal errors become events, and the start-up lines
// give the fabric manager's version.
func init() {
	RegisterFile(FileImporter{Kind: "fabricmanager", Detect: detectFabricManager, Parse: parseFabricManager})
}

var (
	// reFMLine is one log line: "[Feb 27 2025 15:10:02] [ERROR] [tid 12727] text".
	reFMLine = lazy(`\[([A-Z][a-z]{2} [ \d]?\d \d{4} \d\d:\d\d:\d\d)\] \[([A-Z]+)\] \[tid \d+\] ?(.*)$`)
	// reFMSwitchErr: "detected NVSwitch non-fatal error 12028 on fid 0 on
	// NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 61".
	reFMSwitchErr = lazy(`detected NVSwitch (non-fatal|fatal) error (\d{1,9})`)
	reFMBusID     = lazy(`pci bus id ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)`)
	reFMVersion   = lazy(`Fabric Manager version (\d[\w.-]*)`)
	// reFMStarted are lines the fabric manager writes once it runs and has
	// set up the fabric.
	reFMStarted = lazy(`Fabric Manager version \S+ is running|Successfully configured all the available (?:GPUs and )?NVSwitches`)
	// reFMStopped are lines written when it gives up or exits.
	reFMStopped = lazy(`(?i)aborting fabric manager|fabric manager (?:is )?(?:exiting|terminat|stopp)`)
)

// fmMaxNotes bounds the unrecognised error lines kept as notes.
const fmMaxNotes = 20

func detectFabricManager(_ string, data []byte) bool {
	fm, other, i := 0, 0, 0
	eachLine(data[:min(len(data), 256<<10)], func(line string) bool {
		i++
		if line = strings.TrimSpace(line); line != "" {
			if reFMLine().MatchString(line) {
				fm++
			} else {
				other++
			}
		}
		return i < 200
	})
	// Inband messages carry a second, unprefixed "Message payload" line.
	return fm > 0 && fm*3 >= other
}

func parseFabricManager(_ string, data []byte) (*snapshot.Snapshot, error) {
	s := snapshot.New()
	fm := &snapshot.FabricManager{
		// A fabric manager log exists only where the fabric manager was
		// installed.
		Installed: snapshot.Ptr(true),
	}
	var running *bool
	notes, extra := 0, 0
	eachLine(data, func(line string) bool {
		m := reFMLine().FindStringSubmatch(line)
		if m == nil {
			return true
		}
		when, level, text := m[1], m[2], strings.TrimSpace(m[3])
		if v := reFMVersion().FindStringSubmatch(text); v != nil {
			fm.Version = v[1]
		}
		switch {
		case reFMStarted().MatchString(text):
			running = snapshot.Ptr(true)
			return true
		case reFMStopped().MatchString(text):
			running = snapshot.Ptr(false)
		}
		if e := reFMSwitchErr().FindStringSubmatch(text); e != nil {
			code, _ := strconv.Atoi(e[2])
			ev := snapshot.Event{Source: "fabricmanager", Kind: snapshot.EventNVSwitch, Code: code, Message: text}
			ev.Time, ev.RawTime = fmTime(when)
			if b := reFMBusID().FindStringSubmatch(text); b != nil {
				if a, err := snapshot.CanonicalPCI(b[1]); err == nil {
					ev.Device = a
				}
			}
			s.Events = append(s.Events, ev)
			return true
		}
		if level == "ERROR" || level == "CRITICAL" || level == "FATAL" {
			if notes < fmMaxNotes {
				s.Notes = append(s.Notes, snapshot.Note{Source: "fabricmanager", Message: fmt.Sprintf("[%s] %s", when, text)})
				notes++
			} else {
				extra++
			}
		}
		return true
	})
	if extra > 0 {
		s.Notes = append(s.Notes, snapshot.Note{Source: "fabricmanager", Message: fmt.Sprintf("%d more error lines not shown", extra)})
	}
	fm.Running = running
	s.Drivers.FabricManager = fm
	return s, nil
}

// eachLine calls fn with each line of data, cut to 64 KiB, until fn
// returns false.
func eachLine(data []byte, fn func(string) bool) {
	forEachLine(data, func(line []byte) bool { return fn(string(line[:min(len(line), 64<<10)])) })
}

// fmTime reads "Feb 27 2025 15:10:02". The log gives no zone; kiln keeps the
// clock reading as UTC. An unreadable time is returned as printed.
func fmTime(s string) (time.Time, string) {
	for _, layout := range []string{"Jan 02 2006 15:04:05", "Jan _2 2006 15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, ""
		}
	}
	return time.Time{}, s
}
