package kubetest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"kiln.dev/kiln/admission/webhook"
	"kiln.dev/kiln/compat/imagetest"
	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/testenv"
)

// chart is the repository's Helm chart.
var chart = filepath.Join("..", "..", "deploy", "helm", "kiln")

// helmPath is the helm scripts/helm.sh builds (KILN_HELM), or the one on
// PATH; the test skips without one.
func helmPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KILN_HELM"); p != "" {
		return p
	}
	return testenv.Need(t, "helm", "scripts/helm.sh builds it (KILN_HELM names it); it renders deploy/helm/kiln")
}

// helmTemplate renders the chart as release name in kiln-system with the
// values given (--set and --set-json arguments).
func helmTemplate(t *testing.T, helm, name string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helm, append([]string{"template", name, chart, "--namespace", "kiln-system"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.New(strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// objectsOf decodes rendered YAML documents.
func objectsOf(t *testing.T, rendered []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("rendered YAML: %v", err)
		}
		if m != nil {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// secretData is a rendered Secret's value of key, decoded.
func secretData(t *testing.T, s *unstructured.Unstructured, key string) []byte {
	t.Helper()
	v, _, _ := unstructured.NestedString(s.Object, "data", key)
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil || len(b) == 0 {
		t.Fatalf("secret %s has no %s: %v", s.GetName(), key, err)
	}
	return b
}

// caBundle is the CA bundle of a rendered webhook configuration's first
// webhook.
func caBundle(t *testing.T, o *unstructured.Unstructured) []byte {
	t.Helper()
	hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
	if len(hooks) != 1 {
		t.Fatalf("%s %s: %d webhooks, want 1", o.GetKind(), o.GetName(), len(hooks))
	}
	v, _, _ := unstructured.NestedString(hooks[0].(map[string]any), "clientConfig", "caBundle")
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil || len(b) == 0 {
		t.Fatalf("%s %s has no CA bundle: %v", o.GetKind(), o.GetName(), err)
	}
	return b
}

// verifyServing checks that the Secret's certificate pairs with its key and
// verifies under ca for host (a DNS name or an IP address).
func verifyServing(t *testing.T, secret *unstructured.Unstructured, ca []byte, host string) tls.Certificate {
	t.Helper()
	crt, key := secretData(t, secret, "tls.crt"), secretData(t, secret, "tls.key")
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatalf("certificate and key do not pair: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("the CA bundle is not PEM")
	}
	block, _ := pem.Decode(crt)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: pool}); err != nil {
		t.Errorf("the serving certificate does not verify for %s under the bundle: %v", host, err)
	}
	return pair
}

// TestHelmChart: deploy/helm/kiln lints; rendered with the server it holds
// the driver, the webhook and the server, and the real apiserver accepts
// every object (a server-side dry run); the webhook's certificate verifies
// for its Service under the configurations' CA bundle; bad values are
// refused with the value's name.
func TestHelmChart(t *testing.T) {
	need(t)
	helm := helmPath(t)
	kubectl := kubectlPath(t)
	if out, err := exec.Command(helm, "lint", chart, "--set", "server.enabled=true").CombinedOutput(); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	rendered, err := helmTemplate(t, helm, "kiln", "--set", "server.enabled=true", "--set", "webhook.failurePolicy=Ignore")
	if err != nil {
		t.Fatal(err)
	}
	objs := objectsOf(t, rendered)
	for _, want := range []struct{ kind, name string }{
		{"DaemonSet", "kiln-dra"}, {"DeviceClass", "gpu.kiln.dev"}, {"DeviceClass", "fraction.gpu.kiln.dev"},
		{"Deployment", "kiln-webhook"}, {"Service", "kiln-webhook"}, {"Secret", "kiln-webhook-tls"},
		{"ValidatingWebhookConfiguration", "kiln-webhook"}, {"MutatingWebhookConfiguration", "kiln-webhook"},
		{"StatefulSet", "kiln-server"}, {"Service", "kiln-server"}, {"ClusterRole", "kiln-server"},
	} {
		if find(objs, want.kind, want.name) == nil {
			t.Errorf("the chart renders no %s %s", want.kind, want.name)
		}
	}
	vwc := find(objs, "ValidatingWebhookConfiguration", "kiln-webhook")
	if vwc != nil {
		hooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
		if p, _, _ := unstructured.NestedString(hooks[0].(map[string]any), "failurePolicy"); p != "Ignore" {
			t.Errorf("failurePolicy %q, want Ignore (from the values)", p)
		}
		if p, _, _ := unstructured.NestedString(hooks[0].(map[string]any), "clientConfig", "service", "path"); p != webhook.PathPods {
			t.Errorf("the Pod webhook's path %q, want %s", p, webhook.PathPods)
		}
		ca := caBundle(t, vwc)
		if mwc := find(objs, "MutatingWebhookConfiguration", "kiln-webhook"); mwc == nil || !bytes.Equal(caBundle(t, mwc), ca) {
			t.Error("the two webhook configurations carry different CA bundles")
		}
		if s := find(objs, "Secret", "kiln-webhook-tls"); s != nil {
			verifyServing(t, s, ca, "kiln-webhook.kiln-system.svc")
			if !bytes.Equal(secretData(t, s, "ca.crt"), ca) {
				t.Error("the Secret's ca.crt (kept for upgrades) is not the configurations' bundle")
			}
		}
	}
	out := applyRendered(t, kubectl, rendered, true)
	t.Logf("the chart's objects accepted (dry run):\n%s", out)

	for _, bad := range []struct{ set, want string }{
		{"webhook.failurePolicy=Sometimes", `webhook.failurePolicy "Sometimes": want Fail or Ignore`},
		{"webhook.timeoutSeconds=60", "webhook.timeoutSeconds 60: want 1 to 30"},
		{"webhook.url=http://127.0.0.1:9443", "want https://HOST:PORT"},
		// values.schema.json: types, and names nobody reads (a typo).
		{"dra.enabled=maybe", "at '/dra/enabled': got string, want boolean"},
		{"webhook.failurPolicy=Fail", "'failurPolicy' not allowed"},
		{"server.storage=lots", "/server/storage"},
	} {
		if _, err := helmTemplate(t, helm, "kiln", "--set", bad.set); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("--set %s: %v, want an error saying %q", bad.set, err, bad.want)
		}
	}
}

// TestHelmWebhookWithTheAPIServer installs the chart's webhook for real,
// called at a URL on loopback (webhook.url: the webhook runs outside the
// cluster), and serves kiln's webhook with the certificate the chart made:
// the apiserver reaches it over TLS with the chart's CA bundle, a Pod whose
// image needs a CUDA no node's driver runs is refused with kiln's reason,
// and a Pod without GPU claims is admitted.
func TestHelmWebhookWithTheAPIServer(t *testing.T) {
	setup(t)
	helm := helmPath(t)
	kubectl := kubectlPath(t)
	ctx := context.Background()
	const ns = "kiln-helm"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := helmTemplate(t, helm, "kiln-helm-test", "--set", "dra.enabled=false",
		"--set", "webhook.url=https://"+ln.Addr().String(),
		"--set-json", `webhook.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"`+ns+`"}}`)
	if err != nil {
		t.Fatal(err)
	}
	objs := objectsOf(t, rendered)
	if find(objs, "Deployment", "kiln-helm-test-webhook") != nil {
		t.Error("with webhook.url the chart still installs the webhook's Deployment")
	}
	secret := find(objs, "Secret", "kiln-helm-test-webhook-tls")
	vwc := find(objs, "ValidatingWebhookConfiguration", "kiln-helm-test-webhook")
	if secret == nil || vwc == nil {
		t.Fatalf("rendered no Secret or no webhook configuration:\n%s", rendered)
	}
	pair := verifyServing(t, secret, caBundle(t, vwc), "127.0.0.1")

	reg := imagetest.NewTestRegistry(t)
	cuda130 := reg.PushSpec(t, "lab/cuda130-helm", imagetest.Spec{CUDA: "13.9.10", Env: map[string]string{"CUDA_VERSION": "13.9.0", "NVIDIA_REQUIRE_CUDA": "cuda>=13.9"}})
	h := webhook.Handler(webhook.Config{Images: &webhook.Registry{Insecure: true}, Cluster: knownDrivers{webhook.KubeCluster{Client: cp.Client}}})
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer srv.Close()

	t.Cleanup(func() {
		del := exec.Command(kubectl, "--kubeconfig", cp.Kubeconfig, "delete", "--ignore-not-found", "-f", "-")
		del.Stdin = bytes.NewReader(rendered)
		_ = del.Run()
	})
	applyRendered(t, kubectl, rendered, false)
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.ClassGPU}}}}}}}
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gpuPod := PodFor("new-cuda", ns, "", "")
	gpuPod.Spec.Containers[0].Image = cuda130
	tn := "gpu"
	gpuPod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tn}}
	// The apiserver reads webhook configurations through an informer: the
	// refusal may take a moment to appear.
	var refusal error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		_, refusal = cp.Client.CoreV1().Pods(ns).Create(ctx, gpuPod, metav1.CreateOptions{})
		if refusal != nil || time.Now().After(deadline) {
			break
		}
		_ = cp.Client.CoreV1().Pods(ns).Delete(ctx, gpuPod.Name, metav1.DeleteOptions{})
	}
	if refusal == nil || !strings.Contains(refusal.Error(), "runs on no GPU of this cluster") || !strings.Contains(refusal.Error(), "13.9") {
		t.Fatalf("a Pod whose image needs CUDA 13.9, through the chart's webhook: %v", refusal)
	}
	t.Logf("refused: %.300s", refusal)
	plain := PodFor("no-gpu", ns, "", "")
	plain.Spec.Containers[0].Image = cuda130
	plain.Spec.ResourceClaims = nil
	for i := range plain.Spec.Containers {
		plain.Spec.Containers[i].Resources.Claims = nil
	}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Errorf("a Pod without GPU claims was refused: %v", err)
	}
}

