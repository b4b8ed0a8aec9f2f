// RMSNorm forward and backward kernels: y = x * rsqrt(mean(x^2) + eps) * w.
//
// Two paths per direction, chosen on the host from the actual layout:
//  * vectorized: 16-byte loads/stores, the row kept in registers, one global
//    read of x per pass.  Needs an inner-contiguous, 16-byte aligned x (and dy),
//    a contiguous aligned w and n a multiple of the pack size.
//  * generic: element-wise strided access, any layout (transposed, misaligned,
//    broadcast, odd n).  Correct everywhere, never a hidden .contiguous().
// Rows are one warp each for short rows (several rows per block) and one block
// each otherwise; reductions are warp shuffles plus one shared-memory step.
#include "common.cuh"
#include "rms_norm.h"

namespace opgate_cuda {
namespace {

using namespace detail;

// ---------------------------------------------------------------- forward

template <typename T, int ITEMS>
__global__ void __launch_bounds__(1024) rms_norm_fwd_vec_kernel(const RmsNormFwdParams p) {
  using A = typename Acc<T>::type;
  constexpr int V = pack_size<T>();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= p.rows) return;  // uniform per row group (blockDim.y > 1 => no barriers)
  const T* x = static_cast<const T*>(p.x) + row_offset(p.x_rows, row);
  const int64_t nvec = p.n / V;
  uint4 xr[ITEMS];
  A acc[1] = {A(0)};
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (j < nvec) {
      xr[i] = load_pack(x + j * V);
      const T* e = pack_elems<T>(xr[i]);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A f = to_acc(e[k]);
        acc[0] += f * f;
      }
    }
  }
  row_sum<A, 1>(acc);
  const A rstd = rsqrt_acc(acc[0] / static_cast<A>(p.n) + static_cast<A>(p.eps));
  const T* w = static_cast<const T*>(p.w);
  T* y = static_cast<T*>(p.y) + row * p.n;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (j < nvec) {
      const uint4 wr = load_pack(w + j * V);
      const T* xe = pack_elems<T>(xr[i]);
      const T* we = pack_elems<T>(wr);
      uint4 out;
      T* oe = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int k = 0; k < V; ++k) oe[k] = from_acc<T>(to_acc(xe[k]) * rstd * to_acc(we[k]));
      store_pack(y + j * V, out);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(1024) rms_norm_fwd_generic_kernel(const RmsNormFwdParams p) {
  using A = typename Acc<T>::type;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= p.rows) return;
  const T* x = static_cast<const T*>(p.x) + row_offset(p.x_rows, row);
  const int64_t cs = p.x_rows.col_stride;
  A acc[1] = {A(0)};
  for (int64_t j = threadIdx.x; j < p.n; j += blockDim.x) {
    const A f = to_acc(x[j * cs]);
    acc[0] += f * f;
  }
  row_sum<A, 1>(acc);
  const A rstd = rsqrt_acc(acc[0] / static_cast<A>(p.n) + static_cast<A>(p.eps));
  const T* w = static_cast<const T*>(p.w);
  T* y = static_cast<T*>(p.y) + row * p.n;
  for (int64_t j = threadIdx.x; j < p.n; j += blockDim.x) {
    y[j] = from_acc<T>(to_acc(x[j * cs]) * rstd * to_acc(w[j * p.w_stride]));
  }
}

struct Geometry {
  int items;
  int block_x;
  int block_y;
};

//! Short rows: one warp per row, 4 rows per block.  Long rows: one block per
//! row with `items` (<= max_items) packs per thread so that about `target`
//! threads cover it.
Geometry vec_geometry(int64_t nvec, int64_t target, int max_items) {
  if (nvec <= 32 * max_items) return {pow2_ceil((nvec + 31) / 32), 32, 4};
  int items = pow2_ceil((nvec + target - 1) / target);
  items = items > max_items ? max_items : items;
  return {items, round_up32((nvec + items - 1) / items), 1};
}

template <typename T>
bool fwd_vectorizable(const RmsNormFwdParams& p) {
  constexpr int V = pack_size<T>();
  return p.x_rows.col_stride == 1 && p.n % V == 0 && p.w_stride == 1 && aligned16(p.x) &&
         aligned16(p.w) && aligned16(p.y) && rows_pack_aligned(p.x_rows, V) && p.n / V <= 8 * 1024;
}

