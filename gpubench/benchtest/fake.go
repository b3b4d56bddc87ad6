// Package benchtest is a fake GPU driver and collective library for
// testing gpubench and kiln bench without a GPU. Time is simulated: every
// stream has a clock that a copy moves on by its size over the rate the
// test gives (plus a fixed cost per copy), an event takes its stream's
// clock when recorded, and a stream that waits for an event takes the
// event's time if it is later. Elapsed times are therefore exact and known
// to the test; nothing is ever timed for real.
package benchtest

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"kiln.dev/kiln/gpubench"
)

// Copy is one copy the fake was asked to make.
type Copy struct {
	Dst, Src gpubench.Buffer
	Bytes    int64
	Stream   gpubench.Stream
	// Seq counts the copies the fake made before this one.
	Seq int
}

// Alloc is one allocation.
type Alloc struct {
	Kind     gpubench.MemKind
	Device   int
	NUMANode int
	Bytes    int64
}

// Driver is a fake gpubench.Driver.
type Driver struct {
	Devs  []gpubench.Device
	Nodes []int
	// Rate is a copy's bandwidth in GB/s; Overhead is added to each copy.
	Rate     func(c Copy) float64
	Overhead time.Duration
	// Peer says whether device can reach peer directly (nil: all can).
	Peer func(device, peer int) bool
	// Fail, when set, is asked before every call with the method's name
	// and may return an error for it.
	Fail func(method string, args ...any) error

	mu      sync.Mutex
	next    uint64
	clock   map[uint64]float64 // stream handle -> time in ns
	events  map[uint64]float64 // event handle -> time recorded
	evDev   map[uint64]int
	live    map[uint64]Alloc
	copies  []Copy
	allocs  []Alloc
	enabled map[[2]int]bool
	held    map[uint64]int
	gates   int
	closed  bool
}

// New returns a fake with n GPUs on PCI addresses 0000:N1:00.0, GPU i on
// NUMA node i*len(nodes)/n, host memory on the given nodes, every copy at
// 10 GB/s.
func New(n int, nodes ...int) *Driver {
	d := &Driver{Nodes: nodes, Rate: func(Copy) float64 { return 10 }}
	for i := range n {
		dev := gpubench.Device{Ordinal: i, Name: "Fake GPU", PCI: fmt.Sprintf("0000:%02x:00.0", 0x11+i*0x10), MemoryBytes: 80 << 30}
		if len(nodes) > 0 {
			node := nodes[i*len(nodes)/n]
			dev.NUMANode = &node
		}
		d.Devs = append(d.Devs, dev)
	}
	return d
}

func (d *Driver) init() {
	if d.clock == nil {
		d.clock = map[uint64]float64{}
		d.events = map[uint64]float64{}
		d.evDev = map[uint64]int{}
		d.live = map[uint64]Alloc{}
		d.enabled = map[[2]int]bool{}
		d.held = map[uint64]int{}
	}
}

func (d *Driver) fail(method string, args ...any) error {
	if d.Fail == nil {
		return nil
	}
	return d.Fail(method, args...)
}

func (d *Driver) handle() uint64 {
	d.next++
	return d.next
}

// Name implements gpubench.Driver.
func (d *Driver) Name() string { return "fake" }

// Version implements gpubench.Driver.
func (d *Driver) Version() string { return "1.0" }

// Devices implements gpubench.Driver.
func (d *Driver) Devices() ([]gpubench.Device, error) {
	if err := d.fail("Devices"); err != nil {
		return nil, err
	}
	return d.Devs, nil
}

// HostNUMANodes implements gpubench.Driver.
func (d *Driver) HostNUMANodes() []int { return d.Nodes }

func (d *Driver) checkDev(dev int) error {
	for _, x := range d.Devs {
		if x.Ordinal == dev {
			return nil
		}
	}
	return fmt.Errorf("fake: no GPU %d", dev)
}

// AllocHost implements gpubench.Driver.
func (d *Driver) AllocHost(bytes int64, pinned bool, node int) (gpubench.Buffer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	kind := gpubench.HostPageable
	if pinned {
		kind = gpubench.HostPinned
	}
	if err := d.fail("AllocHost", bytes, pinned, node); err != nil {
		return gpubench.Buffer{}, err
	}
	b := gpubench.Buffer{Kind: kind, Device: -1, NUMANode: node, Bytes: bytes, Addr: d.handle()}
	a := Alloc{Kind: kind, Device: -1, NUMANode: node, Bytes: bytes}
	d.live[b.Addr] = a
	d.allocs = append(d.allocs, a)
	return b, nil
}

