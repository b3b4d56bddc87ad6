package discover

import (
	"encoding/binary"
	"fmt"

	"kiln.dev/kiln/snapshot"
)

// PCIe capability port types (PCI Express Capabilities register, bits 7:4).
const (
	portEndpoint       = 0x0
	portLegacyEndpoint = 0x1
	portRootPort       = 0x4
	portSwitchUp       = 0x5
	portSwitchDown     = 0x6
	portPCIeToPCI      = 0x7
	portPCIToPCIe      = 0x8
	portRCEndpoint     = 0x9
	portRCEventColl    = 0xa
)

// Config-space layout constants (PCI Local Bus and PCI Express base specs).
const (
	cfgStatus        = 0x06
	cfgStatusCapList = 0x10
	cfgCapPtr        = 0x34
	cfgHeaderType    = 0x0e
	cfgExtStart      = 0x100
	capIDPCIe        = 0x10
	extCapIDAER      = 0x0001
	extCapIDACS      = 0x000d
)

// PCIConfig is what kiln reads from a device's configuration space.
type PCIConfig struct {
	// Size is the number of bytes that were readable.
	Size int
	// VendorID and DeviceID from the header.
	VendorID, DeviceID uint16
	// HeaderType is the header layout (0 endpoint, 1 PCI-to-PCI bridge).
	HeaderType uint8
	// HasPCIe is true when a PCI Express capability was found.
	HasPCIe bool
	// PortType is the PCIe device/port type (0 endpoint, 4 root port,
	// 5 switch upstream, 6 switch downstream, ...). Valid with HasPCIe.
	PortType int
	// Link capability and status from the PCIe capability; zero when
	// unknown. MaxGen prefers Link Capabilities 2's supported-speeds vector.
	MaxGen, MaxWidth, CurGen, CurWidth int
	// ACS is the ACS control register when the capability was readable.
	ACS *snapshot.ACS
	// AER status bits when the capability was readable.
	AER *snapshot.AER
	// Truncated is true when the capability list pointed past the readable
	// bytes (a non-root reader sees only the first 64 bytes).
	Truncated bool
}

// ParsePCIConfig reads the header, the capability list from 0x34 and the
// extended capability list from 0x100 of a PCI configuration space dump.
// Short input is not an error: what cannot be read stays unknown and
// Truncated says so. It never panics.
func ParsePCIConfig(b []byte) (*PCIConfig, error) {
	if len(b) < 0x10 {
		return nil, fmt.Errorf("PCI config space: %d bytes, need at least 16 for the header", len(b))
	}
	c := &PCIConfig{Size: len(b)}
	c.VendorID = le16(b, 0)
	c.DeviceID = le16(b, 2)
	c.HeaderType = b[cfgHeaderType] & 0x7f
	if c.VendorID == 0xffff {
		return nil, fmt.Errorf("PCI config space: vendor id ffff: the device did not answer")
	}
	if len(b) <= cfgCapPtr {
		c.Truncated = true
		return c, nil
	}
	if le16(b, cfgStatus)&cfgStatusCapList == 0 {
		return c, nil
	}
	c.parseCaps(b)
	if len(b) > cfgExtStart && c.HasPCIe {
		c.parseExtCaps(b)
	} else if c.HasPCIe && len(b) <= cfgExtStart {
		c.Truncated = true
	}
	return c, nil
}

func (c *PCIConfig) parseCaps(b []byte) {
	ptr := int(b[cfgCapPtr]) &^ 3
	seen := map[int]bool{}
	for n := 0; ptr >= 0x40 && n < 48; n++ {
		if seen[ptr] {
			return
		}
		seen[ptr] = true
		if ptr+2 > len(b) {
			c.Truncated = true
			return
		}
		id := b[ptr]
		if id == capIDPCIe {
			c.parsePCIe(b, ptr)
		}
		ptr = int(b[ptr+1]) &^ 3
	}
}

