package kube

import (
	"context"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kiln.dev/kiln/dra"
	"kiln.dev/kiln/snapshot"
)

// GPUNodes are the nodes that publish gpu.kiln.dev devices, sorted.
func GPUNodes(ctx context.Context, client kubernetes.Interface) ([]string, error) {
	l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	var out []string
	for _, s := range l.Items {
		if s.Spec.Driver == dra.DriverName && s.Spec.NodeName != nil && !slices.Contains(out, *s.Spec.NodeName) {
			out = append(out, *s.Spec.NodeName)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Discover reads a node's GPUs back from its slices, for kiln's agent
// (dra.NodeSnapshot).
func Discover(client kubernetes.Interface, node string) func(context.Context) (*snapshot.Snapshot, error) {
	return func(ctx context.Context) (*snapshot.Snapshot, error) {
		l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing ResourceSlices: %w", err)
		}
		return dra.NodeSnapshot(l.Items, node), nil
	}
}
