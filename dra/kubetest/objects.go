package kubetest

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// AddNode creates a schedulable Node (no kubelet runs for it).
func AddNode(ctx context.Context, c kubernetes.Interface, name string) (*v1.Node, error) {
	rl := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("256"),
		v1.ResourceMemory: resource.MustParse("2Ti"),
		v1.ResourcePods:   resource.MustParse("1000"),
	}
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: v1.NodeStatus{
			Capacity: rl, Allocatable: rl,
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}},
		},
	}
	created, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating node %s: %w", name, err)
	}
	created.Status = n.Status
	return c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
}

// PodFor returns a pod that uses the named claim, pinned to node when it
// is not empty.
func PodFor(name, ns, claim, node string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{
				Name: "main", Image: "registry.local/app:1",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
		},
	}
	if node != "" {
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	}
	return p
}
