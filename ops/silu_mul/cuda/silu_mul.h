// Host-visible contract between the torch glue (silu_mul_op.cpp) and the
// kernels (silu_mul_kernels.cu, CUDA headers only): see ../../rms_norm/cuda/rms_norm.h
// for why torch stays out of the .cu file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "layout.h"

namespace opgate_cuda {

//! out = silu(a) * b (forward) or (da, db) from grad (backward), over (rows, n).
//! Outputs are contiguous (rows, n); inputs may have any strides.
struct SiluMulParams {
  const void* a;
  const void* b;
  const void* grad;  // backward only
  void* out;         // forward: y; backward: da
  void* out2;        // backward: db
  RowLayout a_rows;
  RowLayout b_rows;
  RowLayout grad_rows;
  int64_t rows;
  int64_t n;
  DType dtype;
};

cudaError_t silu_mul_fwd(const SiluMulParams& p, cudaStream_t stream);
cudaError_t silu_mul_bwd(const SiluMulParams& p, cudaStream_t stream);

}  // namespace opgate_cuda
