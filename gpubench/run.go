package gpubench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"kiln.dev/kiln/snapshot"
)

// Options of a run.
type Options struct {
	Plan Plan
	// Collectives is the collective library; nil when none was found
	// (collectives are then not measured, and a note says so).
	Collectives Collectives
	// CollectivesMissing says why there is no collective library, for the
	// note ("libnccl.so.2 not found").
	CollectivesMissing string
	// Progress, when set, is called before each test and once at the end
	// (done == total).
	Progress func(done, total int, test string)
}

// Run measures what the plan asks on the driver's GPUs and returns the
// figures, not yet judged (see Judge), with the devices measured. A test
// that fails is kept with its error and the run goes on; Run fails only
// when nothing can be measured or ctx ends (then with what was measured).
func Run(ctx context.Context, d Driver, opt Options) (*snapshot.Measurements, []Device, error) {
	p := opt.Plan
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	all, err := d.Devices()
	if err != nil {
		return nil, nil, err
	}
	if len(all) == 0 {
		return nil, nil, NoDriver(fmt.Errorf("the %s driver sees no GPU", d.Name()))
	}
	devs := all
	if len(p.Devices) > 0 {
		devs = nil
		for _, o := range p.Devices {
			i := slices.IndexFunc(all, func(x Device) bool { return x.Ordinal == o })
			if i < 0 {
				return nil, nil, fmt.Errorf("GPU %d: the %s driver sees GPUs 0 to %d", o, d.Name(), len(all)-1)
			}
			devs = append(devs, all[i])
		}
	}
	out := &snapshot.Measurements{
		Tool:             "kiln bench",
		Driver:           d.Name(),
		DriverVersion:    d.Version(),
		ThresholdPercent: DefaultThresholdPercent,
		Results:          []snapshot.Measurement{},
	}
	tasks, notes := p.tasks(devs, d.HostNUMANodes())
	out.Notes = append(out.Notes, notes...)

	r := &runner{d: d, p: p, devs: devs, streams: map[int]Stream{}, events: map[evKey]Event{}, bufs: map[bufKey]Buffer{}, peer: map[[2]int]bool{}}
	defer r.close()

	var comms Comms
	var ctasks []task
	if p.runs(GroupCollective) {
		switch c := opt.Collectives; {
		case c == nil:
			why := opt.CollectivesMissing
			if why == "" {
				why = "no NCCL or RCCL library"
			}
			out.Notes = append(out.Notes, "collectives not measured: "+why)
		case len(devs) < 2 && !multiNode(c):
			out.Notes = append(out.Notes, "collectives not measured: one GPU")
		default:
			out.Collectives = c.Name() + " " + c.Version()
			comms, err = c.Comms(ordinals(devs))
			if err != nil {
				out.Notes = append(out.Notes, fmt.Sprintf("collectives not measured: %s could not make communicators: %v", c.Name(), err))
				comms = nil
			} else {
				r.comms = comms
				if comms.Ranks() > len(devs) {
					out.Ranks = comms.Ranks()
				}
				ctasks = p.collectiveTasks(devs, comms.Ranks())
			}
		}
	}

	total := len(tasks) + len(ctasks)
	done := 0
	progress := func(what string) {
		if opt.Progress != nil {
			opt.Progress(done, total, what)
		}
	}
	for _, t := range append(tasks, ctasks...) {
		progress(t.String())
		if err := ctx.Err(); err != nil {
			out.Notes = append(out.Notes, r.notes...)
			return out, devs, err
		}
		m, keep := r.measure(ctx, t)
		if m.Error != "" {
			slog.Debug("bench test failed", "test", t.String(), "err", m.Error)
		}
		if keep {
			out.Results = append(out.Results, m)
		}
		done++
	}
	progress("")
	out.Notes = append(out.Notes, r.notes...)
	return out, devs, ctx.Err()
}

// multiNode is implemented by collective libraries whose communicators
// span several nodes (a gang's ranks).
type multiNoder interface{ MultiNode() bool }

func multiNode(c Collectives) bool {
	m, ok := c.(multiNoder)
	return ok && m.MultiNode()
}

func ordinals(devs []Device) []int {
	out := make([]int, len(devs))
	for i, d := range devs {
		out[i] = d.Ordinal
	}
	return out
}

type evKey struct {
	dev  int
	name string
}

