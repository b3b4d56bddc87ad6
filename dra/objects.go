package dra

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Objects returns the pool as resource.k8s.io/v1 ResourceSlice objects, the
// way the kubelet plugin publishes them for the node: one pool named after
// the node, generation 1, each slice named <node>-gpu.kiln.dev-<n>.
func (r *Result) Objects() []resourceapi.ResourceSlice {
	out := make([]resourceapi.ResourceSlice, 0, len(r.Slices))
	node := r.NodeName
	for i, s := range r.Slices {
		sl := resourceapi.ResourceSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("%s-%s-%d", node, DriverName, i),
			},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: DriverName,
				Pool: resourceapi.ResourcePool{
					Name:               node,
					Generation:         1,
					ResourceSliceCount: int64(len(r.Slices)),
				},
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		}
		// Every slice names its node, the counter slices too: the API
		// wants exactly one node selection on each.
		sl.Spec.NodeName = &node
		out = append(out, sl)
	}
	return out
}