template <typename T>
cudaError_t launch_fwd(const RmsNormFwdParams& p, cudaStream_t stream) {
  constexpr int V = pack_size<T>();
  if (fwd_vectorizable<T>(p)) {
    const Geometry g = vec_geometry(p.n / V, 256, 8);
    const dim3 block(g.block_x, g.block_y);
    const auto grid = static_cast<unsigned>((p.rows + g.block_y - 1) / g.block_y);
    switch (g.items) {
      case 1: rms_norm_fwd_vec_kernel<T, 1><<<grid, block, 0, stream>>>(p); break;
      case 2: rms_norm_fwd_vec_kernel<T, 2><<<grid, block, 0, stream>>>(p); break;
      case 4: rms_norm_fwd_vec_kernel<T, 4><<<grid, block, 0, stream>>>(p); break;
      default: rms_norm_fwd_vec_kernel<T, 8><<<grid, block, 0, stream>>>(p); break;
    }
  } else {
    const int bx = p.n <= 64 ? 32 : (p.n >= 4096 ? 1024 : round_up32((p.n + 3) / 4));
    const int by = bx == 32 ? 4 : 1;
    const auto grid = static_cast<unsigned>((p.rows + by - 1) / by);
    rms_norm_fwd_generic_kernel<T><<<grid, dim3(bx, by), 0, stream>>>(p);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------- backward
//
// dx = rstd * (g - x * rstd^2 * mean(g * x)),  g = dy * w
// dw = sum over rows of dy * x * rstd, reduced deterministically: every row
// group writes its own row of a partial buffer, dw_reduce_kernel sums them in
// a fixed order.

template <typename T, int ITEMS>
__global__ void __launch_bounds__(512, 2) rms_norm_bwd_vec_kernel(const RmsNormBwdParams p) {
  using A = typename Acc<T>::type;
  constexpr int V = pack_size<T>();
  const int64_t nvec = p.n / V;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const T* w = static_cast<const T*>(p.w);
  uint4 wr[ITEMS];
  A dw[ITEMS][V];
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (j < nvec) wr[i] = load_pack(w + j * V);
#pragma unroll
    for (int k = 0; k < V; ++k) dw[i][k] = A(0);
  }
  for (int64_t row = group; row < p.rows; row += groups) {
    const T* x = static_cast<const T*>(p.x) + row_offset(p.x_rows, row);
    const T* dy = static_cast<const T*>(p.dy) + row_offset(p.dy_rows, row);
    uint4 xr[ITEMS];
    uint4 gr[ITEMS];
    A sums[2] = {A(0), A(0)};  // sum x^2, sum (dy * w) * x
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (j < nvec) {
        xr[i] = load_pack(x + j * V);
        gr[i] = load_pack(dy + j * V);
        const T* xe = pack_elems<T>(xr[i]);
        const T* ge = pack_elems<T>(gr[i]);
        const T* we = pack_elems<T>(wr[i]);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A xf = to_acc(xe[k]);
          sums[0] += xf * xf;
          sums[1] += to_acc(ge[k]) * to_acc(we[k]) * xf;
        }
      }
    }
    row_sum<A, 2>(sums);
    const A inv_n = A(1) / static_cast<A>(p.n);
    const A rstd = rsqrt_acc(sums[0] * inv_n + static_cast<A>(p.eps));
    const A c = sums[1] * inv_n * rstd * rstd;
    T* dx = static_cast<T*>(p.dx) + row * p.n;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (j < nvec) {
        const T* xe = pack_elems<T>(xr[i]);
        const T* ge = pack_elems<T>(gr[i]);
        const T* we = pack_elems<T>(wr[i]);
        uint4 out;
        T* oe = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const A xf = to_acc(xe[k]);
          const A gf = to_acc(ge[k]);
          oe[k] = from_acc<T>(rstd * (gf * to_acc(we[k]) - xf * c));
          dw[i][k] += gf * xf * rstd;
        }
        store_pack(dx + j * V, out);
      }
    }
  }
  A* part = static_cast<A*>(p.partial) + group * p.n;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (j < nvec) {
#pragma unroll
      for (int k = 0; k < V; ++k) part[j * V + k] = dw[i][k];
    }
  }
}