// TestHelmChartMatchesKustomize: the chart's driver and server are the
// kustomize bases' (deploy/, deploy/server), object for object, but for
// labels and the chart's imagePullPolicy, so that the two ways to install
// do not drift apart.
func TestHelmChartMatchesKustomize(t *testing.T) {
	helm := helmPath(t)
	kubectl := kubectlPath(t)
	rendered, err := helmTemplate(t, helm, "kiln", "--set", "server.enabled=true", "--set", "webhook.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	chartObjs := objectsOf(t, rendered)
	strip := func(o *unstructured.Unstructured) map[string]any {
		c := o.DeepCopy()
		unstructured.RemoveNestedField(c.Object, "metadata", "labels")
		if c.GetKind() == "DeviceClass" {
			// Cluster-scoped; kustomize does not know the kind and puts
			// its namespace on it anyway, which the apiserver ignores.
			unstructured.RemoveNestedField(c.Object, "metadata", "namespace")
		}
		unstructured.RemoveNestedField(c.Object, "spec", "template", "metadata", "labels", "app.kubernetes.io/part-of")
		if cs, ok, _ := unstructured.NestedSlice(c.Object, "spec", "template", "spec", "containers"); ok {
			for _, x := range cs {
				delete(x.(map[string]any), "imagePullPolicy")
			}
			_ = unstructured.SetNestedSlice(c.Object, cs, "spec", "template", "spec", "containers")
		}
		return c.Object
	}
	for _, dir := range []string{"deploy", "deploy/server"} {
		for _, k := range objectsOf(t, kustomize(t, kubectl, dir)) {
			if k.GetKind() == "Namespace" {
				continue
			}
			c := find(chartObjs, k.GetKind(), k.GetName())
			if c == nil {
				t.Errorf("%s has %s %s; the chart has none", dir, k.GetKind(), k.GetName())
				continue
			}
			if want, got := strip(k), strip(c); !reflect.DeepEqual(want, got) {
				wj, _ := json.MarshalIndent(want, "", " ")
				gj, _ := json.MarshalIndent(got, "", " ")
				t.Errorf("%s %s differs between %s and the chart:\n%s\n--- chart:\n%s", k.GetKind(), k.GetName(), dir, wj, gj)
			}
		}
	}
}