// AllocDevice implements gpubench.Driver.
func (d *Driver) AllocDevice(dev int, bytes int64) (gpubench.Buffer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	if err := d.checkDev(dev); err != nil {
		return gpubench.Buffer{}, err
	}
	if err := d.fail("AllocDevice", dev, bytes); err != nil {
		return gpubench.Buffer{}, err
	}
	b := gpubench.Buffer{Kind: gpubench.DeviceMemory, Device: dev, NUMANode: gpubench.AnyNode, Bytes: bytes, Addr: d.handle()}
	a := Alloc{Kind: gpubench.DeviceMemory, Device: dev, NUMANode: gpubench.AnyNode, Bytes: bytes}
	d.live[b.Addr] = a
	d.allocs = append(d.allocs, a)
	return b, nil
}

// Free implements gpubench.Driver.
func (d *Driver) Free(b gpubench.Buffer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	if _, ok := d.live[b.Addr]; !ok {
		return errors.New("fake: freeing a buffer that is not allocated")
	}
	delete(d.live, b.Addr)
	return nil
}

// NewStream implements gpubench.Driver.
func (d *Driver) NewStream(dev int) (gpubench.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	if err := d.checkDev(dev); err != nil {
		return gpubench.Stream{}, err
	}
	if err := d.fail("NewStream", dev); err != nil {
		return gpubench.Stream{}, err
	}
	s := gpubench.Stream{Device: dev, Handle: d.handle()}
	d.clock[s.Handle] = 0
	return s, nil
}

// DestroyStream implements gpubench.Driver.
func (d *Driver) DestroyStream(s gpubench.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.clock, s.Handle)
	return nil
}

// NewEvent implements gpubench.Driver.
func (d *Driver) NewEvent(dev int) (gpubench.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	if err := d.checkDev(dev); err != nil {
		return gpubench.Event{}, err
	}
	e := gpubench.Event{Device: dev, Handle: d.handle()}
	d.events[e.Handle] = -1
	d.evDev[e.Handle] = dev
	return e, nil
}

// DestroyEvent implements gpubench.Driver.
func (d *Driver) DestroyEvent(e gpubench.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.events, e.Handle)
	return nil
}

// Copy implements gpubench.Driver: the stream's clock moves on by the
// copy's modelled time.
func (d *Driver) Copy(dst, src gpubench.Buffer, bytes int64, s gpubench.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	if _, ok := d.clock[s.Handle]; !ok {
		return errors.New("fake: copy on a stream that does not exist")
	}
	for _, b := range []gpubench.Buffer{dst, src} {
		if _, ok := d.live[b.Addr]; !ok {
			return errors.New("fake: copy with a buffer that is not allocated")
		}
		if bytes > b.Bytes {
			return fmt.Errorf("fake: copy of %d bytes into or from a buffer of %d", bytes, b.Bytes)
		}
	}
	c := Copy{Dst: dst, Src: src, Bytes: bytes, Stream: s, Seq: len(d.copies)}
	if err := d.fail("Copy", c); err != nil {
		return err
	}
	rate := d.Rate(c)
	if rate <= 0 || math.IsNaN(rate) {
		return fmt.Errorf("fake: no rate for copy %+v", c)
	}
	d.copies = append(d.copies, c)
	d.clock[s.Handle] += float64(d.Overhead) + float64(bytes)/rate
	return nil
}

// Advance moves a stream's clock on, as a kernel on it would (used by the
// fake collective library).
func (d *Driver) Advance(s gpubench.Stream, by time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.clock[s.Handle]; !ok {
		return errors.New("fake: work on a stream that does not exist")
	}
	d.clock[s.Handle] += float64(by)
	return nil
}

// Record implements gpubench.Driver.
func (d *Driver) Record(e gpubench.Event, s gpubench.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.clock[s.Handle]
	if !ok {
		return errors.New("fake: record on a stream that does not exist")
	}
	if _, ok := d.events[e.Handle]; !ok {
		return errors.New("fake: record of an event that does not exist")
	}
	if d.evDev[e.Handle] != s.Device {
		return errors.New("fake: event recorded on another GPU's stream")
	}
	d.events[e.Handle] = t
	return nil
}

// Wait implements gpubench.Driver.
func (d *Driver) Wait(s gpubench.Stream, e gpubench.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.events[e.Handle]
	if !ok || t < 0 {
		return errors.New("fake: wait for an event not recorded")
	}
	if _, ok := d.clock[s.Handle]; !ok {
		return errors.New("fake: wait on a stream that does not exist")
	}
	d.clock[s.Handle] = max(d.clock[s.Handle], t)
	return nil
}

// Sync implements gpubench.Driver.
func (d *Driver) Sync(e gpubench.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if t, ok := d.events[e.Handle]; !ok || t < 0 {
		return errors.New("fake: sync on an event not recorded")
	}
	for _, n := range d.held {
		if n > 0 {
			return errors.New("fake: sync while a stream is held: it would never return")
		}
	}
	return nil
}

