// Host-visible contract between the torch glue (rms_norm_op.cpp, compiled by the
// host compiler against torch headers) and the kernels (rms_norm_kernels.cu,
// compiled by nvcc against CUDA headers only).  Keeping torch out of the .cu
// file keeps the per-arch device compile fast and lets one nvcc build the
// kernels for every arch of the policy without re-parsing ATen each time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "layout.h"

namespace opgate_cuda {

struct RmsNormFwdParams {
  const void* x;
  const void* w;
  void* y;  // contiguous (rows, n)
  RowLayout x_rows;
  int64_t w_stride;
  int64_t rows;
  int64_t n;
  double eps;
  DType dtype;
};

struct RmsNormBwdParams {
  const void* dy;
  const void* x;
  const void* w;
  void* dx;       // contiguous (rows, n)
  void* partial;  // (partial_rows, n) accumulator buffer, float (double for fp64)
  void* dw;       // contiguous (n,)
  RowLayout dy_rows;
  RowLayout x_rows;
  int64_t w_stride;
  int64_t rows;
  int64_t n;
  double eps;
  DType dtype;
};

//! Launch geometry of the backward pass; the caller allocates `partial_elems` accumulators.
struct RmsNormBwdPlan {
  int grid;
  int block_x;
  int block_y;
  int items;
  bool vectorized;
  int64_t partial_rows;
  int64_t partial_elems;  // accumulator elements to allocate for `partial`
};

cudaError_t rms_norm_fwd(const RmsNormFwdParams& p, cudaStream_t stream);
RmsNormBwdPlan rms_norm_bwd_plan(const RmsNormBwdParams& p, int device);
cudaError_t rms_norm_bwd(const RmsNormBwdParams& p, const RmsNormBwdPlan& plan, cudaStream_t stream);

}  // namespace opgate_cuda
