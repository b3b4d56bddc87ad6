// Package kube runs kiln's image jobs on a Kubernetes node: each job is a
// ResourceClaim pinned by UUID to the GPUs kiln granted, and a Pod that
// uses it, in a namespace per project. Status, exit codes, logs and
// cancellation come from the Kubernetes API. It satisfies
// executor.Executor, so kiln's agent runs it as it runs containerd.
package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/executor"
)

// Labels kiln puts on what it creates.
const (
	LabelJob   = "kiln.dev/job"
	LabelLease = "kiln.dev/lease"
)

// Executor starts jobs as Pods on one node.
type Executor struct {
	Client kubernetes.Interface
	// Config is how Client reaches the apiserver; sessions (pods/exec)
	// need it. Without it the jobs open no sessions.
	Config *rest.Config
	// Node is the Kubernetes node the jobs run on.
	Node string
	// NamespacePrefix names the namespace of a project: prefix + project
	// (default "kiln-"); it is created when missing.
	NamespacePrefix string
	// Poll is how often a running job's Pod is read (default 1s).
	Poll time.Duration
	// Unschedulable is how long a job's Pod may stay unschedulable (the
	// scheduler finds no node and devices for it) before the job ends with
	// the scheduler's reason (default 2m): kiln's view of the node and the
	// cluster's disagree, and the lease must not hold GPUs for a Pod that
	// never runs.
	Unschedulable time.Duration
	Log           *slog.Logger
}

// Name is the executor's name, what the node tells the server.
func (e *Executor) Name() string { return "kubernetes" }

// NoCDI tells kiln's agent to write no CDI spec of the node's GPUs: on
// Kubernetes the DRA driver (kiln-dra plugin) prepares them per claim.
func (e *Executor) NoCDI() bool { return true }

// Start creates the job's claim and Pod and returns at once.
func (e *Executor) Start(ctx context.Context, job executor.Job) (executor.Handle, error) {
	if job.Image == "" {
		return nil, errors.New("a Kubernetes node runs images only: give the job an image")
	}
	project := job.Env["KILN_PROJECT"]
	if project == "" {
		project = "default"
	}
	prefix := e.NamespacePrefix
	if prefix == "" {
		prefix = "kiln-"
	}
	ns := prefix + project
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return nil, fmt.Errorf("project %q makes no namespace name: %s", project, strings.Join(errs, "; "))
	}
	if err := e.namespace(ctx, ns); err != nil {
		return nil, err
	}
	name := "kiln-" + strings.ToLower(job.ID)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return nil, fmt.Errorf("job %q makes no object name: %s", job.ID, strings.Join(errs, "; "))
	}
	labels := map[string]string{LabelJob: labelValue(job.ID), LabelLease: labelValue(job.LeaseID), "app.kubernetes.io/managed-by": "kiln"}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}}
	reqNames, err := deviceRequests(claim, job)
	if err != nil {
		return nil, err
	}
	var env []corev1.EnvVar
	keys := make([]string, 0, len(job.Env))
	for k := range job.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, corev1.EnvVar{Name: k, Value: job.Env[k]})
	}
	c := corev1.Container{Name: jobContainer, Image: job.Image, Command: job.Command, Env: env, WorkingDir: job.WorkDir}
	if len(reqNames) > 0 {
		c.Resources.Claims = []corev1.ResourceClaim{{Name: "gpus"}}
	}
	no := false
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  map[string]string{"kubernetes.io/hostname": e.Node},
			Containers:    []corev1.Container{c},
			// The job gets no credentials to the cluster it runs in.
			AutomountServiceAccountToken: &no,
		}}
	if len(reqNames) > 0 {
		if _, err := e.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating the claim for the job's GPUs: %w", err)
		}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: &claim.Name}}
	}
	if _, err := e.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		if len(reqNames) > 0 {
			_ = e.Client.ResourceV1().ResourceClaims(ns).Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
		}
		return nil, fmt.Errorf("creating the job's Pod: %w", err)
	}
	poll := e.Poll
	if poll <= 0 {
		poll = time.Second
	}
	h := &handle{e: e, ns: ns, name: name, claim: len(reqNames) > 0, poll: poll, done: make(chan struct{})}
	if choosing(job) {
		h.offered = job.Devices
	}
	return h, nil
}

