package dra

import (
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeviceClass names: gpu.kiln.dev holds whole GPUs; mig.gpu.kiln.dev and
// partition.gpu.kiln.dev the MIG devices and AMD compute partitions;
// fraction.gpu.kiln.dev the GPUs shared by claims that each take part of
// their memory.
const (
	ClassGPU       = DriverName
	ClassMIG       = "mig." + DriverName
	ClassPartition = "partition." + DriverName
	ClassFraction  = "fraction." + DriverName
)

// classSelector is the CEL expression of a class for one device type.
func classSelector(typ string) string {
	return "device.driver == '" + DriverName + "' && device.attributes['" + DriverName + "'].type == '" + typ + "'"
}

// DeviceClasses returns the DeviceClasses of the driver, one per kind of
// device, in the form kubectl applies.
func DeviceClasses() []resourceapi.DeviceClass {
	mk := func(name, typ string) resourceapi.DeviceClass {
		return resourceapi.DeviceClass{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
			ObjectMeta: metav1.ObjectMeta{
				Name:   name,
				Labels: map[string]string{"app.kubernetes.io/part-of": "kiln"},
			},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: classSelector(typ)}}},
			},
		}
	}
	return []resourceapi.DeviceClass{
		mk(ClassGPU, TypeGPU),
		mk(ClassMIG, TypeMIG),
		mk(ClassPartition, TypePartition),
		mk(ClassFraction, TypeFraction),
	}
}