// Elapsed implements gpubench.Driver.
func (d *Driver) Elapsed(start, end gpubench.Event) (time.Duration, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, ok1 := d.events[start.Handle]
	b, ok2 := d.events[end.Handle]
	if !ok1 || !ok2 || a < 0 || b < 0 {
		return 0, errors.New("fake: elapsed time of events not recorded")
	}
	if d.evDev[start.Handle] != d.evDev[end.Handle] {
		return 0, errors.New("fake: elapsed time of events of two GPUs")
	}
	return time.Duration(math.Round(b - a)), nil
}

// CanAccessPeer implements gpubench.Driver.
func (d *Driver) CanAccessPeer(dev, peer int) (bool, error) {
	if d.Peer == nil {
		return true, nil
	}
	return d.Peer(dev, peer), nil
}

// EnablePeerAccess implements gpubench.Driver.
func (d *Driver) EnablePeerAccess(dev, peer int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	if d.Peer != nil && !d.Peer(dev, peer) {
		return errors.New("fake: peer access not supported")
	}
	d.enabled[[2]int{dev, peer}] = true
	return nil
}

// Close implements gpubench.Driver.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

// Gate implements gpubench.Gater. Simulated time does not move while a
// stream is held, so a gate changes no figure; the fake counts gates and
// refuses work on a stream whose gate was never opened at a Sync.
func (d *Driver) Gate(s gpubench.Stream) (func() error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.init()
	if err := d.fail("Gate", s); err != nil {
		return nil, err
	}
	if _, ok := d.clock[s.Handle]; !ok {
		return nil, errors.New("fake: gate on a stream that does not exist")
	}
	d.gates++
	d.held[s.Handle]++
	opened := false
	return func() error {
		d.mu.Lock()
		defer d.mu.Unlock()
		if opened {
			return errors.New("fake: gate opened twice")
		}
		opened = true
		d.held[s.Handle]--
		return nil
	}, nil
}

// Gates is the number of gates queued so far; Held the number not opened.
func (d *Driver) Gates() (queued, held int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.held {
		held += n
	}
	return d.gates, held
}

// Copies returns the copies made so far.
func (d *Driver) Copies() []Copy {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Copy(nil), d.copies...)
}

// Allocs returns every allocation made so far.
func (d *Driver) Allocs() []Alloc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Alloc(nil), d.allocs...)
}

// Live is the number of buffers allocated and not freed.
func (d *Driver) Live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.live)
}

// PeerEnabled says whether peer access was enabled from device to peer.
func (d *Driver) PeerEnabled(dev, peer int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.enabled[[2]int{dev, peer}]
}

// Launch is one collective launch.
type Launch struct {
	Op    gpubench.Op
	Count int64
	Ranks int
}

// Collectives is a fake gpubench.Collectives over a fake Driver: an
// operation takes Time(op, bytes, ranks) on every rank's stream, bytes
// being the size nccl-tests prints.
type Collectives struct {
	Driver *Driver
	Time   func(op gpubench.Op, bytes int64, ranks int) time.Duration
	// Err, when set, is returned by Comms.
	Err error

	mu       sync.Mutex
	launches []Launch
}

// Name implements gpubench.Collectives.
func (c *Collectives) Name() string { return "fakeccl" }

// Version implements gpubench.Collectives.
func (c *Collectives) Version() string { return "2.0" }

// Comms implements gpubench.Collectives.
func (c *Collectives) Comms(devs []int) (gpubench.Comms, error) {
	if c.Err != nil {
		return nil, c.Err
	}
	return &comms{c: c, n: len(devs)}, nil
}

// Launches returns the launches made so far.
func (c *Collectives) Launches() []Launch {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Launch(nil), c.launches...)
}

type comms struct {
	c *Collectives
	n int
}

func (m *comms) Ranks() int { return m.n }

func (m *comms) Launch(op gpubench.Op, send, recv []gpubench.Buffer, count int64, streams []gpubench.Stream) error {
	if len(send) != m.n || len(recv) != m.n || len(streams) != m.n {
		return errors.New("fake: a launch must name every rank's buffers and stream")
	}
	bytes := count * 4
	if op != gpubench.AllReduce {
		bytes *= int64(m.n)
	}
	for i := range streams {
		need := count * 4
		if op == gpubench.AllGather {
			if recv[i].Bytes < need*int64(m.n) || send[i].Bytes < need {
				return errors.New("fake: all-gather buffers too small")
			}
		} else if op == gpubench.ReduceScatter {
			if send[i].Bytes < need*int64(m.n) || recv[i].Bytes < need {
				return errors.New("fake: reduce-scatter buffers too small")
			}
		} else if send[i].Bytes < need || recv[i].Bytes < need {
			return errors.New("fake: all-reduce buffers too small")
		}
		if err := m.c.Driver.Advance(streams[i], m.c.Time(op, bytes, m.n)); err != nil {
			return err
		}
	}
	m.c.mu.Lock()
	m.c.launches = append(m.c.launches, Launch{Op: op, Count: count, Ranks: m.n})
	m.c.mu.Unlock()
	return nil
}

func (m *comms) Close() error { return nil }
