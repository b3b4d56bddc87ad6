package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"kiln.dev/kiln/cdi"
	"kiln.dev/kiln/dra"
)

// checkpointFile is the checkpoint's name in the state directory.
const checkpointFile = "checkpoint.json"

// checkpoint is what the plugin prepared, by claim UID, kept on disk so
// that a restarted plugin unprepares it.
type checkpoint struct {
	path   string
	Claims map[string]preparedClaim `json:"claims"`
}

// preparedClaim is one prepared claim.
type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	SpecFile  string           `json:"spec_file"`
	Devices   []preparedDevice `json:"devices"`
}

type preparedDevice struct {
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	CDIIDs   []string `json:"cdi_ids"`
	// ShareID is set where the claim holds a share of a device that other
	// claims may share (a fraction).
	ShareID string `json:"share_id,omitempty"`
}

func loadCheckpoint(p string) (*checkpoint, error) {
	ck := &checkpoint{path: p, Claims: map[string]preparedClaim{}}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return ck, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the checkpoint: %w", err)
	}
	if err := json.Unmarshal(b, ck); err != nil {
		return nil, fmt.Errorf("checkpoint %s is damaged (%v): move it away only once no pod on this node uses kiln's GPUs", p, err)
	}
	if ck.Claims == nil {
		ck.Claims = map[string]preparedClaim{}
	}
	return ck, nil
}

// save writes the checkpoint atomically.
func (c *checkpoint) save() error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp := c.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing the checkpoint: %w", err)
	}
	if err := os.Rename(tmp, c.path); err != nil {
		return fmt.Errorf("writing the checkpoint: %w", err)
	}
	return nil
}

// specName is the CDI spec file of a claim (without ".json").
func specName(uid types.UID) string { return "kiln.dev-claim-" + string(uid) }

// PrepareResourceClaims writes one CDI spec per claim with the devices
// allocated to it and records the claim in the checkpoint. A claim prepared
// before is answered from the checkpoint.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		pc, err := d.prepare(c)
		if err != nil {
			d.log.Error("preparing claim", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "err", err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		res := kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{}}
		for _, pd := range pc.Devices {
			res.Devices = append(res.Devices, kubeletplugin.Device{Requests: pd.Requests, PoolName: pd.Pool, DeviceName: pd.Device, CDIDeviceIDs: pd.CDIIDs})
		}
		out[c.UID] = res
	}
	return out, nil
}

func (d *Driver) prepare(c *resourceapi.ResourceClaim) (preparedClaim, error) {
	if pc, ok := d.ckpt.Claims[claimKey(c.UID)]; ok {
		return pc, nil
	}
	if c.Status.Allocation == nil {
		return preparedClaim{}, fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	// Devices held by other claims: alone, or as shares.
	inUse, sharedBy := map[string]string{}, map[string]string{}
	for uid, pc := range d.ckpt.Claims {
		for _, pd := range pc.Devices {
			who := pc.Namespace + "/" + pc.Name + " (" + uid + ")"
			if pd.ShareID != "" {
				sharedBy[pd.Device] = who
			} else {
				inUse[pd.Device] = who
			}
		}
	}
	opts := d.cfg.CDI
	if d.cfg.DriverRoot != "" && len(opts.NVIDIALibraries) == 0 {
		if v := d.snap.Drivers.NVIDIAUser; v != "" {
			opts.NVIDIALibraries, opts.NVIDIABinaries = cdi.FindNVIDIADriverFiles(os.DirFS(d.cfg.DriverRoot), v)
		}
	}
	gen, err := cdi.Generate(d.snap, opts)
	if err != nil {
		return preparedClaim{}, fmt.Errorf("describing the node's GPUs as CDI devices: %w", err)
	}
	byName := map[string]cdispec.Device{}
	for _, dev := range gen.Spec.Devices {
		byName[dev.Name] = dev
	}
	spec := &cdispec.Spec{Version: gen.Spec.Version, Kind: cdi.Kind, ContainerEdits: gen.Spec.ContainerEdits}
	pc := preparedClaim{Namespace: c.Namespace, Name: c.Name}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != dra.DriverName {
			continue
		}
		if r.Pool != d.cfg.NodeName {
			return preparedClaim{}, fmt.Errorf("device %s is in pool %s, not this node's (%s)", r.Device, r.Pool, d.cfg.NodeName)
		}
		if other, ok := inUse[r.Device]; ok {
			return preparedClaim{}, fmt.Errorf("device %s is already prepared for claim %s", r.Device, other)
		}
		t, ok := d.result.Targets[r.Device]
		if !ok {
			return preparedClaim{}, fmt.Errorf("device %s is not one of this node's devices (any more)", r.Device)
		}
		shareID := ""
		if r.ShareID != nil {
			shareID = string(*r.ShareID)
		}
		switch {
		case shareID != "" && !t.Shared:
			return preparedClaim{}, fmt.Errorf("device %s is allocated as a share, but this node does not share it", r.Device)
		case shareID == "":
			if other, ok := sharedBy[r.Device]; ok {
				return preparedClaim{}, fmt.Errorf("device %s is shared with claim %s, and this claim wants it alone", r.Device, other)
			}
		}
		edits, err := editsFor(t, byName)
		if err != nil {
			return preparedClaim{}, fmt.Errorf("device %s: %w", r.Device, err)
		}
		if mem, ok := r.ConsumedCapacity[dra.CapMemory]; ok && t.Shared {
			// The job's part of the shared GPU's memory, for it to size
			// itself by: time-sliced GPUs do not confine memory.
			edits.Env = append(append([]string(nil), edits.Env...), fmt.Sprintf("KILN_GPU_MEMORY_BYTES=%d", mem.Value()))
		}
		name := string(c.UID) + "-" + r.Device
		spec.Devices = append(spec.Devices, cdispec.Device{Name: name, ContainerEdits: edits})
		pc.Devices = append(pc.Devices, preparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, CDIIDs: []string{cdi.QualifiedName(name)}, ShareID: shareID})
	}
	if len(spec.Devices) > 0 {
		cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(d.cfg.CDIDir), cdiapi.WithAutoRefresh(false))
		if err != nil {
			return preparedClaim{}, fmt.Errorf("CDI directory %s: %w", d.cfg.CDIDir, err)
		}
		if err := cache.WriteSpec(spec, specName(c.UID)+".json"); err != nil {
			return preparedClaim{}, fmt.Errorf("writing the claim's CDI spec: %w", err)
		}
		pc.SpecFile = filepath.Join(d.cfg.CDIDir, specName(c.UID)+".json")
		if err := os.Chmod(pc.SpecFile, 0o644); err != nil {
			return preparedClaim{}, err
		}
	}
	d.ckpt.Claims[claimKey(c.UID)] = pc
	if err := d.ckpt.save(); err != nil {
		if pc.SpecFile != "" {
			os.Remove(pc.SpecFile)
		}
		delete(d.ckpt.Claims, claimKey(c.UID))
		return preparedClaim{}, err
	}
	d.log.Info("claim prepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "devices", len(pc.Devices), "spec", pc.SpecFile)
	return pc, nil
}

