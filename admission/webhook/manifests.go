package webhook

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ManifestOptions say how the webhook is installed.
type ManifestOptions struct {
	Namespace, Name string // default kiln-system, kiln-webhook
	Image           string // default kiln.dev/kiln:latest
	// FailurePolicy is Fail (Pods wait while the webhook is down) or
	// Ignore (default Fail).
	FailurePolicy admissionregv1.FailurePolicyType
	// InsecureRegistries passes --insecure-registries (plain-HTTP lab
	// registries).
	InsecureRegistries bool
	// Valid is how long the generated certificate is valid (default 2
	// years); Now is the time it starts (default the present).
	Valid time.Duration
	Now   time.Time
}

// Manifests are the objects that install the webhook: its certificate (a
// CA made here, whose key is not kept), Secret, RBAC, Deployment, Service
// and both webhook configurations with the CA bundle.
func Manifests(o ManifestOptions) ([]runtime.Object, error) {
	if o.Namespace == "" {
		o.Namespace = "kiln-system"
	}
	if o.Name == "" {
		o.Name = "kiln-webhook"
	}
	if o.Image == "" {
		o.Image = "kiln.dev/kiln:latest"
	}
	if o.FailurePolicy == "" {
		o.FailurePolicy = admissionregv1.Fail
	}
	if o.FailurePolicy != admissionregv1.Fail && o.FailurePolicy != admissionregv1.Ignore {
		return nil, fmt.Errorf("failure policy %q: want Fail or Ignore", o.FailurePolicy)
	}
	if o.Valid <= 0 {
		o.Valid = 2 * 365 * 24 * time.Hour
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	host := o.Name + "." + o.Namespace + ".svc"
	caPEM, certPEM, keyPEM, err := certificate(host, o.Now, o.Valid)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{"app.kubernetes.io/name": o.Name, "app.kubernetes.io/part-of": "kiln"}
	meta := func(name string, namespaced bool) metav1.ObjectMeta {
		m := metav1.ObjectMeta{Name: name, Labels: labels}
		if namespaced {
			m.Namespace = o.Namespace
		}
		return m
	}
	args := []string{"kiln-dra", "webhook", "--cert=/tls/tls.crt", "--key=/tls/tls.key", "--listen=:8443"}
	if o.InsecureRegistries {
		args = append(args, "--insecure-registries")
	}
	one := int32(1)
	nonRoot := true
	deploy := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: meta(o.Name, true),
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": o.Name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: o.Name,
					Containers: []corev1.Container{{
						Name: "webhook", Image: o.Image, Command: args,
						Ports:           []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}},
						VolumeMounts:    []corev1.VolumeMount{{Name: "tls", MountPath: "/tls", ReadOnly: true}},
						SecurityContext: &corev1.SecurityContext{RunAsNonRoot: &nonRoot, RunAsUser: ptr(int64(65532)), AllowPrivilegeEscalation: ptr(false), ReadOnlyRootFilesystem: ptr(true)},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
							Path: "/healthz", Port: intstr.FromString("https"), Scheme: corev1.URISchemeHTTPS}}},
						Env: []corev1.EnvVar{{Name: "XDG_CACHE_HOME", Value: "/cache"}},
					}},
					Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: o.Name + "-tls"}}}},
				},
			},
		},
	}
	c := &deploy.Spec.Template.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "cache", MountPath: "/cache"})
	deploy.Spec.Template.Spec.Volumes = append(deploy.Spec.Template.Spec.Volumes, corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})

	none := admissionregv1.SideEffectClassNone
	timeout := int32(10)
	skip := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "kube-public", "kube-node-lease", o.Namespace}}}}
	svc := func(path string) admissionregv1.WebhookClientConfig {
		return admissionregv1.WebhookClientConfig{CABundle: caPEM, Service: &admissionregv1.ServiceReference{Namespace: o.Namespace, Name: o.Name, Path: &path, Port: ptr(int32(443))}}
	}
	rule := func(group, resource string) []admissionregv1.RuleWithOperations {
		return []admissionregv1.RuleWithOperations{{Operations: []admissionregv1.OperationType{admissionregv1.Create},
			Rule: admissionregv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{resource}}}}
	}
	return []runtime.Object{
		&corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: meta(o.Name, true)},
		&rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"}, ObjectMeta: meta(o.Name, false),
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch"}},
				// A Pod's claims and templates, to tell whether it asks for kiln's devices.
				{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceclaimtemplates"}, Verbs: []string{"get"}},
				{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
				// The pull secrets the Pods name, to read their images.
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
			}},
		&rbacv1.ClusterRoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"}, ObjectMeta: meta(o.Name, false),
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: o.Name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: o.Name, Namespace: o.Namespace}}},
		&corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: meta(o.Name+"-tls", true), Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}},
		deploy,
		&corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}, ObjectMeta: meta(o.Name, true),
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app.kubernetes.io/name": o.Name},
				Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}}}},
		&admissionregv1.ValidatingWebhookConfiguration{TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
			ObjectMeta: meta(o.Name, false),
			Webhooks: []admissionregv1.ValidatingWebhook{{Name: "pods.gpu.kiln.dev", ClientConfig: svc(PathPods), Rules: rule("", "pods"),
				FailurePolicy: &o.FailurePolicy, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: &timeout, NamespaceSelector: skip}}},
		&admissionregv1.MutatingWebhookConfiguration{TypeMeta: metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
			ObjectMeta: meta(o.Name, false),
			Webhooks: []admissionregv1.MutatingWebhook{{Name: "claims.gpu.kiln.dev", ClientConfig: svc(PathClaims), Rules: rule("resource.k8s.io", "resourceclaims"),
				FailurePolicy: &o.FailurePolicy, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: &timeout, NamespaceSelector: skip}}},
	}, nil
}

func ptr[T any](v T) *T { return &v }

// certificate makes a CA and a serving certificate for host signed by it;
// the CA's key is dropped, so nothing else can be signed with it.
func certificate(host string, now time.Time, valid time.Duration) (caPEM, certPEM, keyPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	serial := func() *big.Int {
		n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
		return n
	}
	ca := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "kiln webhook CA"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(valid),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	leaf := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host, host + ".cluster.local"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(valid), KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), nil
}
