package webhook

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KubeCluster reads the cluster through client-go.
type KubeCluster struct{ Client kubernetes.Interface }

// Slices lists every ResourceSlice.
func (c KubeCluster) Slices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	l, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// Pod gets one Pod.
func (c KubeCluster) Pod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

// PullSecrets reads the namespace's named dockerconfigjson Secrets.
func (c KubeCluster) PullSecrets(ctx context.Context, ns string, names []string) ([]DockerConfig, error) {
	var out []DockerConfig
	for _, n := range names {
		s, err := c.Client.CoreV1().Secrets(ns).Get(ctx, n, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // the kubelet says so when it pulls
		}
		if err != nil {
			return nil, err
		}
		if s.Type != corev1.SecretTypeDockerConfigJson {
			continue
		}
		dc, err := ParseDockerConfig(s.Data[corev1.DockerConfigJsonKey])
		if err != nil {
			continue
		}
		out = append(out, dc)
	}
	return out, nil
}

// ClaimSpec reads the spec of the claim or claim template a Pod names.
func (c KubeCluster) ClaimSpec(ctx context.Context, ns string, pc corev1.PodResourceClaim) (*resourceapi.ResourceClaimSpec, error) {
	switch {
	case pc.ResourceClaimName != nil:
		cl, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, *pc.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return &cl.Spec, nil
	case pc.ResourceClaimTemplateName != nil:
		t, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, *pc.ResourceClaimTemplateName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return &t.Spec.Spec, nil
	}
	return nil, nil
}
