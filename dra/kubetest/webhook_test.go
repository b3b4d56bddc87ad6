package kubetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"maps"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kiln.dev/kiln/admission/webhook"
	"kiln.dev/kiln/compat/imagetest"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/version"
)

// webhookNS is the only namespace the test's webhook is registered for,
// so that the other tests' Pods are not checked.
const webhookNS = "kiln-webhook"

// serveWebhook serves h over TLS on loopback with a certificate for
// 127.0.0.1; it returns the address and the CA bundle.
func serveWebhook(t *testing.T, h http.Handler) (addr string, caPEM []byte, stop func()) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kiln webhook test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	go srv.ServeTLS(ln, "", "")
	return ln.Addr().String(), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), func() { srv.Close() }
}

// register registers the webhook's two paths at addr for webhookNS.
func register(t *testing.T, addr string, ca []byte, policy admissionregv1.FailurePolicyType) {
	t.Helper()
	ctx := context.Background()
	none := admissionregv1.SideEffectClassNone
	timeout := int32(10)
	ns := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": webhookNS}}
	url := func(p string) *string { u := "https://" + addr + p; return &u }
	vwc := &admissionregv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kiln-test"},
		Webhooks: []admissionregv1.ValidatingWebhook{{Name: "pods.gpu.kiln.dev", ClientConfig: admissionregv1.WebhookClientConfig{URL: url(webhook.PathPods), CABundle: ca},
			Rules: []admissionregv1.RuleWithOperations{{Operations: []admissionregv1.OperationType{admissionregv1.Create},
				Rule: admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			FailurePolicy: &policy, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: &timeout, NamespaceSelector: ns}}}
	mwc := &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kiln-test"},
		Webhooks: []admissionregv1.MutatingWebhook{{Name: "claims.gpu.kiln.dev", ClientConfig: admissionregv1.WebhookClientConfig{URL: url(webhook.PathClaims), CABundle: ca},
			Rules: []admissionregv1.RuleWithOperations{{Operations: []admissionregv1.OperationType{admissionregv1.Create},
				Rule: admissionregv1.Rule{APIGroups: []string{"resource.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"resourceclaims"}}}},
			FailurePolicy: &policy, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: &timeout, NamespaceSelector: ns}}}
	ar := cp.Client.AdmissionregistrationV1()
	_ = ar.ValidatingWebhookConfigurations().Delete(ctx, vwc.Name, metav1.DeleteOptions{})
	_ = ar.MutatingWebhookConfigurations().Delete(ctx, mwc.Name, metav1.DeleteOptions{})
	if _, err := ar.ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ar.MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ar.ValidatingWebhookConfigurations().Delete(context.Background(), vwc.Name, metav1.DeleteOptions{})
		_ = ar.MutatingWebhookConfigurations().Delete(context.Background(), mwc.Name, metav1.DeleteOptions{})
	})
	// The apiserver reads webhook configurations through an informer.
	time.Sleep(2 * time.Second)
}

// knownDrivers shows the webhook the recorded nodes whose data give the
// GPU driver's version: one recorded node (an nvidia-smi topo -m capture)
// has none, and on it kiln cannot tell whether an image runs, so a Pod is
// never refused while it is in the fleet (TestWebhook in package webhook
// checks that warning).
type knownDrivers struct{ webhook.KubeCluster }

func (c knownDrivers) Slices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	all, err := c.KubeCluster.Slices(ctx)
	var out []resourceapi.ResourceSlice
	for _, s := range all {
		known := s.Spec.Driver == dra.DriverName
		for _, d := range s.Spec.Devices {
			if _, ok := d.Attributes[dra.AttrDriverVersion]; !ok {
				known = false
			}
		}
		if known {
			out = append(out, s)
		}
	}
	return out, err
}

// TestWebhookWithTheAPIServer registers kiln's webhook with the real
// apiserver over TLS, with images in a real registry and kiln's slices of
// the recorded nodes: an image that needs CUDA 13.0 (no node's driver runs
// it) is refused with kiln's reason; a CUDA 12.4 image's claim, made from
// its Pod's template by the real controller, is kept by the webhook's
// selector to devices whose driver runs CUDA 12.4, and the real scheduler
// puts it there; with the webhook down, the failure policy decides.
func TestWebhookWithTheAPIServer(t *testing.T) {
	setup(t)
	ctx := context.Background()
	reg := imagetest.NewTestRegistry(t)
	cuda124 := reg.PushSpec(t, "lab/cuda124", imagetest.Spec{CUDA: "12.4.127", Env: map[string]string{"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}})
	cuda130 := reg.PushSpec(t, "lab/cuda130", imagetest.Spec{CUDA: "13.9.10", Env: map[string]string{"CUDA_VERSION": "13.9.0", "NVIDIA_REQUIRE_CUDA": "cuda>=13.9"}})

	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: webhookNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := webhook.Handler(webhook.Config{Images: &webhook.Registry{Insecure: true}, Cluster: knownDrivers{webhook.KubeCluster{Client: cp.Client}}})
	addr, ca, stop := serveWebhook(t, h)
	register(t, addr, ca, admissionregv1.Fail)

	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: webhookNS},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU}}}}}}}
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(webhookNS).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, image string) *v1.Pod {
		tn := "gpu"
		p := PodFor(name, webhookNS, "", "")
		p.Spec.Containers[0].Image = image
		p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tn}}
		return p
	}

	_, err := cp.Client.CoreV1().Pods(webhookNS).Create(ctx, pod("new-cuda", cuda130), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "runs on no GPU of this cluster") || !strings.Contains(err.Error(), "13.9") {
		t.Fatalf("a pod whose image needs CUDA 13.9 was not refused with kiln's reason: %v", err)
	}
	t.Logf("refused: %.300s", err)

	if _, err := cp.Client.CoreV1().Pods(webhookNS).Create(ctx, pod("cuda124", cuda124), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a pod whose image runs on part of the fleet was refused: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := cp.Client.CoreV1().Pods(webhookNS).Get(ctx, "cuda124", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" && len(p.Status.ResourceClaimStatuses) == 1 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
			cl, err := cp.Client.ResourceV1().ResourceClaims(webhookNS).Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(cl.Spec.Devices.Requests[0].Exactly.Selectors) != 1 {
				t.Fatalf("the claim has no selector from kiln: %+v", cl.Spec.Devices.Requests[0].Exactly)
			}
			d := device(t, p.Spec.NodeName, devicesOf(cl, dra.DriverName)[0])
			cuda := d.Attributes[dra.AttrCUDADriverVersion].VersionValue
			if cuda == nil {
				t.Fatalf("placed on %s/%s, which has no cudaDriverVersion", p.Spec.NodeName, d.Name)
			}
			if c, ok := version.Compare(*cuda, "12.4.0"); !ok || c < 0 {
				t.Fatalf("placed on %s/%s, whose driver runs CUDA %s: the image needs 12.4", p.Spec.NodeName, d.Name, *cuda)
			}
			t.Logf("placed on %s/%s (driver CUDA %s)", p.Spec.NodeName, d.Name, *cuda)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pod was not bound: %+v", p.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A Pod without GPU claims is untouched, even with an image no GPU of
	// the cluster runs: what the apiserver stores is what was sent (no
	// patch from the webhook, no warning).
	plain := pod("no-gpu", cuda130)
	plain.Spec.ResourceClaims, plain.Spec.Containers[0].Resources.Claims = nil, nil
	plain.Labels, plain.Annotations = map[string]string{"app": "cpu-only"}, map[string]string{"note": "no GPU"}
	warned := &warnings{}
	wcfg := rest.CopyConfig(cp.Config)
	wcfg.WarningHandler = warned
	wc, err := kubernetes.NewForConfig(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wc.CoreV1().Pods(webhookNS).Create(ctx, plain, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a pod without GPU claims was refused: %v", err)
	}
	if got.Spec.Containers[0].Image != cuda130 || len(got.Spec.ResourceClaims) != 0 || !maps.Equal(got.Labels, plain.Labels) ||
		!maps.Equal(got.Annotations, plain.Annotations) || len(got.Spec.Containers[0].Resources.Claims) != 0 {
		t.Errorf("the webhook changed a pod without GPU claims: %+v", got.ObjectMeta)
	}
	if len(warned.got) != 0 {
		t.Errorf("a pod without GPU claims got warnings: %q", warned.got)
	}

	// The webhook down: with failurePolicy Fail the apiserver refuses the
	// Pod; with Ignore it takes it.
	stop()
	if _, err := cp.Client.CoreV1().Pods(webhookNS).Create(ctx, pod("down-fail", cuda124), metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Errorf("webhook down, failure policy Fail: %v", err)
	}
	register(t, addr, ca, admissionregv1.Ignore)
	if _, err := cp.Client.CoreV1().Pods(webhookNS).Create(ctx, pod("down-ignore", cuda124), metav1.CreateOptions{}); err != nil {
		t.Errorf("webhook down, failure policy Ignore: %v", err)
	}
}

// TestWebhookManifestsAccepted: what kiln-dra webhook manifests prints is
// accepted by the real apiserver (a server-side dry run), and its serving
// certificate is valid for the Service's name under the CA bundle.
func TestWebhookManifestsAccepted(t *testing.T) {
	need(t)
	ctx := context.Background()
	objs, err := webhook.Manifests(webhook.ManifestOptions{Namespace: "kiln-system"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kiln-system"}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var secret *v1.Secret
	var ca []byte
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *v1.ServiceAccount:
			_, err = cp.Client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, dry)
		case *rbacv1.ClusterRole:
			_, err = cp.Client.RbacV1().ClusterRoles().Create(ctx, o, dry)
		case *rbacv1.ClusterRoleBinding:
			_, err = cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, o, dry)
		case *v1.Secret:
			secret = o
			_, err = cp.Client.CoreV1().Secrets(o.Namespace).Create(ctx, o, dry)
		case *appsv1.Deployment:
			_, err = cp.Client.AppsV1().Deployments(o.Namespace).Create(ctx, o, dry)
		case *v1.Service:
			_, err = cp.Client.CoreV1().Services(o.Namespace).Create(ctx, o, dry)
		case *admissionregv1.ValidatingWebhookConfiguration:
			ca = o.Webhooks[0].ClientConfig.CABundle
			_, err = cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, o, dry)
		case *admissionregv1.MutatingWebhookConfiguration:
			_, err = cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, o, dry)
		default:
			t.Fatalf("unexpected object %T", o)
		}
		if err != nil {
			t.Errorf("the apiserver refused %T: %v", o, err)
		}
	}
	if secret == nil || ca == nil {
		t.Fatal("no Secret or no CA bundle")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("the CA bundle is not PEM")
	}
	block, _ := pem.Decode(secret.Data[v1.TLSCertKey])
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "kiln-webhook.kiln-system.svc", Roots: pool}); err != nil {
		t.Errorf("the serving certificate does not verify for the Service: %v", err)
	}
	if _, err := tls.X509KeyPair(secret.Data[v1.TLSCertKey], secret.Data[v1.TLSPrivateKeyKey]); err != nil {
		t.Errorf("certificate and key do not pair: %v", err)
	}
}

// warnings keeps the warnings the apiserver sends (admission webhooks'
// among them).
type warnings struct {
	mu  sync.Mutex
	got []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, text)
}