type bufKey struct {
	kind MemKind
	// where is the device ordinal or the NUMA node.
	where int
	slot  int
	bytes int64
}

// runner holds what a run allocated, reused across tests and freed at the
// end.
type runner struct {
	d       Driver
	p       Plan
	devs    []Device
	streams map[int]Stream
	events  map[evKey]Event
	bufs    map[bufKey]Buffer
	order   []bufKey
	peer    map[[2]int]bool
	comms   Comms
	notes   []string
	// placementNoted is set once the run said host memory could not be
	// placed.
	placementNoted bool
	// gateFailed is set once the driver could not hold a stream.
	gateFailed bool
}

// note keeps a note for the run's results, once.
func (r *runner) note(n string) {
	if !slices.Contains(r.notes, n) {
		r.notes = append(r.notes, n)
	}
}

func (r *runner) close() {
	if r.comms != nil {
		if err := r.comms.Close(); err != nil {
			slog.Debug("closing communicators", "err", err)
		}
	}
	for _, k := range r.order {
		if err := r.d.Free(r.bufs[k]); err != nil {
			slog.Debug("freeing a buffer", "kind", k.kind, "err", err)
		}
	}
	for _, e := range r.events {
		_ = r.d.DestroyEvent(e)
	}
	for _, s := range r.streams {
		_ = r.d.DestroyStream(s)
	}
}

func (r *runner) stream(dev int) (Stream, error) {
	if s, ok := r.streams[dev]; ok {
		return s, nil
	}
	s, err := r.d.NewStream(dev)
	if err != nil {
		return Stream{}, fmt.Errorf("creating a stream on GPU%d: %w", dev, err)
	}
	r.streams[dev] = s
	return s, nil
}

func (r *runner) event(dev int, name string) (Event, error) {
	k := evKey{dev, name}
	if e, ok := r.events[k]; ok {
		return e, nil
	}
	e, err := r.d.NewEvent(dev)
	if err != nil {
		return Event{}, fmt.Errorf("creating an event on GPU%d: %w", dev, err)
	}
	r.events[k] = e
	return e, nil
}

func (r *runner) devBuf(dev, slot int, bytes int64) (Buffer, error) {
	k := bufKey{DeviceMemory, dev, slot, bytes}
	if b, ok := r.bufs[k]; ok {
		return b, nil
	}
	b, err := r.d.AllocDevice(dev, bytes)
	if err != nil {
		return Buffer{}, fmt.Errorf("allocating %s on GPU%d: %w", sizeText(bytes), dev, err)
	}
	r.bufs[k] = b
	r.order = append(r.order, k)
	return b, nil
}

func (r *runner) hostBuf(kind MemKind, node int, bytes int64) (Buffer, error) {
	k := bufKey{kind, node, 0, bytes}
	if b, ok := r.bufs[k]; ok {
		return b, nil
	}
	b, err := r.d.AllocHost(bytes, kind == HostPinned, node)
	if err != nil {
		where := ""
		if node != AnyNode {
			where = fmt.Sprintf(" on NUMA node %d", node)
		}
		return Buffer{}, fmt.Errorf("allocating %s of %s host memory%s: %w", sizeText(bytes), kind, where, err)
	}
	r.bufs[k] = b
	r.order = append(r.order, k)
	return b, nil
}

// peerAccess enables direct access from dev to peer's memory where the
// driver offers it, once per pair, and says whether it is on.
func (r *runner) peerAccess(dev, peer int) bool {
	k := [2]int{dev, peer}
	if v, ok := r.peer[k]; ok {
		return v
	}
	ok, err := r.d.CanAccessPeer(dev, peer)
	if err == nil && ok {
		if err = r.d.EnablePeerAccess(dev, peer); err != nil {
			ok = false
		}
	}
	if err != nil {
		slog.Debug("peer access", "gpu", dev, "peer", peer, "err", err)
		ok = false
	}
	r.peer[k] = ok
	return ok
}

func (r *runner) device(o int) Device {
	for _, d := range r.devs {
		if d.Ordinal == o {
			return d
		}
	}
	return Device{Ordinal: o}
}

// leg is one stream of copies in a timed run.
type leg struct {
	dst, src Buffer
	stream   Stream
}

