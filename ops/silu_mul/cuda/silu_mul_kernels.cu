// SwiGLU gate kernels: y = silu(a) * b, and its backward
//   da = grad * b * s * (1 + a * (1 - s)),  db = grad * silu(a),  s = sigmoid(a).
//
// Memory-bound elementwise work, so the whole job is moving bytes well:
//  * vectorized path: 16-byte loads/stores, ITEMS packs in flight per thread,
//    a block covers a tile of one row (a fully contiguous tensor is one long
//    row, so no per-element index arithmetic at all);
//  * generic path: element-wise strided access for any other layout
//    (transposed, broadcast stride 0, misaligned views, odd n).
// Math in fp32 (fp64 for fp64), one rounding on store; fp32 sigmoid uses the hardware exp/rcp.
#include "common.cuh"
#include "silu_mul.h"

namespace opgate_cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kItems = 4;

// fp32 sigmoid with the hardware exp2 and reciprocal (MUFU): the accurate expf + IEEE division
// cost ~25 instructions per element, which made this kernel issue-bound at 68% of the copy
// bandwidth on the H200 (bf16, 32768x8192).  Their few-ulp error is far below one bf16/fp16
// rounding and below the tolerance rule's absolute floor for fp32.  fp64 stays exact.
__device__ __forceinline__ float sigmoid(float v) { return __fdividef(1.0f, 1.0f + __expf(-v)); }
__device__ __forceinline__ double sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

template <typename T>
__device__ __forceinline__ T fwd_value(T a, T b) {
  using A = typename Acc<T>::type;
  const A af = to_acc(a);
  return from_acc<T>(af * sigmoid(af) * to_acc(b));
}

template <typename T>
__device__ __forceinline__ void bwd_value(T g, T a, T b, T* da, T* db) {
  using A = typename Acc<T>::type;
  const A af = to_acc(a);
  const A gf = to_acc(g);
  const A s = sigmoid(af);
  *da = from_acc<T>(gf * to_acc(b) * s * (A(1) + af * (A(1) - s)));
  *db = from_acc<T>(gf * af * s);
}

//! Row and first element index handled by this block (tile = kItems * blockDim.x units).
struct Tile {
  int64_t row;
  int64_t first;
};

__device__ __forceinline__ Tile block_tile(int64_t blocks_per_row) {
  const int64_t bid = blockIdx.x;
  const int64_t row = bid / blocks_per_row;
  return {row, (bid - row * blocks_per_row) * kItems * blockDim.x + threadIdx.x};
}

