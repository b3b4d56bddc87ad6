package kubetest

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// WaitBound waits until the pod has a node and its claim an allocation;
// it returns the claim.
func WaitBound(ctx context.Context, c kubernetes.Interface, ns, pod, claim string, timeout time.Duration) (*v1.Pod, *resourceapi.ResourceClaim, error) {
	deadline := time.Now().Add(timeout)
	for {
		p, err := c.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		if p.Spec.NodeName != "" {
			cl, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, claim, metav1.GetOptions{})
			if err != nil {
				return nil, nil, err
			}
			if cl.Status.Allocation != nil {
				return p, cl, nil
			}
		}
		if time.Now().After(deadline) {
			return p, nil, fmt.Errorf("pod %s/%s not bound within %s", ns, pod, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
