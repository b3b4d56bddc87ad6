// Package plugin is kiln's kubelet plugin for the DRA driver gpu.kiln.dev:
// it registers with the kubelet, publishes the node's ResourceSlices from
// its Snapshot (and again only when they change), prepares allocated
// devices for containers as CDI devices written per claim, keeps a
// checkpoint so that a restarted plugin unprepares what it prepared, and
// streams the devices' health.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/snapshot"
)

// Config says where the plugin runs and what it reads.
type Config struct {
	NodeName   string
	KubeClient kubernetes.Interface
	// Load returns the node's Snapshot now (live discovery on a node;
	// a recorded machine in tests and simulations).
	Load func(ctx context.Context) (*snapshot.Snapshot, error)
	// RegistrarDir is where the kubelet looks for plugins to register
	// (default /var/lib/kubelet/plugins_registry); PluginDir holds the DRA
	// socket (default /var/lib/kubelet/plugins/gpu.kiln.dev).
	RegistrarDir, PluginDir string
	// StateDir holds the checkpoint; default PluginDir.
	StateDir string
	// CDIDir is where the per-claim CDI specs go (default /var/run/cdi).
	CDIDir string
	// CDI says where the host's device facts and driver files are.
	CDI cdi.Options
	// DriverRoot, when set, is the host root searched for the NVIDIA
	// driver's user-space files of the running driver version, mounted into
	// containers with the GPUs.
	DriverRoot string
	// Recheck is how often the node is read and the doctor run again
	// (default 5 minutes).
	Recheck time.Duration
	// Shared says which GPUs are published as fractions (dra.ParseShared:
	// "all", "0,2"; empty: none). They are published whole where the
	// apiserver does not keep shared devices (ConsumableCapacity).
	Shared string
}

// Driver is a running plugin.
type Driver struct {
	cfg    Config
	helper *kubeletplugin.Helper
	log    *slog.Logger

	mu        sync.Mutex
	snap      *snapshot.Snapshot
	result    *dra.Result
	published []dra.Slice
	taints    map[string][]resourceapi.DeviceTaint // by device, as last published
	ckpt      *checkpoint
	// changed is closed and replaced when the devices' health changes.
	changed chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

// Start reads the node, publishes its slices, and serves the kubelet's
// registration and DRA services until ctx ends or Stop is called.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("the plugin needs the node's name (--node, or NODE_NAME from the downward API)")
	}
	if cfg.KubeClient == nil || cfg.Load == nil {
		return nil, errors.New("the plugin needs a Kubernetes client and a way to read the node")
	}
	if cfg.RegistrarDir == "" {
		cfg.RegistrarDir = kubeletplugin.KubeletRegistryDir
	}
	if cfg.PluginDir == "" {
		cfg.PluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, dra.DriverName)
	}
	if cfg.StateDir == "" {
		cfg.StateDir = cfg.PluginDir
	}
	if cfg.CDIDir == "" {
		cfg.CDIDir = cdi.DynamicDir
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = 5 * time.Minute
	}
	for _, dir := range []string{cfg.RegistrarDir, cfg.PluginDir, cfg.StateDir, cfg.CDIDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	ck, err := loadCheckpoint(filepath.Join(cfg.StateDir, checkpointFile))
	if err != nil {
		return nil, err
	}
	d := &Driver{
		cfg:     cfg,
		log:     slog.Default().With("driver", dra.DriverName, "node", cfg.NodeName),
		ckpt:    ck,
		taints:  map[string][]resourceapi.DeviceTaint{},
		changed: make(chan struct{}),
		done:    make(chan struct{}),
	}
	if err := d.refresh(ctx); err != nil {
		return nil, err
	}
	ctx, d.cancel = context.WithCancel(ctx)
	h, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(dra.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDir),
	)
	if err != nil {
		d.cancel()
		return nil, fmt.Errorf("starting the kubelet plugin: %w", err)
	}
	d.helper = h
	if err := d.publish(ctx); err != nil {
		h.Stop()
		d.cancel()
		return nil, err
	}
	go d.loop(ctx)
	return d, nil
}

// Stop ends the plugin's services; prepared claims stay in the checkpoint.
func (d *Driver) Stop() {
	d.cancel()
	<-d.done
	d.helper.Stop()
}

// RegistrationSocket and DRASocket are the plugin's two unix sockets.
func (d *Driver) RegistrationSocket() string {
	return filepath.Join(d.cfg.RegistrarDir, dra.DriverName+"-reg.sock")
}

// DRASocket is the socket of the DRA gRPC service.
func (d *Driver) DRASocket() string { return filepath.Join(d.cfg.PluginDir, "dra.sock") }

// Result is what the plugin last built for the node.
func (d *Driver) Result() *dra.Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.result
}

func (d *Driver) loop(ctx context.Context) {
	defer close(d.done)
	t := time.NewTicker(d.cfg.Recheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := d.refresh(ctx); err != nil {
				d.log.Error("reading the node again", "err", err)
				continue
			}
			if err := d.publish(ctx); err != nil {
				d.log.Error("publishing ResourceSlices", "err", err)
			}
		}
	}
}