// LetsSchedulerChoose: the kube-scheduler picks a job's devices among
// those offered (Job.Choose) when it schedules the job's Pod.
func (e *Executor) LetsSchedulerChoose() bool { return true }

// choosing says whether the scheduler is to pick some of the job's
// devices.
func choosing(job executor.Job) bool { return job.Choose > 0 && job.Choose < len(job.Devices) }

// pinned is the CEL expression that selects device d alone: by UUID, or
// by PCI address where the node's data give no UUID.
func pinned(d executor.Device) (string, error) {
	switch {
	case d.UUID != "":
		return fmt.Sprintf("device.attributes['%s'].%s == %q", dra.DriverName, dra.AttrUUID, d.UUID), nil
	case d.PCIAddress != "":
		return fmt.Sprintf("device.attributes['resource.kubernetes.io'].pciBusID == %q", d.PCIAddress), nil
	}
	return "", fmt.Errorf("GPU %d has neither a UUID nor a PCI address to pin the claim to", d.Index)
}

// deviceRequests fills the claim's requests: one per device, pinned to it,
// or, when the scheduler is to pick (Job.Choose), one request for that
// many devices among those offered. It returns the requests' names.
func deviceRequests(claim *resourceapi.ResourceClaim, job executor.Job) ([]string, error) {
	add := func(name string, count int64, expr string) {
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: dra.ClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}},
		}})
	}
	if choosing(job) {
		var any []string
		for _, d := range job.Devices {
			expr, err := pinned(d)
			if err != nil {
				return nil, err
			}
			any = append(any, expr)
		}
		add("gpus", int64(job.Choose), strings.Join(any, " || "))
		return []string{"gpus"}, nil
	}
	var names []string
	for i, d := range job.Devices {
		expr, err := pinned(d)
		if err != nil {
			return nil, err
		}
		rn := fmt.Sprintf("gpu%d", i)
		names = append(names, rn)
		add(rn, 1, expr)
	}
	return names, nil
}

func (e *Executor) namespace(ctx context.Context, ns string) error {
	_, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"app.kubernetes.io/managed-by": "kiln"}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	return nil
}

// labelValue makes s a label value (63 characters of [A-Za-z0-9-_.]).
func labelValue(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return strings.Trim(string(b), "-_.")
}

// handle is a job's Pod.
type handle struct {
	e             *Executor
	ns, name      string
	claim         bool
	poll          time.Duration
	mu            sync.Mutex
	stopRequested bool
	done          chan struct{}
	exit          executor.Exit
	once          sync.Once
	// offered are the devices the scheduler was to pick among (nil when
	// kiln pinned them); picked their positions once it has.
	offered []executor.Device
	picked  []int
	// neverRan: the job ended because its Pod could not be scheduled.
	neverRan bool
}

// Picked gives the positions in the job's devices of those the scheduler
// picked, once its claim is allocated; nil before, or when kiln pinned
// them.
func (h *handle) Picked() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.picked
}