template <typename T>
__global__ void __launch_bounds__(kThreads) silu_mul_fwd_vec_kernel(const SiluMulParams p, int64_t blocks_per_row) {
  constexpr int V = pack_size<T>();
  const Tile t = block_tile(blocks_per_row);
  const T* a = static_cast<const T*>(p.a) + row_offset(p.a_rows, t.row);
  const T* b = static_cast<const T*>(p.b) + row_offset(p.b_rows, t.row);
  T* y = static_cast<T*>(p.out) + t.row * p.n;
  const int64_t nvec = p.n / V;
  uint4 ar[kItems];
  uint4 br[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = t.first + static_cast<int64_t>(i) * blockDim.x;
    if (j < nvec) {
      ar[i] = load_pack(a + j * V);
      br[i] = load_pack(b + j * V);
    }
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = t.first + static_cast<int64_t>(i) * blockDim.x;
    if (j < nvec) {
      const T* ae = pack_elems<T>(ar[i]);
      const T* be = pack_elems<T>(br[i]);
      uint4 out;
      T* oe = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int k = 0; k < V; ++k) oe[k] = fwd_value(ae[k], be[k]);
      store_pack(y + j * V, out);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) silu_mul_fwd_generic_kernel(const SiluMulParams p,
                                                                        int64_t blocks_per_row) {
  const Tile t = block_tile(blocks_per_row);
  const T* a = static_cast<const T*>(p.a) + row_offset(p.a_rows, t.row);
  const T* b = static_cast<const T*>(p.b) + row_offset(p.b_rows, t.row);
  T* y = static_cast<T*>(p.out) + t.row * p.n;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = t.first + static_cast<int64_t>(i) * blockDim.x;
    if (j < p.n) y[j] = fwd_value(a[j * p.a_rows.col_stride], b[j * p.b_rows.col_stride]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) silu_mul_bwd_vec_kernel(const SiluMulParams p, int64_t blocks_per_row) {
  constexpr int V = pack_size<T>();
  const Tile t = block_tile(blocks_per_row);
  const T* a = static_cast<const T*>(p.a) + row_offset(p.a_rows, t.row);
  const T* b = static_cast<const T*>(p.b) + row_offset(p.b_rows, t.row);
  const T* g = static_cast<const T*>(p.grad) + row_offset(p.grad_rows, t.row);
  T* da = static_cast<T*>(p.out) + t.row * p.n;
  T* db = static_cast<T*>(p.out2) + t.row * p.n;
  const int64_t nvec = p.n / V;
  uint4 ar[kItems];
  uint4 br[kItems];
  uint4 gr[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = t.first + static_cast<int64_t>(i) * blockDim.x;
    if (j < nvec) {
      ar[i] = load_pack(a + j * V);
      br[i] = load_pack(b + j * V);
      gr[i] = load_pack(g + j * V);
    }
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = t.first + static_cast<int64_t>(i) * blockDim.x;
    if (j < nvec) {
      const T* ae = pack_elems<T>(ar[i]);
      const T* be = pack_elems<T>(br[i]);
      const T* ge = pack_elems<T>(gr[i]);
      uint4 out_a;
      uint4 out_b;
      T* oa = reinterpret_cast<T*>(&out_a);
      T* ob = reinterpret_cast<T*>(&out_b);
#pragma unroll
      for (int k = 0; k < V; ++k) bwd_value(ge[k], ae[k], be[k], &oa[k], &ob[k]);
      store_pack(da + j * V, out_a);
      store_pack(db + j * V, out_b);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) silu_mul_bwd_generic_kernel(const SiluMulParams p,
                                                                        int64_t blocks_per_row) {
  const Tile t = block_tile(blocks_per_row);
  const T* a = static_cast<const T*>(p.a) + row_offset(p.a_rows, t.row);
  const T* b = static_cast<const T*>(p.b) + row_offset(p.b_rows, t.row);
  const T* g = static_cast<const T*>(p.grad) + row_offset(p.grad_rows, t.row);
  T* da = static_cast<T*>(p.out) + t.row * p.n;
  T* db = static_cast<T*>(p.out2) + t.row * p.n;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = t.first + static_cast<int64_t>(i) * blockDim.x;
    if (j < p.n) {
      bwd_value(g[j * p.grad_rows.col_stride], a[j * p.a_rows.col_stride], b[j * p.b_rows.col_stride], &da[j],
                &db[j]);
    }
  }
}

template <typename T>
bool vectorizable(const SiluMulParams& p, bool backward) {
  constexpr int V = pack_size<T>();
  bool ok = p.n % V == 0 && p.a_rows.col_stride == 1 && p.b_rows.col_stride == 1 && aligned16(p.a) &&
            aligned16(p.b) && aligned16(p.out) && rows_pack_aligned(p.a_rows, V) && rows_pack_aligned(p.b_rows, V);
  if (backward) {
    ok = ok && p.grad_rows.col_stride == 1 && aligned16(p.grad) && aligned16(p.out2) &&
         rows_pack_aligned(p.grad_rows, V);
  }
  return ok;
}

template <typename T>
cudaError_t launch(const SiluMulParams& p, bool backward, cudaStream_t stream) {
  constexpr int V = pack_size<T>();
  const bool vec = vectorizable<T>(p, backward);
  const int64_t units = vec ? p.n / V : p.n;
  const int64_t per_block = static_cast<int64_t>(kItems) * kThreads;
  const int64_t blocks_per_row = (units + per_block - 1) / per_block;
  const int64_t blocks = blocks_per_row * p.rows;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  const auto grid = static_cast<unsigned>(blocks);
  if (backward) {
    if (vec) {
      silu_mul_bwd_vec_kernel<T><<<grid, kThreads, 0, stream>>>(p, blocks_per_row);
    } else {
      silu_mul_bwd_generic_kernel<T><<<grid, kThreads, 0, stream>>>(p, blocks_per_row);
    }
  } else if (vec) {
    silu_mul_fwd_vec_kernel<T><<<grid, kThreads, 0, stream>>>(p, blocks_per_row);
  } else {
    silu_mul_fwd_generic_kernel<T><<<grid, kThreads, 0, stream>>>(p, blocks_per_row);
  }
  return cudaGetLastError();
}

cudaError_t dispatch(const SiluMulParams& p, bool backward, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat32: return launch<float>(p, backward, stream);
    case DType::kFloat16: return launch<__half>(p, backward, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(p, backward, stream);
    case DType::kFloat64: return launch<double>(p, backward, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t silu_mul_fwd(const SiluMulParams& p, cudaStream_t stream) { return dispatch(p, false, stream); }
cudaError_t silu_mul_bwd(const SiluMulParams& p, cudaStream_t stream) { return dispatch(p, true, stream); }

}  // namespace opgate_cuda