func (c *PCIConfig) parsePCIe(b []byte, at int) {
	if at+0x14 > len(b) {
		c.Truncated = true
		return
	}
	c.HasPCIe = true
	flags := le16(b, at+2)
	c.PortType = int(flags>>4) & 0xf
	linkCap := le32(b, at+0x0c)
	c.MaxGen = int(linkCap & 0xf)
	c.MaxWidth = int(linkCap>>4) & 0x3f
	linkSta := le16(b, at+0x12)
	c.CurGen = int(linkSta & 0xf)
	c.CurWidth = int(linkSta>>4) & 0x3f
	// Link Capabilities 2 (capability version 2) holds the supported
	// speeds vector; its highest bit is the true maximum on Gen3+ parts.
	if flags&0xf >= 2 && at+0x30 <= len(b) {
		vec := (le32(b, at+0x2c) >> 1) & 0x7f
		if vec != 0 {
			hi := 0
			for i := 0; i < 7; i++ {
				if vec&(1<<i) != 0 {
					hi = i + 1
				}
			}
			c.MaxGen = hi
		}
	}
	if c.MaxGen > 7 {
		c.MaxGen = 0
	}
	if c.CurGen > 7 {
		c.CurGen = 0
	}
}

func (c *PCIConfig) parseExtCaps(b []byte) {
	ptr := cfgExtStart
	seen := map[int]bool{}
	for n := 0; ptr >= cfgExtStart && n < 128; n++ {
		if seen[ptr] {
			return
		}
		seen[ptr] = true
		if ptr+4 > len(b) {
			c.Truncated = true
			return
		}
		hdr := le32(b, ptr)
		if hdr == 0 || hdr == 0xffffffff {
			return
		}
		switch hdr & 0xffff {
		case extCapIDACS:
			if ptr+8 <= len(b) {
				c.ACS = acsFromControl(le16(b, ptr+6))
			} else {
				c.Truncated = true
			}
		case extCapIDAER:
			if ptr+0x14 <= len(b) {
				c.AER = &snapshot.AER{
					Uncorrectable: bitNames(le32(b, ptr+4), aerUncorrectableNames),
					Correctable:   bitNames(le32(b, ptr+0x10), aerCorrectableNames),
				}
			} else {
				c.Truncated = true
			}
		}
		ptr = int(hdr>>20) &^ 3
	}
}

func acsFromControl(w uint16) *snapshot.ACS {
	return &snapshot.ACS{
		SrcValid:    w&(1<<0) != 0,
		TransBlk:    w&(1<<1) != 0,
		ReqRedir:    w&(1<<2) != 0,
		CmpltRedir:  w&(1<<3) != 0,
		UpstreamFwd: w&(1<<4) != 0,
		EgressCtrl:  w&(1<<5) != 0,
		DirectTrans: w&(1<<6) != 0,
	}
}

// aerUncorrectableNames are the Uncorrectable Error Status bits as lspci
// names them (UESta).
var aerUncorrectableNames = map[uint]string{
	4: "DLP", 5: "SDES", 12: "TLP", 13: "FCP", 14: "CmpltTO", 15: "CmpltAbrt",
	16: "UnxCmplt", 17: "RxOF", 18: "MalfTLP", 19: "ECRC", 20: "UnsupReq",
	21: "ACSViol", 22: "UncorrIntErr", 23: "BlockedTLP", 24: "AtomicOpBlocked",
	25: "TLPBlockedErr", 26: "PoisonTLPBlocked", 27: "DMWrReqBlocked",
	28: "IDECheck", 29: "MisIDETLP", 30: "PCRC_CHECK", 31: "TLPXlatBlocked",
}

// aerCorrectableNames are the Correctable Error Status bits as lspci names
// them (CESta).
var aerCorrectableNames = map[uint]string{
	0: "RxErr", 6: "BadTLP", 7: "BadDLLP", 8: "Rollover", 12: "Timeout",
	13: "AdvNonFatalErr", 14: "CorrIntErr", 15: "HeaderOF",
}

func bitNames(v uint32, names map[uint]string) []string {
	var out []string
	for bit := uint(0); bit < 32; bit++ {
		if v&(1<<bit) == 0 {
			continue
		}
		if n, ok := names[bit]; ok {
			out = append(out, n)
		}
	}
	return out
}

// pcieKind maps a PCIe port type to a snapshot PCI kind for bridges.
func pcieKind(portType int) string {
	switch portType {
	case portRootPort:
		return snapshot.KindRootPort
	case portSwitchUp:
		return snapshot.KindSwitchUp
	case portSwitchDown:
		return snapshot.KindSwitchDown
	case portPCIeToPCI, portPCIToPCIe:
		return snapshot.KindBridge
	}
	return ""
}

func le16(b []byte, at int) uint16 {
	if at < 0 || at+2 > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint16(b[at:])
}

func le32(b []byte, at int) uint32 {
	if at < 0 || at+4 > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint32(b[at:])
}
