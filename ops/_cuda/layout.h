// Torch-free description of a strided tensor viewed as (rows, n), shared by the
// torch glue (.cpp, host compiler) and the kernels (.cu, nvcc).  Shared by every
// opgate CUDA op: ops/_cuda is on the include path of each build (validators/cuda_build.py),
// and its files are part of every build's cache key.
#pragma once

#include <cstdint>

namespace opgate_cuda {

//! Leading (row) dimensions kept after collapsing; more is rejected with a clear error.
constexpr int kMaxLeadDims = 6;

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

//! The flat row index is decomposed over `sizes` (row-major) and turned into an
//! element offset with `strides`.  No copies: transposed, sliced, offset and
//! broadcast inputs are all addressed in place.
struct RowLayout {
  int ndim;  // 0 => a single row
  int64_t sizes[kMaxLeadDims];
  int64_t strides[kMaxLeadDims];
  int64_t col_stride;
};

//! Rows of a tensor with `dim` dims (the last one is the row): size-1 dims are
//! dropped and mergeable neighbours collapsed, so common layouts need one
//! stride per row.  Returns false when more than kMaxLeadDims dims remain.
inline bool make_row_layout(const int64_t* sizes, const int64_t* strides, int64_t dim, RowLayout* out) {
  RowLayout L{};
  for (int64_t d = 0; d + 1 < dim; ++d) {
    if (sizes[d] == 1) continue;
    if (L.ndim > 0 && L.strides[L.ndim - 1] == strides[d] * sizes[d]) {
      L.sizes[L.ndim - 1] *= sizes[d];
      L.strides[L.ndim - 1] = strides[d];
    } else {
      if (L.ndim == kMaxLeadDims) return false;
      L.sizes[L.ndim] = sizes[d];
      L.strides[L.ndim] = strides[d];
      ++L.ndim;
    }
  }
  L.col_stride = dim > 0 ? strides[dim - 1] : 1;
  *out = L;
  return true;
}

}  // namespace opgate_cuda
