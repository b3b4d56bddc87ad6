// Package cudadrv is gpubench's Driver on NVIDIA's CUDA driver API
// (libcuda), loaded at run time with dlopen: the same kiln binary runs
// where no NVIDIA driver is installed and says so. It uses each device's
// primary context (the one the CUDA runtime and NCCL use too), pins host
// memory that gpubench/hostmem placed with cuMemHostRegister, copies with
// cuMemcpy{HtoD,DtoH,DtoD,Peer}Async on non-blocking streams and times
// with events.
package cudadrv

// DefaultLibrary is the CUDA driver library's name for the loader.
const DefaultLibrary = "libcuda.so.1"
