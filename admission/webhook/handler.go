package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kiln.dev/kiln/admission"
	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/kb"
)

// Images reads what kiln compat needs of an image.
type Images interface {
	Read(ctx context.Context, ref string, creds []DockerConfig) (*compat.Requirements, error)
}

// Cluster is what the webhook reads of the cluster.
type Cluster interface {
	Slices(ctx context.Context) ([]resourceapi.ResourceSlice, error)
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// PullSecrets returns the named dockerconfigjson Secrets of the
	// namespace; a Secret that is missing or of another type is skipped.
	PullSecrets(ctx context.Context, namespace string, names []string) ([]DockerConfig, error)
	// ClaimSpec is the spec of a Pod's claim: of the ResourceClaim or of
	// the ResourceClaimTemplate it names.
	ClaimSpec(ctx context.Context, namespace string, c corev1.PodResourceClaim) (*resourceapi.ResourceClaimSpec, error)
}

// Config sets up the webhook.
type Config struct {
	Images  Images
	Cluster Cluster
	KB      *kb.KB
	// Timeout bounds reading the images of one review (default 8s, under
	// the apiserver's 10s): an image not read by then is a warning.
	Timeout time.Duration
	// SkipNamespaces are never checked (default kube-system, kube-public,
	// kube-node-lease).
	SkipNamespaces []string
	Log            *slog.Logger
}

// Paths the webhook serves.
const (
	PathPods   = "/validate-pods"
	PathClaims = "/mutate-claims"
)

// maxReview bounds an AdmissionReview's body (the apiserver's own limit
// for objects is 3 MiB).
const maxReview = 6 << 20

// Handler serves the reviews.
func Handler(cfg Config) http.Handler {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 8 * time.Second
	}
	if cfg.SkipNamespaces == nil {
		cfg.SkipNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}
	}
	if cfg.KB == nil {
		cfg.KB = kb.Default()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h := &handler{cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+PathPods, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, h.pod) })
	mux.HandleFunc("POST "+PathClaims, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, h.claim) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	return mux
}

type handler struct{ cfg Config }

// errInternal marks a failure of the webhook itself: the apiserver is
// answered 500 and applies the webhook's failure policy.
type errInternal struct{ err error }

func (e errInternal) Error() string { return e.err.Error() }

func (h *handler) serve(w http.ResponseWriter, r *http.Request, decide func(context.Context, *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error)) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReview+1))
	if err != nil || len(body) > maxReview {
		http.Error(w, "the review could not be read or is over 6 MiB", http.StatusRequestEntityTooLarge)
		return
	}
	var rev admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &rev); err != nil || rev.Request == nil {
		http.Error(w, "not an AdmissionReview with a request", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout+2*time.Second)
	defer cancel()
	resp, err := decide(ctx, rev.Request)
	if err != nil {
		h.cfg.Log.Error("admission review failed", "uid", rev.Request.UID, "kind", rev.Request.Kind.Kind, "err", err)
		var ie errInternal
		if errors.As(err, &ie) {
			http.Error(w, "kiln webhook: "+err.Error(), http.StatusInternalServerError)
			return
		}
		resp = &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Code: http.StatusBadRequest, Message: "kiln: " + err.Error()}}
	}
	resp.UID = rev.Request.UID
	out := admissionv1.AdmissionReview{TypeMeta: rev.TypeMeta, Response: resp}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func allow() *admissionv1.AdmissionResponse { return &admissionv1.AdmissionResponse{Allowed: true} }

func (h *handler) skip(ns string) bool { return slices.Contains(h.cfg.SkipNamespaces, ns) }

// pod refuses a Pod with GPU claims whose images run on no device.
func (h *handler) pod(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
	if req.Kind.Kind != "Pod" || req.Operation != admissionv1.Create || h.skip(req.Namespace) {
		return allow(), nil
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return nil, fmt.Errorf("the Pod does not decode: %w", err)
	}
	if !h.asksForKiln(ctx, req.Namespace, &pod) {
		return allow(), nil // no claim of kiln's devices: not kiln's to judge
	}
	images, devs, err := h.read(ctx, req.Namespace, &pod)
	if err != nil {
		return nil, err
	}
	d := admission.Pod(images, devs, h.cfg.KB)
	resp := &admissionv1.AdmissionResponse{Allowed: d.Allowed, Warnings: d.Warnings}
	if !d.Allowed {
		resp.Result = &metav1.Status{Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: d.Message}
	}
	return resp, nil
}