// Recheck reads the node and runs the doctor now, and republishes if the
// slices changed.
func (d *Driver) Recheck(ctx context.Context) error {
	if err := d.refresh(ctx); err != nil {
		return err
	}
	return d.publish(ctx)
}

// refresh reads the node and builds its slices.
func (d *Driver) refresh(ctx context.Context) error {
	s, err := d.cfg.Load(ctx)
	if err != nil {
		return fmt.Errorf("reading the node: %w", err)
	}
	shared, err := dra.ParseShared(d.cfg.Shared, s)
	if err != nil {
		return err
	}
	if len(shared) > 0 && d.cfg.KubeClient != nil {
		ok, err := ConsumableCapacity(ctx, d.cfg.KubeClient, d.cfg.NodeName)
		switch {
		case err != nil:
			d.log.Warn("the GPUs to share are published whole: kiln could not tell whether the cluster shares devices", "gpus", shared, "err", err)
			shared = nil
		case !ok:
			d.log.Warn("this cluster does not enable DRAConsumableCapacity (a kube-apiserver and kube-scheduler feature gate, on by default since Kubernetes 1.36): the GPUs to share are published whole, one claim at a time", "gpus", shared)
			shared = nil
		}
	}
	r, err := dra.Build(ctx, dra.Input{Snapshot: s, NodeName: d.cfg.NodeName, Shared: shared})
	if err != nil {
		return err
	}
	for _, n := range r.Notes {
		d.log.Info("slices", "note", n)
	}
	d.mu.Lock()
	d.snap, d.result = s, r
	d.mu.Unlock()
	return nil
}

// publish hands the slices to the helper when they differ from what was
// published; taints added and cleared are logged one by one.
func (d *Driver) publish(ctx context.Context) error {
	d.mu.Lock()
	r := d.result
	if d.helper == nil || (d.published != nil && reflect.DeepEqual(d.published, r.Slices)) {
		d.mu.Unlock()
		return nil
	}
	d.published = r.Slices
	healthChanged := d.logTaints(r)
	if healthChanged {
		close(d.changed)
		d.changed = make(chan struct{})
	}
	d.mu.Unlock()
	var ss []resourceslice.Slice
	for _, s := range r.Slices {
		ss = append(ss, resourceslice.Slice{Devices: s.Devices, SharedCounters: s.SharedCounters})
	}
	d.log.Info("publishing ResourceSlices", "slices", len(ss), "devices", len(r.Devices()))
	return d.helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{d.cfg.NodeName: {Slices: ss}},
	})
}

// logTaints logs every taint added or cleared since the last publication
// and reports whether any changed. Called with d.mu held.
func (d *Driver) logTaints(r *dra.Result) bool {
	changed := false
	now := map[string][]resourceapi.DeviceTaint{}
	for _, dev := range r.Devices() {
		now[dev.Name] = dev.Taints
	}
	for name, ts := range now {
		for _, t := range ts {
			if !hasTaint(d.taints[name], t) {
				d.log.Warn("device tainted", "device", name, "key", t.Key, "value", t.Value, "effect", t.Effect)
				changed = true
			}
		}
	}
	for name, ts := range d.taints {
		for _, t := range ts {
			if !hasTaint(now[name], t) {
				d.log.Warn("device taint cleared: the doctor's re-check passed", "device", name, "key", t.Key)
				changed = true
			}
		}
	}
	d.taints = now
	return changed
}

func hasTaint(ts []resourceapi.DeviceTaint, t resourceapi.DeviceTaint) bool {
	return slices.ContainsFunc(ts, func(x resourceapi.DeviceTaint) bool {
		return x.Key == t.Key && x.Value == t.Value && x.Effect == t.Effect
	})
}

// HandleError logs errors the helper met in the background (publishing
// slices); a slice the apiserver refused is an error in kiln, logged as
// such.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		d.log.Error("the apiserver dropped fields of a ResourceSlice: it does not enable a feature kiln uses", "msg", msg, "err", err)
		return
	}
	d.log.Error(msg, "err", err)
}

// WatchHealthStatus sends the health of every device now, again when it
// changes, and at least every half health-check timeout.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	timeout := max(3*d.cfg.Recheck, 30*time.Second)
	for {
		d.mu.Lock()
		r, changed := d.result, d.changed
		d.mu.Unlock()
		rep := kubeletplugin.DeviceHealthReport{}
		for _, dev := range r.Devices() {
			h := kubeletplugin.HealthStatusHealthy
			var why []string
			for _, t := range dev.Taints {
				if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
					h = kubeletplugin.HealthStatusUnhealthy
				}
				why = append(why, strings.TrimPrefix(t.Key, dra.DriverName+"/")+"="+t.Value)
			}
			rep.Devices = append(rep.Devices, kubeletplugin.DeviceHealth{
				PoolName:           d.cfg.NodeName,
				DeviceName:         dev.Name,
				Health:             h,
				LastUpdated:        time.Now(),
				HealthCheckTimeout: timeout,
				Message:            strings.Join(why, ", "),
			})
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- rep:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-time.After(timeout / 2):
		}
	}
}

// claimKey is what the checkpoint keeps a claim under.
func claimKey(uid types.UID) string { return string(uid) }
