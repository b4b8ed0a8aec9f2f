// torch glue for opgate_cuda::silu_mul: schema, checks, layouts, CUDA registration.
// Fake kernels and autograd are registered from Python (ops/silu_mul/cuda_impl.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <initializer_list>

#include "silu_mul.h"

namespace opgate_cuda {
namespace {

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    default:
      TORCH_CHECK(false, "opgate_cuda::silu_mul: unsupported dtype ", t.scalar_type(),
                  " (expected float32, float16, bfloat16 or float64)");
  }
}

void check_inputs(std::initializer_list<const at::Tensor*> ts, const char* what) {
  const at::Tensor& first = **ts.begin();
  TORCH_CHECK(first.dim() >= 1, what, ": inputs must have at least one dimension");
  for (const at::Tensor* t : ts) {
    TORCH_CHECK(t->is_cuda(), what, ": expected CUDA tensors, got one on ", t->device());
    TORCH_CHECK(t->device() == first.device(), what, ": inputs are on different devices");
    TORCH_CHECK(t->sizes() == first.sizes(), what, ": shapes differ: ", t->sizes(), " vs ", first.sizes());
    TORCH_CHECK(t->scalar_type() == first.scalar_type(), what, ": dtypes differ: ", t->scalar_type(), " vs ",
                first.scalar_type());
  }
}

//! Fully contiguous inputs are one long row (no per-row index math); otherwise
//! rows are the collapsed leading dims of each input.
void describe(SiluMulParams& p, std::initializer_list<std::pair<const at::Tensor*, RowLayout*>> ts) {
  const at::Tensor& first = *ts.begin()->first;
  bool all_contiguous = true;
  for (const auto& [t, layout] : ts) all_contiguous = all_contiguous && t->is_contiguous();
  p.n = first.size(-1);
  p.rows = p.n == 0 ? 0 : first.numel() / p.n;
  if (all_contiguous) {
    p.n = first.numel();
    p.rows = p.n == 0 ? 0 : 1;
  }
  for (const auto& [t, layout] : ts) {
    if (all_contiguous) {
      *layout = RowLayout{};
      layout->col_stride = 1;
    } else {
      TORCH_CHECK(make_row_layout(t->sizes().data(), t->strides().data(), t->dim(), layout),
                  "opgate_cuda::silu_mul: input has more than ", kMaxLeadDims, " non-mergeable leading dims");
    }
  }
}

at::Tensor silu_mul_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_inputs({&a, &b}, "opgate_cuda::silu_mul");
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor y = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  if (a.numel() == 0) return y;
  SiluMulParams p{};
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.out = y.data_ptr();
  p.dtype = dtype_of(a);
  describe(p, {{&a, &p.a_rows}, {&b, &p.b_rows}});
  const cudaError_t err = silu_mul_fwd(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "opgate_cuda::silu_mul: kernel launch failed: ", cudaGetErrorString(err));
  return y;
}

std::tuple<at::Tensor, at::Tensor> silu_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& a,
                                                          const at::Tensor& b) {
  check_inputs({&a, &b, &grad}, "opgate_cuda::silu_mul_backward");
  const c10::cuda::CUDAGuard guard(a.device());
  const auto opts = a.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor da = at::empty(a.sizes(), opts);
  at::Tensor db = at::empty(a.sizes(), opts);
  if (a.numel() == 0) return {da, db};
  SiluMulParams p{};
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.grad = grad.data_ptr();
  p.out = da.data_ptr();
  p.out2 = db.data_ptr();
  p.dtype = dtype_of(a);
  describe(p, {{&a, &p.a_rows}, {&b, &p.b_rows}, {&grad, &p.grad_rows}});
  const cudaError_t err = silu_mul_bwd(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "opgate_cuda::silu_mul_backward: kernel launch failed: ",
              cudaGetErrorString(err));
  return {da, db};
}

}  // namespace
}  // namespace opgate_cuda

TORCH_LIBRARY_FRAGMENT(opgate_cuda, m) {
  m.def("silu_mul(Tensor a, Tensor b) -> Tensor");
  m.def("silu_mul_backward(Tensor grad, Tensor a, Tensor b) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opgate_cuda, CUDA, m) {
  m.impl("silu_mul", &opgate_cuda::silu_mul_cuda);
  m.impl("silu_mul_backward", &opgate_cuda::silu_mul_backward_cuda);
}