// learnPick reads the job's claim once the scheduler allocated it and
// maps the devices it picked to the offered ones (through the node's
// ResourceSlices, which give each device's UUID and PCI address).
func (h *handle) learnPick(ctx context.Context) {
	h.mu.Lock()
	known := h.picked != nil || h.offered == nil
	h.mu.Unlock()
	if known {
		return
	}
	c, err := h.e.Client.ResourceV1().ResourceClaims(h.ns).Get(ctx, h.name, metav1.GetOptions{})
	if err != nil || c.Status.Allocation == nil {
		return
	}
	// The node's slices only: a cluster may have hundreds of nodes.
	list, err := h.e.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + dra.DriverName + ",spec.nodeName=" + h.e.Node})
	if err != nil {
		h.e.logf("reading the ResourceSlices to learn the devices the scheduler picked failed; trying again", "claim", h.ns+"/"+h.name, "err", err)
		return
	}
	picked, err := pickedDevices(c.Status.Allocation.Devices.Results, list.Items, h.offered)
	if err != nil {
		h.e.logf("the scheduler's pick cannot be matched to the offered devices", "claim", h.ns+"/"+h.name, "err", err)
		return
	}
	h.mu.Lock()
	h.picked = picked
	h.mu.Unlock()
}

// pickedDevices maps a claim's allocation to positions in offered: each
// result's device is found in its pool's slice and matched by UUID, or by
// PCI address.
func pickedDevices(results []resourceapi.DeviceRequestAllocationResult, pools []resourceapi.ResourceSlice, offered []executor.Device) ([]int, error) {
	var out []int
	for _, r := range results {
		if r.Driver != dra.DriverName {
			continue
		}
		var attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
		for i := range pools {
			s := &pools[i]
			if s.Spec.Driver != r.Driver || s.Spec.Pool.Name != r.Pool {
				continue
			}
			for j := range s.Spec.Devices {
				if s.Spec.Devices[j].Name == r.Device {
					attrs = s.Spec.Devices[j].Attributes
				}
			}
		}
		if attrs == nil {
			return nil, fmt.Errorf("device %s of pool %s is in no ResourceSlice", r.Device, r.Pool)
		}
		uuid, pci := dra.StringOf(attrs, dra.AttrUUID), dra.StringOf(attrs, dra.AttrPCIBusID)
		pos := slices.IndexFunc(offered, func(d executor.Device) bool {
			return d.UUID != "" && d.UUID == uuid || d.UUID == "" && d.PCIAddress != "" && d.PCIAddress == pci
		})
		if pos < 0 {
			return nil, fmt.Errorf("device %s of pool %s (uuid %q, PCI %q) was not offered", r.Device, r.Pool, uuid, pci)
		}
		out = append(out, pos)
	}
	if len(out) == 0 {
		return nil, errors.New("the allocation names no device of kiln's driver")
	}
	return out, nil
}

// Wait reads the Pod until it ends: its container's exit code, or the
// reason it will never run.
func (h *handle) Wait(ctx context.Context) (executor.Exit, error) {
	t := time.NewTicker(h.poll)
	defer t.Stop()
	grace := h.e.Unschedulable
	if grace <= 0 {
		grace = 2 * time.Minute
	}
	var stuckSince time.Time // first seen unschedulable
	for {
		p, err := h.e.Client.CoreV1().Pods(h.ns).Get(ctx, h.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			h.mu.Lock()
			stopped := h.stopRequested
			h.mu.Unlock()
			if stopped {
				return h.end(executor.Exit{Code: -1, Signal: "SIGKILL", Reason: "killed", Finished: time.Now()}), nil
			}
			return h.end(executor.Exit{Code: -1, Reason: "its Pod was deleted outside kiln", Finished: time.Now()}), nil
		case err != nil:
			h.e.logf("reading the job's Pod failed; trying again", "pod", h.ns+"/"+h.name, "err", err)
		case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
			h.learnPick(ctx)
			return h.end(exitOf(p)), nil
		case p.Spec.NodeName != "":
			h.learnPick(ctx) // scheduled: its claim is allocated
		default:
			why, stuck := unschedulable(p)
			switch {
			case !stuck:
				stuckSince = time.Time{}
			case stuckSince.IsZero():
				stuckSince = time.Now()
			case time.Since(stuckSince) >= grace:
				zero := int64(0)
				if err := h.e.Client.CoreV1().Pods(h.ns).Delete(ctx, h.name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
					h.e.logf("deleting the job's unschedulable Pod failed; trying again", "pod", h.ns+"/"+h.name, "err", err)
					break
				}
				h.neverRan = true // before end closes done: Logs reads it after
				return h.end(executor.Exit{Code: -1, Reason: fmt.Sprintf("its Pod could not be scheduled for %s: %s", grace, why), Finished: time.Now()}), nil
			}
		}
		select {
		case <-ctx.Done():
			return executor.Exit{}, ctx.Err()
		case <-t.C:
		}
	}
}