// timeLegs runs the legs' copies at once (each leg on its own stream),
// copies copies of bytes each per leg, after the plan's warm-up runs, and
// returns the elapsed time of each repetition: from an event before the
// first leg's copies, which the other legs wait for, to one after the last
// leg has finished, all on the first leg's GPU.
//
// With gate, and a driver that can hold a stream (Gater), the first leg's
// stream is held until everything is queued: the time is then the GPU's,
// not how fast the host queues small copies.
func (r *runner) timeLegs(ctx context.Context, legs []leg, bytes int64, copies int, gate bool) ([]time.Duration, error) {
	lead := legs[0].stream
	start, err := r.event(lead.Device, "start")
	if err != nil {
		return nil, err
	}
	end, err := r.event(lead.Device, "end")
	if err != nil {
		return nil, err
	}
	others := make([]Event, len(legs)-1)
	for i, l := range legs[1:] {
		if others[i], err = r.event(l.stream.Device, fmt.Sprintf("leg%d", i+1)); err != nil {
			return nil, err
		}
	}
	gater, _ := r.d.(Gater)
	once := func() (time.Duration, error) {
		// release opens the gate, if any: once everything is queued, and
		// in any case before returning.
		release := func() {}
		if gate && gater != nil && !r.gateFailed {
			open, err := gater.Gate(lead)
			if err != nil {
				r.gateFailed = true
				r.note(fmt.Sprintf("latency runs were not held until queued (%v): they include the time the host takes to queue each copy", err))
			} else {
				opened := false
				release = func() {
					if !opened {
						opened = true
						if err := open(); err != nil {
							slog.Debug("opening a stream gate", "err", err)
						}
					}
				}
				defer release()
			}
		}
		if err := r.d.Record(start, lead); err != nil {
			return 0, err
		}
		for _, l := range legs[1:] {
			if err := r.d.Wait(l.stream, start); err != nil {
				return 0, err
			}
		}
		for _, l := range legs {
			for range copies {
				if err := r.d.Copy(l.dst, l.src, bytes, l.stream); err != nil {
					return 0, err
				}
			}
		}
		for i, l := range legs[1:] {
			if err := r.d.Record(others[i], l.stream); err != nil {
				return 0, err
			}
			if err := r.d.Wait(lead, others[i]); err != nil {
				return 0, err
			}
		}
		if err := r.d.Record(end, lead); err != nil {
			return 0, err
		}
		release()
		if err := r.d.Sync(end); err != nil {
			return 0, err
		}
		return r.d.Elapsed(start, end)
	}
	return r.repeat(ctx, once)
}

// repeat makes the warm-up runs, then the timed ones.
func (r *runner) repeat(ctx context.Context, once func() (time.Duration, error)) ([]time.Duration, error) {
	for range r.p.Warmup {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if _, err := once(); err != nil {
			return nil, err
		}
	}
	out := make([]time.Duration, 0, r.p.Repetitions)
	for range r.p.Repetitions {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := once()
		if err != nil {
			return nil, err
		}
		if d <= 0 {
			return nil, fmt.Errorf("the driver timed a run at %v: timer not usable", d)
		}
		out = append(out, d)
	}
	return out, nil
}

// errSkipped is returned by a test that cannot mean anything here (host
// memory on another NUMA node where memory cannot be placed at all); the
// run leaves it out, and a note says why.
var errSkipped = errors.New("skipped")

// measure runs one test; a failure is returned inside the measurement,
// and keep is false for a test left out.
func (r *runner) measure(ctx context.Context, t task) (m snapshot.Measurement, keep bool) {
	m = snapshot.Measurement{
		Test:        t.test,
		GPUs:        slices.Clone(t.devs),
		Warmup:      r.p.Warmup,
		Repetitions: r.p.Repetitions,
		Bytes:       r.p.Bytes,
		Copies:      1,
	}
	for _, o := range t.devs {
		m.Devices = append(m.Devices, r.device(o).PCI)
	}
	var err error
	switch t.test {
	case TestH2D, TestD2H:
		err = r.host(ctx, t, &m)
	case TestDevice:
		err = r.deviceMemory(ctx, t, &m)
	case TestP2P, TestP2PBidi:
		err = r.p2p(ctx, t, &m)
	case TestP2PLatency:
		err = r.latency(ctx, t, &m)
	default:
		err = r.collective(ctx, t, &m)
	}
	if errors.Is(err, errSkipped) {
		return m, false
	}
	if err != nil {
		m.Verdict = snapshot.VerdictFailed
		m.Error = err.Error()
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			m.Error = "stopped: " + err.Error()
		}
	}
	return m, true
}