//! Generic pass 1: dx for one row (any layout); stores rstd for the dw pass.
template <typename T>
__global__ void __launch_bounds__(1024) rms_norm_bwd_dx_generic_kernel(const RmsNormBwdParams p,
                                                                       typename Acc<T>::type* rstd_out) {
  using A = typename Acc<T>::type;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= p.rows) return;
  const T* x = static_cast<const T*>(p.x) + row_offset(p.x_rows, row);
  const T* dy = static_cast<const T*>(p.dy) + row_offset(p.dy_rows, row);
  const T* w = static_cast<const T*>(p.w);
  const int64_t xs = p.x_rows.col_stride;
  const int64_t gs = p.dy_rows.col_stride;
  A sums[2] = {A(0), A(0)};
  for (int64_t j = threadIdx.x; j < p.n; j += blockDim.x) {
    const A xf = to_acc(x[j * xs]);
    sums[0] += xf * xf;
    sums[1] += to_acc(dy[j * gs]) * to_acc(w[j * p.w_stride]) * xf;
  }
  row_sum<A, 2>(sums);
  const A inv_n = A(1) / static_cast<A>(p.n);
  const A rstd = rsqrt_acc(sums[0] * inv_n + static_cast<A>(p.eps));
  const A c = sums[1] * inv_n * rstd * rstd;
  T* dx = static_cast<T*>(p.dx) + row * p.n;
  for (int64_t j = threadIdx.x; j < p.n; j += blockDim.x) {
    const A xf = to_acc(x[j * xs]);
    dx[j] = from_acc<T>(rstd * (to_acc(dy[j * gs]) * to_acc(w[j * p.w_stride]) - xf * c));
  }
  if (threadIdx.x == 0) rstd_out[row] = rstd;
}

//! Generic pass 2: per (row chunk, column) partial of sum dy * x * rstd.  Block (32, 8).
template <typename T>
__global__ void rms_norm_bwd_dw_generic_kernel(const RmsNormBwdParams p, const typename Acc<T>::type* rstd,
                                               int64_t rows_per_chunk) {
  using A = typename Acc<T>::type;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  int64_t r1 = r0 + rows_per_chunk;
  r1 = r1 < p.rows ? r1 : p.rows;
  A s = A(0);
  if (col < p.n) {
    const T* x = static_cast<const T*>(p.x);
    const T* dy = static_cast<const T*>(p.dy);
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const A xf = to_acc(x[row_offset(p.x_rows, r) + col * p.x_rows.col_stride]);
      const A gf = to_acc(dy[row_offset(p.dy_rows, r) + col * p.dy_rows.col_stride]);
      s += gf * xf * rstd[r];
    }
  }
  __shared__ A sm[8][33];
  sm[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < p.n) {
    A t = A(0);
#pragma unroll
    for (int k = 0; k < 8; ++k) t += sm[k][threadIdx.x];
    static_cast<A*>(p.partial)[static_cast<int64_t>(blockIdx.y) * p.n + col] = t;
  }
}

//! dw[col] = sum over partial rows, fixed order (deterministic).  Block (32, 8).
template <typename T>
__global__ void dw_reduce_kernel(const typename Acc<T>::type* partial, int64_t partial_rows, int64_t n,
                                 T* dw) {
  using A = typename Acc<T>::type;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A s = A(0);
  if (col < n) {
    for (int64_t r = threadIdx.y; r < partial_rows; r += 8) s += partial[r * n + col];
  }
  __shared__ A sm[8][33];
  sm[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    A t = A(0);
#pragma unroll
    for (int k = 0; k < 8; ++k) t += sm[k][threadIdx.x];
    dw[col] = from_acc<T>(t);
  }
}

template <typename T>
bool bwd_vectorizable(const RmsNormBwdParams& p) {
  constexpr int V = pack_size<T>();
  return p.x_rows.col_stride == 1 && p.dy_rows.col_stride == 1 && p.n % V == 0 && p.w_stride == 1 &&
         aligned16(p.x) && aligned16(p.dy) && aligned16(p.w) && aligned16(p.dx) &&
         rows_pack_aligned(p.x_rows, V) && rows_pack_aligned(p.dy_rows, V) && p.n / V <= 4 * 512;
}

template <typename T>
int bwd_vec_blocks_per_sm(int items, int threads) {
  int blocks = 1;
  switch (items) {
    case 1: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, rms_norm_bwd_vec_kernel<T, 1>, threads, 0); break;
    case 2: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, rms_norm_bwd_vec_kernel<T, 2>, threads, 0); break;
    default: cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, rms_norm_bwd_vec_kernel<T, 4>, threads, 0); break;
  }
  return blocks > 0 ? blocks : 1;
}

