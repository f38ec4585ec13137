// The C entry points of the CUDA backend module (libtandem_cuda.so).
//
// The daemon never links CUDA: it dlopen()s this module at start-up, so one
// binary runs on machines with and without a GPU, and cuBLAS's large static
// TLS never reaches threads started before (docs/cuda.md). The module is
// built from the same sources and compiler as the daemon, so a Backend made
// here is used there through its C++ interface.
#ifndef TANDEM_ENGINE_KERNELS_CUDA_CUDA_MODULE_H_
#define TANDEM_ENGINE_KERNELS_CUDA_CUDA_MODULE_H_

#include <cstddef>

namespace tandem::kernels {
class Backend;
}

extern "C" {

// Bumped whenever an entry point changes; the loader refuses other versions.
inline constexpr int kTandemCudaModuleAbi = 3;
int tandem_cuda_module_abi();

// Counts usable CUDA devices. Returns the count (0 when there is no driver or
// no device) and writes a one-line description (device names, or why there
// are none) to `message` (NUL-terminated, truncated to `size`).
int tandem_cuda_probe(char* message, size_t size);

// Makes a backend on `device` for lane `lane` (0: latency, 1: throughput),
// with `decode_sms` SMs kept free of prefill while decode runs (-1: auto, 0:
// no SM partition; lane_partition.h), and stores it in *backend (the caller
// owns it). Returns 0, or -1 with the reason in `error`.
int tandem_cuda_create_backend(int device, int lane, int decode_sms,
                               tandem::kernels::Backend** backend, char* error, size_t size);
}

#endif  // TANDEM_ENGINE_KERNELS_CUDA_CUDA_MODULE_H_