func (r *runner) host(ctx context.Context, t task, m *snapshot.Measurement) error {
	m.Memory = t.memory.String()
	m.Direction = "uni"
	if t.node != AnyNode {
		n := t.node
		m.HostNUMANode = &n
		m.HostLocal = t.local
	}
	dev := t.devs[0]
	s, err := r.stream(dev)
	if err != nil {
		return err
	}
	db, err := r.devBuf(dev, 0, r.p.Bytes)
	if err != nil {
		return err
	}
	hb, err := r.hostBuf(t.memory, t.node, r.p.Bytes)
	if err != nil && errors.Is(err, ErrPlacement) && t.local != nil {
		// Nodes cannot be asked for (no NUMA support, a container that
		// forbids mbind): the GPU's own node is measured from memory
		// wherever the kernel puts it, the other node not at all.
		if !*t.local {
			r.note(fmt.Sprintf("host memory could not be bound to NUMA node %d, so transfers from it were not measured (%v)", t.node, errors.Unwrap(err)))
			return errSkipped
		}
		if !r.placementNoted {
			r.placementNoted = true
			r.note(fmt.Sprintf("host memory could not be bound to a GPU's own NUMA node, so it was measured from memory the kernel placed (%v)", errors.Unwrap(err)))
		}
		m.HostNUMANode, m.HostLocal = nil, nil
		hb, err = r.hostBuf(t.memory, AnyNode, r.p.Bytes)
	}
	if err != nil {
		return err
	}
	l := leg{dst: db, src: hb, stream: s}
	if t.test == TestD2H {
		l = leg{dst: hb, src: db, stream: s}
	}
	ds, err := r.timeLegs(ctx, []leg{l}, r.p.Bytes, 1, false)
	if err != nil {
		return err
	}
	setGBps(m, r.p.Bytes, ds)
	return nil
}

// deviceMemory copies within one GPU: every byte is read and written, so
// the figure counts both (read+write), as memory bandwidth is rated.
func (r *runner) deviceMemory(ctx context.Context, t task, m *snapshot.Measurement) error {
	m.Direction = "read+write"
	dev := t.devs[0]
	s, err := r.stream(dev)
	if err != nil {
		return err
	}
	src, err := r.devBuf(dev, 0, r.p.Bytes)
	if err != nil {
		return err
	}
	dst, err := r.devBuf(dev, 1, r.p.Bytes)
	if err != nil {
		return err
	}
	ds, err := r.timeLegs(ctx, []leg{{dst: dst, src: src, stream: s}}, r.p.Bytes, 1, false)
	if err != nil {
		return err
	}
	setGBps(m, 2*r.p.Bytes, ds)
	return nil
}

// p2p copies from the first GPU to the second on the first GPU's stream
// (the source writes into its peer), and for bidi from the second to the
// first at the same time on the second's.
func (r *runner) p2p(ctx context.Context, t task, m *snapshot.Measurement) error {
	a, b := t.devs[0], t.devs[1]
	access := r.peerAccess(a, b)
	legs := []leg{{}}
	m.Direction = "uni"
	if t.test == TestP2PBidi {
		access = r.peerAccess(b, a) && access
		legs = append(legs, leg{})
		m.Direction = "bidi"
	}
	m.PeerAccess = &access
	var err error
	for i, pair := range [][2]int{{a, b}, {b, a}}[:len(legs)] {
		src, dst := pair[0], pair[1]
		if legs[i].stream, err = r.stream(src); err != nil {
			return err
		}
		if legs[i].src, err = r.devBuf(src, 0, r.p.Bytes); err != nil {
			return err
		}
		if legs[i].dst, err = r.devBuf(dst, 1, r.p.Bytes); err != nil {
			return err
		}
	}
	ds, err := r.timeLegs(ctx, legs, r.p.Bytes, 1, false)
	if err != nil {
		return err
	}
	setGBps(m, int64(len(legs))*r.p.Bytes, ds)
	return nil
}

