package discover

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParsePCIConfig(t *testing.T) {
	gpu := (&fxDev{vendor: 0x10de, device: 0x2330, subVendor: 0x10de, subDevice: 0x16c1, class: 0x030200, port: portEndpoint,
		maxGen: 5, maxWidth: 16, curGen: 5, curWidth: 16, aerCor: 1<<0 | 1<<6 | 1<<12, aerUnc: 1<<20 | 1<<14}).config()
	down := (&fxDev{vendor: 0x1000, device: 0xc030, class: 0x060400, port: portSwitchDown, maxGen: 5, maxWidth: 16, curGen: 4, curWidth: 4,
		acsCap: 0x5f, acsCtl: 0x1d}).config()
	loop := append([]byte(nil), gpu...)
	loop[0x61] = 0x40 // PCIe capability points back to the PM capability
	extLoop := append([]byte(nil), gpu...)
	extLoop[0x102], extLoop[0x103] = 0x00, 0x10 // AER's next pointer is itself
	ffff := make([]byte, 64)
	for i := range ffff {
		ffff[i] = 0xff
	}

	tests := []struct {
		name    string
		in      []byte
		wantErr bool
		check   func(t *testing.T, c *PCIConfig)
	}{
		{name: "too short", in: gpu[:8], wantErr: true},
		{name: "no device", in: ffff, wantErr: true},
		{name: "64 bytes as non-root reads it", in: gpu[:64], check: func(t *testing.T, c *PCIConfig) {
			if !c.Truncated || c.HasPCIe || c.ACS != nil || c.AER != nil || c.VendorID != 0x10de || c.DeviceID != 0x2330 {
				t.Errorf("%+v", c)
			}
		}},
		{name: "256 bytes: PCIe but no extended space", in: gpu[:256], check: func(t *testing.T, c *PCIConfig) {
			if !c.HasPCIe || !c.Truncated || c.AER != nil || c.CurGen != 5 {
				t.Errorf("%+v", c)
			}
		}},
		{name: "endpoint with AER", in: gpu, check: func(t *testing.T, c *PCIConfig) {
			if c.Truncated || c.PortType != portEndpoint || c.MaxGen != 5 || c.MaxWidth != 16 || c.CurGen != 5 || c.CurWidth != 16 || c.ACS != nil {
				t.Errorf("%+v", c)
			}
			if c.AER == nil || !reflect.DeepEqual(c.AER.Correctable, []string{"RxErr", "BadTLP", "Timeout"}) ||
				!reflect.DeepEqual(c.AER.Uncorrectable, []string{"CmpltTO", "UnsupReq"}) {
				t.Errorf("AER %+v", c.AER)
			}
		}},
		{name: "downstream port with ACS", in: down, check: func(t *testing.T, c *PCIConfig) {
			if c.PortType != portSwitchDown || c.HeaderType != 1 || c.CurGen != 4 || c.CurWidth != 4 || c.ACS == nil ||
				!c.ACS.SrcValid || !c.ACS.ReqRedir || !c.ACS.CmpltRedir || !c.ACS.UpstreamFwd || c.ACS.TransBlk || c.ACS.DirectTrans {
				t.Errorf("%+v ACS %+v", c, c.ACS)
			}
			if c.AER == nil || len(c.AER.Correctable)+len(c.AER.Uncorrectable) != 0 {
				t.Errorf("clean AER expected: %+v", c.AER)
			}
		}},
		{name: "capability loop", in: loop, check: func(t *testing.T, c *PCIConfig) {
			if !c.HasPCIe {
				t.Errorf("%+v", c)
			}
		}},
		{name: "extended capability loop", in: extLoop, check: func(t *testing.T, c *PCIConfig) {
			if c.AER == nil {
				t.Errorf("%+v", c)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParsePCIConfig(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "PCI config space") {
					t.Errorf("error lacks context: %v", err)
				}
				return
			}
			tt.check(t, c)
		})
	}
}

// Link Capabilities 2 wins over the Link Capabilities field when present.
func TestParsePCIConfigLinkCap2(t *testing.T) {
	b := (&fxDev{vendor: 0x10de, device: 0x2330, class: 0x030200, maxGen: 3, maxWidth: 16, curGen: 3, curWidth: 16}).config()
	b[0x8c] = 1<<1 | 1<<2 | 1<<3 | 1<<4 | 1<<5 // 2.5-32 GT/s supported
	c, err := ParsePCIConfig(b)
	if err != nil || c.MaxGen != 5 {
		t.Fatalf("MaxGen = %v (%v), want 5 from Link Capabilities 2", c, err)
	}
}

func TestParseLinkSpeed(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{"2.5 GT/s PCIe", 1, false},
		{"5.0 GT/s PCIe", 2, false},
		{"8.0 GT/s PCIe", 3, false},
		{"16.0 GT/s PCIe\n", 4, false},
		{"32.0 GT/s PCIe", 5, false},
		{"64.0 GT/s PCIe", 6, false},
		{"128.0 GT/s PCIe", 7, false},
		{"2.5 GT/s", 1, false},
		{"5 GT/s", 2, false},
		{"8 GT/s", 3, false},
		{"16 GT/s", 4, false},
		{"Unknown", 0, false},
		{"", 0, false},
		{"fast", 0, true},
		{"12 GT/s PCIe", 0, true},
		{"x GT/s", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseLinkSpeed(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("ParseLinkSpeed(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseAERCounters(t *testing.T) {
	got := ParseAERCounters("RxErr 212\nBadTLP 37\nbogus\nTimeout x\nTOTAL_ERR_COR 249\n")
	want := map[string]uint64{"RxErr": 212, "BadTLP": 37, "TOTAL_ERR_COR": 249}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// fixtureConfigs returns the config files of the committed fixtures.
func fixtureConfigs(tb testing.TB) [][]byte {
	var out [][]byte
	_ = filepath.WalkDir(fixturesDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && d.Name() == "config" && len(out) < 40 {
			if b, err := os.ReadFile(p); err == nil {
				out = append(out, b)
			}
		}
		return nil
	})
	if len(out) == 0 {
		tb.Fatal("no fixture config files found")
	}
	return out
}

func FuzzParsePCIConfig(f *testing.F) {
	for _, b := range fixtureConfigs(f) {
		f.Add(b)
		f.Add(b[:64])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParsePCIConfig(b)
		if err != nil {
			return
		}
		if c.MaxGen < 0 || c.MaxGen > 7 || c.CurGen < 0 || c.CurGen > 7 || c.MaxWidth < 0 || c.MaxWidth > 63 || c.CurWidth < 0 || c.CurWidth > 63 {
			t.Fatalf("link out of range: %+v", c)
		}
		if c.Size != len(b) {
			t.Fatalf("size %d, input %d", c.Size, len(b))
		}
		if c.AER != nil && len(c.AER.Correctable) > 8 {
			t.Fatalf("more correctable bits than exist: %v", c.AER.Correctable)
		}
	})
}

func FuzzParseLinkSpeed(f *testing.F) {
	for _, s := range []string{"2.5 GT/s PCIe", "5.0 GT/s PCIe", "8.0 GT/s PCIe", "16.0 GT/s PCIe", "32.0 GT/s PCIe", "64.0 GT/s PCIe",
		"128.0 GT/s PCIe", "16 GT/s", "5 GT/s", "Unknown", "", "NaN GT/s", "1e400 GT/s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseLinkSpeed(s)
		if g < 0 || g > 7 {
			t.Fatalf("generation %d out of range", g)
		}
		if err != nil && g != 0 {
			t.Fatalf("error with a generation: %d, %v", g, err)
		}
	})
}