template <typename T>
RmsNormBwdPlan plan_bwd(const RmsNormBwdParams& p, int device) {
  int sms = 1;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  RmsNormBwdPlan plan{};
  if (bwd_vectorizable<T>(p)) {
    const Geometry g = vec_geometry(p.n / pack_size<T>(), 512, 4);
    const int64_t row_groups = (p.rows + g.block_y - 1) / g.block_y;
    const int64_t resident = static_cast<int64_t>(sms) * bwd_vec_blocks_per_sm<T>(g.items, g.block_x * g.block_y);
    plan.grid = static_cast<int>(row_groups < resident ? row_groups : resident);
    plan.block_x = g.block_x;
    plan.block_y = g.block_y;
    plan.items = g.items;
    plan.vectorized = true;
    plan.partial_rows = static_cast<int64_t>(plan.grid) * g.block_y;
    plan.partial_elems = plan.partial_rows * p.n;
  } else {
    const int64_t chunks_cap = static_cast<int64_t>(sms) * 4 < 65535 ? static_cast<int64_t>(sms) * 4 : 65535;
    const int64_t chunks = p.rows < chunks_cap ? p.rows : chunks_cap;
    plan.block_x = p.n <= 64 ? 32 : (p.n >= 4096 ? 1024 : round_up32((p.n + 3) / 4));
    plan.block_y = plan.block_x == 32 ? 4 : 1;
    plan.grid = static_cast<int>((p.rows + plan.block_y - 1) / plan.block_y);
    plan.items = 0;
    plan.vectorized = false;
    plan.partial_rows = chunks;
    plan.partial_elems = chunks * p.n + p.rows;  // partials, then one rstd per row
  }
  return plan;
}

template <typename T>
cudaError_t launch_bwd(const RmsNormBwdParams& p, const RmsNormBwdPlan& plan, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  A* partial = static_cast<A*>(p.partial);
  if (plan.vectorized) {
    const dim3 block(plan.block_x, plan.block_y);
    switch (plan.items) {
      case 1: rms_norm_bwd_vec_kernel<T, 1><<<plan.grid, block, 0, stream>>>(p); break;
      case 2: rms_norm_bwd_vec_kernel<T, 2><<<plan.grid, block, 0, stream>>>(p); break;
      default: rms_norm_bwd_vec_kernel<T, 4><<<plan.grid, block, 0, stream>>>(p); break;
    }
  } else {
    A* rstd = partial + plan.partial_rows * p.n;
    rms_norm_bwd_dx_generic_kernel<T><<<plan.grid, dim3(plan.block_x, plan.block_y), 0, stream>>>(p, rstd);
    const int64_t rows_per_chunk = (p.rows + plan.partial_rows - 1) / plan.partial_rows;
    const dim3 grid(static_cast<unsigned>((p.n + 31) / 32), static_cast<unsigned>(plan.partial_rows));
    rms_norm_bwd_dw_generic_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(p, rstd, rows_per_chunk);
  }
  const auto cols = static_cast<unsigned>((p.n + 31) / 32);
  dw_reduce_kernel<T><<<cols, dim3(32, 8), 0, stream>>>(partial, plan.partial_rows, p.n, static_cast<T*>(p.dw));
  return cudaGetLastError();
}

}  // namespace

cudaError_t rms_norm_fwd(const RmsNormFwdParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat32: return launch_fwd<float>(p, stream);
    case DType::kFloat16: return launch_fwd<__half>(p, stream);
    case DType::kBFloat16: return launch_fwd<__nv_bfloat16>(p, stream);
    case DType::kFloat64: return launch_fwd<double>(p, stream);
  }
  return cudaErrorInvalidValue;
}

RmsNormBwdPlan rms_norm_bwd_plan(const RmsNormBwdParams& p, int device) {
  switch (p.dtype) {
    case DType::kFloat32: return plan_bwd<float>(p, device);
    case DType::kFloat16: return plan_bwd<__half>(p, device);
    case DType::kBFloat16: return plan_bwd<__nv_bfloat16>(p, device);
    case DType::kFloat64: return plan_bwd<double>(p, device);
  }
  return RmsNormBwdPlan{};
}

cudaError_t rms_norm_bwd(const RmsNormBwdParams& p, const RmsNormBwdPlan& plan, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat32: return launch_bwd<float>(p, plan, stream);
    case DType::kFloat16: return launch_bwd<__half>(p, plan, stream);
    case DType::kBFloat16: return launch_bwd<__nv_bfloat16>(p, plan, stream);
    case DType::kFloat64: return launch_bwd<double>(p, plan, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace opgate_cuda
