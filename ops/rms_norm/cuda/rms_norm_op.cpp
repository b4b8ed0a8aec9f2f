// torch glue for opgate_cuda::rms_norm: schema, argument checks, layout
// description and the CUDA dispatch-key registration.  Compiled by the host
// compiler; the kernels live in rms_norm_kernels.cu and never see ATen.
//
// The schema is defined with TORCH_LIBRARY_FRAGMENT because several opgate
// extensions (rms_norm, silu_mul) share the opgate_cuda namespace.  Fake
// (meta) kernels and autograd are registered from Python (ops/rms_norm/cuda_impl.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "rms_norm.h"

namespace opgate_cuda {
namespace {

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    default:
      TORCH_CHECK(false, "opgate_cuda::rms_norm: unsupported dtype ", t.scalar_type(),
                  " (expected float32, float16, bfloat16 or float64)");
  }
}

RowLayout row_layout(const at::Tensor& t, const char* name) {
  RowLayout L{};
  TORCH_CHECK(make_row_layout(t.sizes().data(), t.strides().data(), t.dim(), &L), "opgate_cuda::rms_norm: ",
              name, " has more than ", kMaxLeadDims, " non-mergeable leading dims");
  return L;
}

void check_inputs(const at::Tensor& x, const at::Tensor& w, const char* what) {
  TORCH_CHECK(x.is_cuda() && w.is_cuda(), what, ": expected CUDA tensors, got x on ", x.device(),
              " and weight on ", w.device());
  TORCH_CHECK(x.device() == w.device(), what, ": x and weight are on different devices");
  TORCH_CHECK(x.dim() >= 1, what, ": x must have at least one dimension");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1), what, ": weight must have shape [", x.size(-1),
              "], got ", w.sizes());
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), what, ": weight dtype ", w.scalar_type(),
              " differs from x dtype ", x.scalar_type());
}

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_inputs(x, w, "opgate_cuda::rms_norm");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0) return y;
  RmsNormFwdParams p{};
  p.x = x.data_ptr();
  p.w = w.data_ptr();
  p.y = y.data_ptr();
  p.x_rows = row_layout(x, "x");
  p.w_stride = w.stride(0);
  p.n = x.size(-1);
  p.rows = x.numel() / p.n;
  p.eps = eps;
  p.dtype = dtype_of(x);
  const cudaError_t err = rms_norm_fwd(p, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "opgate_cuda::rms_norm: kernel launch failed: ", cudaGetErrorString(err));
  return y;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& dy, const at::Tensor& x,
                                                          const at::Tensor& w, double eps) {
  check_inputs(x, w, "opgate_cuda::rms_norm_backward");
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type() && dy.device() == x.device(),
              "opgate_cuda::rms_norm_backward: grad must match x in shape, dtype and device");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0) return {dx, at::zeros(w.sizes(), w.options())};
  at::Tensor dw = at::empty(w.sizes(), w.options());
  RmsNormBwdParams p{};
  p.dy = dy.data_ptr();
  p.x = x.data_ptr();
  p.w = w.data_ptr();
  p.dx = dx.data_ptr();
  p.dw = dw.data_ptr();
  p.dy_rows = row_layout(dy, "grad");
  p.x_rows = row_layout(x, "x");
  p.w_stride = w.stride(0);
  p.n = x.size(-1);
  p.rows = x.numel() / p.n;
  p.eps = eps;
  p.dtype = dtype_of(x);
  const RmsNormBwdPlan plan = rms_norm_bwd_plan(p, x.get_device());
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor partial = at::empty({plan.partial_elems}, x.options().dtype(acc));
  p.partial = partial.data_ptr();
  const cudaError_t err = rms_norm_bwd(p, plan, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "opgate_cuda::rms_norm_backward: kernel launch failed: ",
              cudaGetErrorString(err));
  return {dx, dw};
}

}  // namespace
}  // namespace opgate_cuda

TORCH_LIBRARY_FRAGMENT(opgate_cuda, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opgate_cuda, CUDA, m) {
  m.impl("rms_norm", &opgate_cuda::rms_norm_cuda);
  m.impl("rms_norm_backward", &opgate_cuda::rms_norm_backward_cuda);
}