// editsFor picks the container edits of one device from kiln's CDI spec of
// the node: a GPU's own device, a MIG instance's, or for an AMD partition
// the GPU's device with only that partition's render node.
func editsFor(t dra.Target, byName map[string]cdispec.Device) (cdispec.ContainerEdits, error) {
	gpu, ok := byName[cdi.GPUName(t.GPUIndex)]
	switch {
	case t.MIG != nil:
		if !t.MIG.Exists {
			return cdispec.ContainerEdits{}, fmt.Errorf("no MIG %s instance exists at slot %d of GPU %d: kiln does not create MIG instances; create it (nvidia-smi mig -cgi %s -C) and let the plugin read the node again",
				t.MIG.Profile, t.MIG.Start, t.GPUIndex, t.MIG.Profile)
		}
		m, ok := byName[cdi.MIGName(t.GPUIndex, t.MIG.GPUInstance, t.MIG.ComputeInstance)]
		if !ok {
			return cdispec.ContainerEdits{}, fmt.Errorf("MIG instance %d:%d of GPU %d has no CDI device (its capability nodes could not be read)", t.MIG.GPUInstance, t.MIG.ComputeInstance, t.GPUIndex)
		}
		return m.ContainerEdits, nil
	case !ok:
		return cdispec.ContainerEdits{}, fmt.Errorf("GPU %d has no CDI device (its device nodes could not be read)", t.GPUIndex)
	case t.Partition >= 0:
		e := gpu.ContainerEdits
		var nodes []*cdispec.DeviceNode
		render := 0
		for _, n := range e.DeviceNodes {
			if strings.HasPrefix(n.Path, "/dev/dri/renderD") {
				if render != t.Partition {
					render++
					continue
				}
				render++
			}
			nodes = append(nodes, n)
		}
		if render <= t.Partition {
			return cdispec.ContainerEdits{}, fmt.Errorf("GPU %d: no render node for partition %d", t.GPUIndex, t.Partition)
		}
		e.DeviceNodes = nodes
		return e, nil
	}
	return gpu.ContainerEdits, nil
}

// UnprepareResourceClaims removes the claims' CDI specs and forgets them; a
// claim the plugin never prepared (or already unprepared) is not an error.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = d.unprepare(c)
	}
	return out, nil
}

func (d *Driver) unprepare(c kubeletplugin.NamespacedObject) error {
	pc, ok := d.ckpt.Claims[claimKey(c.UID)]
	if !ok {
		return nil
	}
	if pc.SpecFile != "" {
		if err := os.Remove(pc.SpecFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing the claim's CDI spec: %w", err)
		}
	}
	delete(d.ckpt.Claims, claimKey(c.UID))
	if err := d.ckpt.save(); err != nil {
		d.ckpt.Claims[claimKey(c.UID)] = pc
		return err
	}
	d.log.Info("claim unprepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
	return nil
}