// latency times LatencyCopies small copies from the first GPU to the
// second, back to back, queued behind a held stream where the driver can
// hold one: the figure is the time of one on the GPU, the copy engine's
// setup included (it is not a load-to-use latency).
func (r *runner) latency(ctx context.Context, t task, m *snapshot.Measurement) error {
	a, b := t.devs[0], t.devs[1]
	access := r.peerAccess(a, b)
	m.PeerAccess = &access
	m.Direction = "uni"
	m.Bytes = r.p.LatencyBytes
	m.Copies = r.p.LatencyCopies
	s, err := r.stream(a)
	if err != nil {
		return err
	}
	src, err := r.devBuf(a, 0, r.p.Bytes)
	if err != nil {
		return err
	}
	dst, err := r.devBuf(b, 1, r.p.Bytes)
	if err != nil {
		return err
	}
	ds, err := r.timeLegs(ctx, []leg{{dst: dst, src: src, stream: s}}, min(r.p.LatencyBytes, r.p.Bytes), r.p.LatencyCopies, true)
	if err != nil {
		return err
	}
	us := make([]float64, len(ds))
	for i, d := range ds {
		us[i] = float64(d) / float64(time.Microsecond) / float64(r.p.LatencyCopies)
	}
	st := summarize(us)
	m.MedianUS, m.MinUS, m.MaxUS = st.Median, st.Min, st.Max
	return nil
}

// collective runs one operation over every local rank; each run's time is
// the longest any rank took between events on its stream before and
// after the operation. The size is what nccl-tests prints: the buffer for
// all-reduce, the whole gathered buffer for all-gather, the whole buffer
// scattered for reduce-scatter.
func (r *runner) collective(ctx context.Context, t task, m *snapshot.Measurement) error {
	n := r.comms.Ranks()
	m.Direction = "bus"
	elems := r.p.CollectiveBytes / 4
	count := elems
	if t.op != AllReduce {
		count = elems / int64(n)
		elems = count * int64(n)
	}
	size := elems * 4
	m.Bytes = size
	if count == 0 {
		return fmt.Errorf("a collective of %s over %d ranks leaves no element per rank: give a larger size", sizeText(r.p.CollectiveBytes), n)
	}
	local := len(t.devs)
	send := make([]Buffer, local)
	recv := make([]Buffer, local)
	streams := make([]Stream, local)
	starts := make([]Event, local)
	ends := make([]Event, local)
	var err error
	for i, dev := range t.devs {
		if streams[i], err = r.stream(dev); err != nil {
			return err
		}
		if send[i], err = r.devBuf(dev, 2, r.p.CollectiveBytes); err != nil {
			return err
		}
		if recv[i], err = r.devBuf(dev, 3, r.p.CollectiveBytes); err != nil {
			return err
		}
		if starts[i], err = r.event(dev, "cstart"); err != nil {
			return err
		}
		if ends[i], err = r.event(dev, "cend"); err != nil {
			return err
		}
	}
	once := func() (time.Duration, error) {
		for i := range t.devs {
			if err := r.d.Record(starts[i], streams[i]); err != nil {
				return 0, err
			}
		}
		if err := r.comms.Launch(t.op, send, recv, count, streams); err != nil {
			return 0, err
		}
		var longest time.Duration
		for i := range t.devs {
			if err := r.d.Record(ends[i], streams[i]); err != nil {
				return 0, err
			}
		}
		for i := range t.devs {
			if err := r.d.Sync(ends[i]); err != nil {
				return 0, err
			}
			d, err := r.d.Elapsed(starts[i], ends[i])
			if err != nil {
				return 0, err
			}
			longest = max(longest, d)
		}
		return longest, nil
	}
	ds, err := r.repeat(ctx, once)
	if err != nil {
		return err
	}
	alg := make([]float64, len(ds))
	for i, d := range ds {
		alg[i] = gbps(size, d)
	}
	f := BusFactor(t.op, n)
	st := summarize(alg)
	m.AlgGBps = st.Median
	m.MedianGBps, m.MinGBps, m.MaxGBps = st.Median*f, st.Min*f, st.Max*f
	return nil
}

// setGBps sets a measurement's bandwidth from bytes moved per run.
func setGBps(m *snapshot.Measurement, bytes int64, ds []time.Duration) {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = gbps(bytes, d)
	}
	st := summarize(xs)
	m.MedianGBps, m.MinGBps, m.MaxGBps = st.Median, st.Min, st.Max
}

// sizeText prints a byte count in binary units.
func sizeText(b int64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", b>>30)
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%d B", b)
}

// SizeText prints a byte count in binary units (256 MiB).
func SizeText(b int64) string { return sizeText(b) }