// claim adds to a claim made for a Pod the selectors that keep it on the
// devices that run the Pod's images.
func (h *handler) claim(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
	if req.Kind.Kind != "ResourceClaim" || req.Operation != admissionv1.Create || h.skip(req.Namespace) {
		return allow(), nil
	}
	var c resourceapi.ResourceClaim
	if err := json.Unmarshal(req.Object.Raw, &c); err != nil {
		return nil, fmt.Errorf("the ResourceClaim does not decode: %w", err)
	}
	owner := ""
	for _, o := range c.OwnerReferences {
		if o.Kind == "Pod" && o.APIVersion == "v1" {
			owner = o.Name
		}
	}
	if owner == "" || !usesKiln(&c) {
		return allow(), nil // no Pod to read images from, or not kiln's devices
	}
	pod, err := h.cfg.Cluster.Pod(ctx, req.Namespace, owner)
	if err != nil {
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{fmt.Sprintf("kiln could not read pod %s, so the claim's devices are not narrowed to those that run its images: %v", owner, err)}}, nil
	}
	images, devs, err := h.read(ctx, req.Namespace, pod)
	if err != nil {
		return nil, err
	}
	sel, err := admission.Selectors(images, devs, h.cfg.KB)
	if err != nil {
		return &admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{"kiln: the claim's devices are not narrowed: " + err.Error()}}, nil
	}
	reqs := c.Spec.Devices.Requests
	for i := range reqs {
		if e := reqs[i].Exactly; e != nil && isKilnClass(e.DeviceClassName) {
			e.Selectors = append(e.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: sel.CEL}})
		}
		for j := range reqs[i].FirstAvailable {
			if sr := &reqs[i].FirstAvailable[j]; isKilnClass(sr.DeviceClassName) {
				sr.Selectors = append(sr.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: sel.CEL}})
			}
		}
	}
	patch, err := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/devices/requests", "value": reqs}})
	if err != nil {
		return nil, errInternal{err}
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &pt}, nil
}

// read reads the Pod's images (with its pull secrets, within the
// timeout) and the cluster's devices.
func (h *handler) read(ctx context.Context, ns string, pod *corev1.Pod) ([]admission.Image, []admission.Device, error) {
	rs, err := h.cfg.Cluster.Slices(ctx)
	if err != nil {
		return nil, nil, errInternal{fmt.Errorf("listing ResourceSlices: %w", err)}
	}
	var names []string
	for _, s := range pod.Spec.ImagePullSecrets {
		names = append(names, s.Name)
	}
	creds, err := h.cfg.Cluster.PullSecrets(ctx, ns, names)
	if err != nil {
		return nil, nil, errInternal{fmt.Errorf("reading pull secrets: %w", err)}
	}
	ictx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	var refs []string
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Image != "" && !slices.Contains(refs, c.Image) {
			refs = append(refs, c.Image)
		}
	}
	type result struct {
		i   int
		req *compat.Requirements
		err error
	}
	results := make([]result, len(refs))
	for i := range results {
		results[i] = result{i: i, err: fmt.Errorf("not read within %s (is the registry reachable?)", h.cfg.Timeout)}
	}
	done := make(chan result, len(refs)) // a read that ends late never blocks
	for i, ref := range refs {
		go func() {
			req, err := h.cfg.Images.Read(ictx, ref, creds)
			done <- result{i, req, err}
		}()
	}
wait:
	for n := 0; n < len(refs); n++ {
		select {
		case r := <-done:
			results[r.i] = r
		case <-ictx.Done():
			break wait
		}
	}
	var images []admission.Image
	for i, ref := range refs {
		images = append(images, admission.Image{Ref: ref, Requirements: results[i].req, Err: results[i].err})
	}
	return images, admission.Devices(rs), nil
}

// asksForKiln is true when a claim of the Pod asks for kiln's devices, or
// a claim cannot be read (then kiln checks rather than guess).
func (h *handler) asksForKiln(ctx context.Context, ns string, pod *corev1.Pod) bool {
	for _, pc := range pod.Spec.ResourceClaims {
		spec, err := h.cfg.Cluster.ClaimSpec(ctx, ns, pc)
		if err != nil || spec == nil || specUsesKiln(spec) {
			return true
		}
	}
	return false
}

// usesKiln is true when a request of the claim names one of kiln's
// DeviceClasses.
func usesKiln(c *resourceapi.ResourceClaim) bool { return specUsesKiln(&c.Spec) }

func specUsesKiln(spec *resourceapi.ResourceClaimSpec) bool {
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil && isKilnClass(r.Exactly.DeviceClassName) {
			return true
		}
		for _, sr := range r.FirstAvailable {
			if isKilnClass(sr.DeviceClassName) {
				return true
			}
		}
	}
	return false
}

func isKilnClass(name string) bool {
	return name == dra.DriverName || strings.HasSuffix(name, "."+dra.DriverName)
}
