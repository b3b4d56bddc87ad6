package plugin

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kiln.dev/kiln/dra"
)

// ConsumableCapacity asks the apiserver whether it keeps a shared device
// (DRAConsumableCapacity): it creates, as a dry run that stores nothing, a
// ResourceSlice of this node with one device that allows multiple
// allocations, and looks whether the answer still says so. An apiserver
// with the feature off drops the field instead of refusing the slice.
func ConsumableCapacity(ctx context.Context, client kubernetes.Interface, node string) (bool, error) {
	yes := true
	probe := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "kiln-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   dra.DriverName,
			NodeName: &node,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  []resourceapi.Device{{Name: "probe", AllowMultipleAllocations: &yes}},
		},
	}
	got, err := client.ResourceV1().ResourceSlices().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false, fmt.Errorf("asking the apiserver whether it shares devices (a dry-run ResourceSlice): %w", err)
	}
	if len(got.Spec.Devices) != 1 {
		return false, fmt.Errorf("asking the apiserver whether it shares devices: the dry run answered %d devices, sent 1", len(got.Spec.Devices))
	}
	m := got.Spec.Devices[0].AllowMultipleAllocations
	return m != nil && *m, nil
}