// unschedulable says whether the scheduler found no place for the Pod,
// and its message.
func unschedulable(p *corev1.Pod) (string, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			msg := c.Message
			if len(msg) > 512 {
				msg = msg[:512] + "..."
			}
			return msg, true
		}
	}
	return "", false
}

// end records the exit once and removes the claim with the Pod done.
func (h *handle) end(x executor.Exit) executor.Exit {
	h.once.Do(func() {
		h.exit = x
		if h.claim {
			_ = h.e.Client.ResourceV1().ResourceClaims(h.ns).Delete(context.Background(), h.name, metav1.DeleteOptions{})
		}
		close(h.done)
	})
	return h.exit
}

func exitOf(p *corev1.Pod) executor.Exit {
	x := executor.Exit{Code: -1, Reason: "exited", Finished: time.Now()}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			x.Code = int(t.ExitCode)
			if !t.FinishedAt.IsZero() {
				x.Finished = t.FinishedAt.Time
			}
			if t.Reason == "OOMKilled" {
				x.Reason = "killed: out of memory"
			}
			return x
		}
	}
	if p.Status.Phase == corev1.PodSucceeded {
		x.Code = 0
	} else if p.Status.Reason != "" {
		x.Reason = "failed: " + p.Status.Reason
	}
	return x
}

// Stop deletes the Pod with grace (Kubernetes sends SIGTERM, then SIGKILL)
// and then its claim.
func (h *handle) Stop(ctx context.Context, grace time.Duration) error {
	h.mu.Lock()
	h.stopRequested = true
	h.mu.Unlock()
	secs := int64(grace / time.Second)
	err := h.e.Client.CoreV1().Pods(h.ns).Delete(ctx, h.name, metav1.DeleteOptions{GracePeriodSeconds: &secs})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the job's Pod: %w", err)
	}
	return nil
}

// containerStarted reports whether the job's container of p runs or ran:
// its log can be read.
func containerStarted(p *corev1.Pod) bool {
	if p.Spec.NodeName == "" {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == jobContainer && (c.State.Running != nil || c.State.Terminated != nil) {
			return true
		}
	}
	return false
}

// Logs streams the Pod's log from the Kubernetes API; it waits for the
// container to start, and ends when the job ends.
func (h *handle) Logs() io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		t := time.NewTicker(h.poll)
		defer t.Stop()
		for {
			// The apiserver answers an empty log, not an error, for a Pod
			// not yet bound to a node: ask only once its container started.
			var rc io.ReadCloser
			p, err := h.e.Client.CoreV1().Pods(h.ns).Get(context.Background(), h.name, metav1.GetOptions{})
			if err == nil && !containerStarted(p) {
				err = errors.New("the job's container has not started")
			}
			if err == nil {
				rc, err = h.e.Client.CoreV1().Pods(h.ns).GetLogs(h.name, &corev1.PodLogOptions{Container: jobContainer, Follow: true}).Stream(context.Background())
			}
			if err == nil {
				_, err = io.Copy(pw, rc)
				rc.Close()
				pw.CloseWithError(err)
				return
			}
			select {
			case <-h.done:
				if h.neverRan {
					_, _ = io.WriteString(pw, "kiln: the job never ran: "+h.exit.Reason+"\n")
				}
				pw.Close()
				return
			case <-t.C:
			}
		}
	}()
	return pr
}

func (e *Executor) logf(msg string, args ...any) {
	if e.Log != nil {
		e.Log.Warn(msg, args...)
	}
}
