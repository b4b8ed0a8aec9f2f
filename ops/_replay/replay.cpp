// opgate launch replay: the C++ dispatch path of opgate's Triton ops.
//
// Why: a Triton op registered with torch.library.custom_op pays Python on every
// call (custom_op dispatch, the Python launcher, Triton's argument binder) and
// Python autograd on every backward: ~700 us per forward+backward on the H200's
// host, where aten pays ~80 us.  The kernels themselves are not the problem.
//
// How: the op's Python launcher stays the one definition of what to launch.  The
// first call with a given *key* (every tensor's dtype, device, sizes, strides and
// pointer alignment mod 16, every scalar argument's value) goes to Python, which
// runs the launcher while recording each Triton launch and hands back a *plan*:
// the buffers to allocate, each launch's CUfunction, grid, block, shared memory
// and its parameters (an input's pointer, a buffer's pointer + offset, or a
// literal fixed by the key), and which buffers are the outputs.  Every later call
// with that key is replayed here: allocate, fill the parameter block, launch with
// the driver API on the current stream.  No Python, no GIL.
//
// Autograd is here too, so the backward never enters Python either: a *formula*
// (the backward op, where each of its arguments comes from, which backward
// output is which input's gradient) drives one generic autograd Node.
//
// Registration is by name at the backend key (CUDA) and the autograd key
// (AutogradCUDA), above whatever Python registered at CompositeExplicitAutograd
// and Autograd (custom_op or triton_op alike), which keep serving other devices,
// fake tensors and tracing.  The C ABI (extern "C", called through ctypes) keeps
// this file free of pybind11.
#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace opgate_replay {
namespace {

constexpr int64_t kPlanVersion = 1;
constexpr int kAbi = 1;

// ---------------------------------------------------------------- driver API
using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void**, void**);
using ErrorStringFn = CUresult (*)(CUresult, const char**);

struct Driver {
  LaunchFn launch = nullptr;
  ErrorStringFn error_string = nullptr;
};

const Driver& driver() {
  // libcuda is already mapped by the time a plan exists (Triton loaded the kernels).
  static const Driver d = [] {
    Driver out;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib != nullptr) {
      out.launch = reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
      out.error_string = reinterpret_cast<ErrorStringFn>(dlsym(lib, "cuGetErrorString"));
    }
    return out;
  }();
  return d;
}

// ---------------------------------------------------------------- plans
enum ParamKind : int64_t { kInputPtr = 0, kBufferPtr = 1, kLiteral = 2, kNullPtr = 3 };

struct Param {
  int64_t kind, size, a, b;
};

struct Launch {
  uint64_t function;
  unsigned grid[3];
  unsigned threads;
  unsigned shared;
  std::vector<Param> params;
};

struct Buffer {
  int64_t nbytes;
  int64_t direct_output;  // >= 0: this buffer is exactly that output (allocated with its own shape)
};

struct Output {
  int64_t buffer;
  c10::ScalarType dtype;
  int64_t offset;
  std::vector<int64_t> sizes, strides;
};

struct Plan {
  bool python_only = false;  // the recorder refused: every call with this key goes to Python
  std::vector<Buffer> buffers;
  std::vector<Launch> launches;
  std::vector<Output> outputs;
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct OpState {
  std::string qualname;
  std::mutex mu;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Plan>, KeyHash> plans;
  std::atomic<int64_t> hits{0}, misses{0}, python_calls{0};
};

std::mutex g_mu;
std::unordered_map<std::string, std::unique_ptr<OpState>>& ops() {
  static auto* m = new std::unordered_map<std::string, std::unique_ptr<OpState>>();
  return *m;
}
std::vector<std::unique_ptr<torch::Library>>& libraries() {
  static auto* v = new std::vector<std::unique_ptr<torch::Library>>();
  return *v;
}
PyObject* g_handler = nullptr;  // (qualname, args) -> (outputs, plan bytes | None)
std::atomic<bool> g_dry_run{false};
std::atomic<bool> g_bypass{false};  // every call to Python, no plans (to compare the two paths)
std::mutex g_log_mu;
std::vector<int64_t> g_log;  // dry-run launches (tests): fn, grid x3, threads, shared, n, (size, bits) x n

std::shared_ptr<const Plan> parse_plan(const int64_t* w, size_t n) {
  size_t i = 0;
  auto next = [&]() -> int64_t {
    TORCH_CHECK(i < n, "opgate replay: truncated plan");
    return w[i++];
  };
  auto plan = std::make_shared<Plan>();
  TORCH_CHECK(next() == kPlanVersion, "opgate replay: plan version mismatch");
  const int64_t nb = next(), nl = next(), no = next();
  for (int64_t b = 0; b < nb; ++b) {
    Buffer buf{};
    buf.nbytes = next();
    buf.direct_output = next();
    plan->buffers.push_back(buf);
  }
  for (int64_t l = 0; l < nl; ++l) {
    Launch la{};
    la.function = static_cast<uint64_t>(next());
    for (unsigned& g : la.grid) g = static_cast<unsigned>(next());
    la.threads = static_cast<unsigned>(next());
    la.shared = static_cast<unsigned>(next());
    const int64_t np = next();
    for (int64_t p = 0; p < np; ++p) {
      Param pa{};
      pa.kind = next();
      pa.size = next();
      pa.a = next();
      pa.b = next();
      TORCH_CHECK(pa.size == 1 || pa.size == 2 || pa.size == 4 || pa.size == 8, "opgate replay: bad param size");
      TORCH_CHECK(pa.kind != kBufferPtr || (pa.a >= 0 && pa.a < nb), "opgate replay: bad buffer index");
      la.params.push_back(pa);
    }
    plan->launches.push_back(std::move(la));
  }
  for (int64_t o = 0; o < no; ++o) {
    Output out{};
    out.buffer = next();
    TORCH_CHECK(out.buffer >= 0 && out.buffer < nb, "opgate replay: bad output buffer");
    out.dtype = static_cast<c10::ScalarType>(next());
    const int64_t ndim = next();
    out.offset = next();
    for (int64_t d = 0; d < ndim; ++d) out.sizes.push_back(next());
    for (int64_t d = 0; d < ndim; ++d) out.strides.push_back(next());
    plan->outputs.push_back(std::move(out));
  }
  TORCH_CHECK(i == n, "opgate replay: trailing words in plan");
  return plan;
}

// ---------------------------------------------------------------- keys
// Everything a recorded launch may depend on.  Tags keep different argument kinds apart.
bool build_key(const torch::jit::Stack& stack, size_t first, size_t n, std::vector<int64_t>& key,
               int64_t& device_index) {
  key.reserve(8 + 12 * n);
  device_index = -1;
  for (size_t i = first; i < first + n; ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        key.push_back(10);
        continue;
      }
      if (t.layout() != at::kStrided || t.is_sparse()) return false;
      key.push_back(11);
      key.push_back(static_cast<int64_t>(t.scalar_type()));
      key.push_back(static_cast<int64_t>(t.device().type()) * 1024 + t.device().index());
      if (device_index < 0) device_index = t.device().index();
      const int64_t dim = t.dim();
      key.push_back(dim);
      for (int64_t d = 0; d < dim; ++d) key.push_back(t.sizes()[d]);
      for (int64_t d = 0; d < dim; ++d) key.push_back(t.strides()[d]);
      key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16));
    } else if (v.isNone()) {
      key.push_back(12);
    } else if (v.isDouble()) {
      key.push_back(13);
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      key.push_back(bits);
    } else if (v.isBool()) {
      key.push_back(14);
      key.push_back(v.toBool() ? 1 : 0);
    } else if (v.isInt()) {
      key.push_back(15);
      key.push_back(v.toInt());
    } else if (v.isString()) {
      const std::string& s = v.toStringRef();
      key.push_back(16);
      key.push_back(static_cast<int64_t>(s.size()));
      for (size_t c = 0; c < s.size(); c += 8) {
        int64_t word = 0;
        std::memcpy(&word, s.data() + c, std::min<size_t>(8, s.size() - c));
        key.push_back(word);
      }
    } else {
      return false;  // lists, scalars, ...: Python handles the call
    }
  }
  return true;
}

// ---------------------------------------------------------------- the Python side
PyObject* to_python(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) Py_RETURN_NONE;
    return THPVariable_Wrap(t);
  }
  if (v.isNone()) Py_RETURN_NONE;
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isBool()) return PyBool_FromLong(v.toBool() ? 1 : 0);
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isString()) return PyUnicode_FromStringAndSize(v.toStringRef().data(), v.toStringRef().size());
  PyErr_Format(PyExc_TypeError, "opgate replay: cannot pass argument of type %s to Python",
               v.tagKind().c_str());
  return nullptr;
}

// Runs the op's Python implementation (recording when ``key`` is given) and returns its
// outputs; installs the plan it sends back.  Python exceptions propagate unchanged.
std::vector<at::Tensor> call_python(OpState& st, const torch::jit::Stack& stack, size_t first, size_t n,
                                    const std::vector<int64_t>* key) {
  st.python_calls++;
  PyGILState_STATE gil = PyGILState_Ensure();
  std::vector<at::Tensor> outs;
  std::shared_ptr<const Plan> plan;
  {
    PyObject* args = PyTuple_New(static_cast<Py_ssize_t>(n));
    bool ok = args != nullptr;
    for (size_t i = 0; ok && i < n; ++i) {
      PyObject* o = to_python(stack[first + i]);
      if (o == nullptr) ok = false;
      else PyTuple_SET_ITEM(args, static_cast<Py_ssize_t>(i), o);
    }
    PyObject* result = nullptr;
    if (ok) {
      if (g_handler == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "opgate replay: no handler registered");
      } else {
        result = PyObject_CallFunction(g_handler, "sOO", st.qualname.c_str(), args, key ? Py_True : Py_False);
      }
    }
    Py_XDECREF(args);
    if (result == nullptr) {
      python_error err;
      err.persist();  // the Python exception, re-raised unchanged where the call entered C++
      PyGILState_Release(gil);
      throw std::move(err);
    }
    // result: (tuple of tensors, bytes or None)
    bool shape_ok = PyTuple_Check(result) && PyTuple_GET_SIZE(result) == 2 && PyTuple_Check(PyTuple_GET_ITEM(result, 0));
    std::string problem;
    if (!shape_ok) {
      problem = "handler must return (tuple of tensors, plan bytes or None)";
    } else {
      PyObject* tensors = PyTuple_GET_ITEM(result, 0);
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tensors); ++i) {
        PyObject* t = PyTuple_GET_ITEM(tensors, i);
        if (!THPVariable_Check(t)) {
          problem = "handler returned a non-tensor output";
          break;
        }
        outs.push_back(THPVariable_Unpack(t));
      }
      PyObject* pb = PyTuple_GET_ITEM(result, 1);
      if (problem.empty() && key != nullptr && pb != Py_None) {
        if (!PyBytes_Check(pb) || PyBytes_GET_SIZE(pb) % 8 != 0) {
          problem = "plan must be bytes of int64 words";
        } else {  // parsed below
          try {
            plan = parse_plan(reinterpret_cast<const int64_t*>(PyBytes_AS_STRING(pb)),
                              static_cast<size_t>(PyBytes_GET_SIZE(pb)) / 8);
          } catch (const std::exception& e) {
            // a plan this build cannot read: the key stays on the Python path, the call succeeds
            TORCH_WARN_ONCE("opgate replay (", st.qualname, "): plan refused: ", e.what());
            auto refused = std::make_shared<Plan>();
            refused->python_only = true;
            plan = refused;
          }
        }
      } else if (key != nullptr && pb == Py_None) {
        auto refused = std::make_shared<Plan>();
        refused->python_only = true;
        plan = refused;
      }
    }
    Py_DECREF(result);
    PyGILState_Release(gil);
    TORCH_CHECK(problem.empty(), "opgate replay (", st.qualname, "): ", problem);
  }
  if (key != nullptr && plan) {
    std::lock_guard<std::mutex> lock(st.mu);
    st.plans[*key] = plan;
  }
  return outs;
}

// ---------------------------------------------------------------- replay
std::vector<at::Tensor> replay(const Plan& plan, const torch::jit::Stack& stack, size_t first,
                               const at::Device& device, const char* qualname) {
  const auto byte_opts = at::TensorOptions().dtype(at::kByte).device(device);
  std::vector<at::Tensor> buffers(plan.buffers.size());
  std::vector<at::Tensor> outs(plan.outputs.size());
  for (size_t b = 0; b < plan.buffers.size(); ++b) {
    const Buffer& buf = plan.buffers[b];
    if (buf.direct_output >= 0) {
      const Output& o = plan.outputs[static_cast<size_t>(buf.direct_output)];
      outs[static_cast<size_t>(buf.direct_output)] =
          at::empty_strided(o.sizes, o.strides, at::TensorOptions().dtype(o.dtype).device(device));
      buffers[b] = outs[static_cast<size_t>(buf.direct_output)];
    } else {
      buffers[b] = at::empty({buf.nbytes}, byte_opts);
    }
  }
  for (size_t k = 0; k < plan.outputs.size(); ++k) {
    if (outs[k].defined()) continue;
    const Output& o = plan.outputs[k];
    outs[k] = buffers[static_cast<size_t>(o.buffer)].view(o.dtype).as_strided(o.sizes, o.strides, o.offset);
  }
  const bool dry = g_dry_run.load(std::memory_order_relaxed);
  CUstream stream = nullptr;
  if (!dry && !plan.launches.empty()) {
    TORCH_CHECK(device.is_cuda(), qualname, ": replay needs CUDA tensors");
    stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  }
  for (const Launch& la : plan.launches) {
    const size_t np = la.params.size();
    // one 8-byte slot per parameter: the driver reads each at its declared width
    std::vector<uint64_t> slots(np, 0);
    std::vector<void*> ptrs(np);
    for (size_t p = 0; p < np; ++p) {
      const Param& pa = la.params[p];
      uint64_t value = 0;
      switch (pa.kind) {
        case kInputPtr:
          value = reinterpret_cast<uintptr_t>(stack[first + static_cast<size_t>(pa.a)].toTensor().data_ptr()) +
                  static_cast<uint64_t>(pa.b);
          break;
        case kBufferPtr:
          value = reinterpret_cast<uintptr_t>(buffers[static_cast<size_t>(pa.a)].data_ptr()) +
                  static_cast<uint64_t>(pa.b);
          break;
        case kLiteral:
          value = static_cast<uint64_t>(pa.b);
          break;
        default:
          value = 0;
      }
      std::memcpy(&slots[p], &value, static_cast<size_t>(pa.size));  // little-endian: low bytes first
      ptrs[p] = &slots[p];
    }
    if (la.grid[0] == 0 || la.grid[1] == 0 || la.grid[2] == 0) continue;
    if (dry) {
      std::lock_guard<std::mutex> lock(g_log_mu);
      g_log.insert(g_log.end(), {static_cast<int64_t>(la.function), la.grid[0], la.grid[1], la.grid[2],
                                 la.threads, la.shared, static_cast<int64_t>(np)});
      for (size_t p = 0; p < np; ++p) {
        uint64_t v = 0;
        std::memcpy(&v, &slots[p], static_cast<size_t>(la.params[p].size));
        g_log.push_back(la.params[p].size);
        g_log.push_back(static_cast<int64_t>(v));
      }
      continue;
    }
    const Driver& d = driver();
    TORCH_CHECK(d.launch != nullptr, qualname, ": libcuda.so.1 has no cuLaunchKernel");
    const CUresult rc = d.launch(reinterpret_cast<CUfunction>(la.function), la.grid[0], la.grid[1], la.grid[2],
                                 la.threads, 1, 1, la.shared, stream, ptrs.data(), nullptr);
    if (rc != 0) {
      const char* msg = "unknown error";
      if (d.error_string != nullptr) d.error_string(rc, &msg);
      TORCH_CHECK(false, qualname, ": cuLaunchKernel failed (", rc, "): ", msg);
    }
  }
  return outs;
}

class ReplayKernel final : public c10::OperatorKernel {
 public:
  explicit ReplayKernel(OpState* st) : st_(st) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    const size_t first = stack->size() - n;
    std::vector<int64_t> key;
    int64_t device_index = -1;
    std::vector<at::Tensor> outs;
    const bool keyable = !g_bypass.load(std::memory_order_relaxed) && build_key(*stack, first, n, key, device_index);
    std::shared_ptr<const Plan> plan;
    if (keyable) {
      std::lock_guard<std::mutex> lock(st_->mu);
      auto it = st_->plans.find(key);
      if (it != st_->plans.end()) plan = it->second;
    }
    if (plan && !plan->python_only) {
      st_->hits++;
      at::Device device = at::kCPU;
      for (size_t i = first; i < first + n; ++i) {
        if ((*stack)[i].isTensor() && (*stack)[i].toTensor().defined()) {
          device = (*stack)[i].toTensor().device();
          break;
        }
      }
      std::optional<c10::cuda::CUDAGuard> guard;
      if (device.is_cuda()) guard.emplace(device);
      outs = replay(*plan, *stack, first, device, st_->qualname.c_str());
    } else {
      if (!plan) st_->misses++;
      outs = call_python(*st_, *stack, first, n, (keyable && !plan) ? &key : nullptr);
    }
    const size_t n_ret = op.schema().returns().size();
    TORCH_CHECK(outs.size() == n_ret, st_->qualname, ": implementation returned ", outs.size(),
                " tensors, the schema declares ", n_ret);
    torch::jit::drop(*stack, n);
    for (auto& t : outs) stack->emplace_back(std::move(t));
  }

 private:
  OpState* st_;
};

// ---------------------------------------------------------------- autograd
struct Formula {
  std::string backward;  // empty: no formula (a backward through the op raises, like custom_op's)
  // backward op arguments: 'g' grad of output k, 'i' forward argument k, 'o' forward output k
  std::vector<std::pair<char, int64_t>> args;
  std::vector<int64_t> grad_of;          // per forward argument: backward output index, or -1
  std::vector<std::string> unsupported;  // per forward argument: error when its gradient is needed

  // The backward op's handle, looked up once (a dispatcher lookup by name costs a lock and a hash).
  const c10::OperatorHandle& backward_op() const {
    std::call_once(once_, [this] { handle_.emplace(c10::Dispatcher::singleton().findSchemaOrThrow(backward.c_str(), "")); });
    return *handle_;
  }

 private:
  mutable std::once_flag once_;
  mutable std::optional<c10::OperatorHandle> handle_;
};

using NodePtr = std::remove_cv_t<std::remove_reference_t<decltype(std::declval<torch::autograd::Edge>().function)>>;

template <class T, class... A>
NodePtr make_node(A&&... a) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<A>(a)...);
  } else {
    return c10::make_intrusive<T>(std::forward<A>(a)...);
  }
}

struct FormulaNode final : public torch::autograd::Node {
  FormulaNode(std::shared_ptr<const Formula> f, std::string fwd_name)
      : formula(std::move(f)), forward_name(std::move(fwd_name)) {}

  std::shared_ptr<const Formula> formula;
  std::string forward_name;
  std::vector<c10::IValue> scalars;                       // per forward argument (non-tensors)
  std::vector<torch::autograd::SavedVariable> saved_in;   // per forward argument (tensors; empty otherwise)
  std::vector<bool> has_in;
  std::vector<torch::autograd::SavedVariable> saved_out;  // per forward output
  std::vector<bool> has_out;
  std::vector<std::vector<int64_t>> out_sizes;
  std::vector<at::TensorOptions> out_opts;
  std::vector<int64_t> edge_of_arg;  // forward argument -> edge index, or -1 for non-tensors

  std::string name() const override { return forward_name + "Backward"; }

  void release_variables() override {
    for (auto& s : saved_in) s.reset_data();
    for (auto& s : saved_out) s.reset_data();
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const Formula& f = *formula;
    for (size_t a = 0; a < edge_of_arg.size(); ++a) {
      const int64_t e = edge_of_arg[a];
      if (e >= 0 && should_compute_output(static_cast<size_t>(e)) && !f.unsupported[a].empty()) {
        throw c10::NotImplementedError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, f.unsupported[a]);
      }
    }
    TORCH_CHECK(!f.backward.empty(), "Trying to backward through ", forward_name,
                " but no autograd formula was registered. Please use register_autograd to add one.");
    const auto& bwd = f.backward_op();
    torch::jit::Stack stack;
    auto self = getptr();
    for (const auto& [kind, k] : f.args) {
      const auto ku = static_cast<size_t>(k);
      if (kind == 'g') {
        // undefined output gradients are zeros, as autograd.Function's materialize_grads makes them
        stack.emplace_back(grads[ku].defined() ? grads[ku] : at::zeros(out_sizes[ku], out_opts[ku]));
      } else if (kind == 'i') {
        if (has_in[ku]) stack.emplace_back(saved_in[ku].unpack(self));
        else stack.push_back(scalars[ku]);
      } else {
        stack.emplace_back(saved_out[ku].unpack(self));
      }
    }
    bwd.callBoxed(&stack);
    torch::autograd::variable_list result(num_outputs());
    for (size_t a = 0; a < edge_of_arg.size(); ++a) {
      const int64_t e = edge_of_arg[a];
      const int64_t src = f.grad_of[a];
      if (e < 0 || src < 0 || !should_compute_output(static_cast<size_t>(e))) continue;
      result[static_cast<size_t>(e)] = stack[static_cast<size_t>(src)].toTensor();
    }
    return result;
  }
};

class AutogradKernel final : public c10::OperatorKernel {
 public:
  AutogradKernel(std::shared_ptr<const Formula> f, std::string name) : formula_(std::move(f)), name_(std::move(name)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    const size_t first = stack->size() - n;
    bool needs = false;
    if (torch::autograd::GradMode::is_enabled()) {
      for (size_t i = first; i < first + n; ++i) {
        const auto& v = (*stack)[i];
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad()) needs = true;
      }
    }
    if (!needs) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
      return;
    }
    std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
    }
    const size_t n_ret = op.schema().returns().size();
    const size_t rfirst = stack->size() - n_ret;
    NodePtr node_ptr = make_node<FormulaNode>(formula_, name_);
    auto* node = static_cast<FormulaNode*>(node_ptr.get());
    torch::autograd::variable_list tensor_inputs;
    node->edge_of_arg.assign(n, -1);
    node->scalars.resize(n);
    node->saved_in.resize(n);
    node->has_in.assign(n, false);
    std::vector<bool> need_in(n, false), need_out(n_ret, false);
    for (const auto& [kind, k] : formula_->args) {
      if (kind == 'i') need_in[static_cast<size_t>(k)] = true;
      if (kind == 'o') need_out[static_cast<size_t>(k)] = true;
    }
    for (size_t a = 0; a < n; ++a) {
      if (args[a].isTensor()) {
        node->edge_of_arg[a] = static_cast<int64_t>(tensor_inputs.size());
        tensor_inputs.push_back(args[a].toTensor());
      } else {
        node->scalars[a] = args[a];
      }
    }
    node->set_next_edges(torch::autograd::collect_next_edges(tensor_inputs));
    for (size_t a = 0; a < n; ++a) {
      if (need_in[a] && args[a].isTensor()) {
        node->saved_in[a] = torch::autograd::SavedVariable(args[a].toTensor(), false);
        node->has_in[a] = true;
      }
    }
    node->saved_out.resize(n_ret);
    node->has_out.assign(n_ret, false);
    for (size_t r = 0; r < n_ret; ++r) {
      const at::Tensor& out = (*stack)[rfirst + r].toTensor();
      node->out_sizes.push_back(out.sizes().vec());
      node->out_opts.push_back(out.options());
      torch::autograd::set_history(out, node_ptr);
    }
    for (size_t r = 0; r < n_ret; ++r) {
      if (need_out[r]) {
        node->saved_out[r] = torch::autograd::SavedVariable((*stack)[rfirst + r].toTensor(), true);
        node->has_out[r] = true;
      }
    }
  }

 private:
  std::shared_ptr<const Formula> formula_;
  std::string name_;
};

std::shared_ptr<const Formula> parse_formula(const std::string& text, size_t n_args) {
  // line 1: backward qualname; line 2: args ("g0 i1 o0"); line 3: grad_of per forward arg ("0 1 -");
  // further lines "u<arg> message": that argument's gradient is not supported.
  auto f = std::make_shared<Formula>();
  f->grad_of.assign(n_args, -1);
  f->unsupported.assign(n_args, "");
  if (text.empty()) return f;
  std::istringstream in(text);
  std::string line;
  std::getline(in, f->backward);
  std::getline(in, line);
  {
    std::istringstream toks(line);
    std::string t;
    while (toks >> t) {
      TORCH_CHECK(t.size() >= 2 && (t[0] == 'g' || t[0] == 'i' || t[0] == 'o'), "opgate replay: bad formula arg ", t);
      f->args.emplace_back(t[0], std::stoll(t.substr(1)));
    }
  }
  std::getline(in, line);
  {
    std::istringstream toks(line);
    std::string t;
    size_t a = 0;
    while (toks >> t) {
      TORCH_CHECK(a < n_args, "opgate replay: formula has more gradients than the op has arguments");
      f->grad_of[a++] = t == "-" ? -1 : std::stoll(t);
    }
  }
  while (std::getline(in, line)) {
    if (line.size() < 2 || line[0] != 'u') continue;
    const size_t sp = line.find(' ');
    const auto a = static_cast<size_t>(std::stoll(line.substr(1, sp - 1)));
    TORCH_CHECK(a < n_args, "opgate replay: unsupported-gradient index out of range");
    f->unsupported[a] = sp == std::string::npos ? "gradient not supported" : line.substr(sp + 1);
  }
  return f;
}

void set_error(char* err, size_t cap, const std::string& msg) {
  if (err == nullptr || cap == 0) return;
  const size_t n = std::min(cap - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace
}  // namespace opgate_replay

using namespace opgate_replay;

extern "C" {

int opgate_replay_abi() { return kAbi; }

// Registers the replay kernel for ``qualname`` ("ns::name") at ``backend_key`` and, when
// ``autograd_key`` is non-empty, the formula's autograd kernel there.  0 ok, else -1 with ``err``.
int opgate_replay_register(const char* qualname, const char* backend_key, const char* autograd_key,
                           const char* formula, char* err, size_t errlen) {
  try {
    const std::string q(qualname);
    const size_t sep = q.find("::");
    TORCH_CHECK(sep != std::string::npos, "qualname must be ns::name, got ", q);
    const std::string ns = q.substr(0, sep), name = q.substr(sep + 2);
    const auto& handle = c10::Dispatcher::singleton().findSchemaOrThrow(q.c_str(), "");
    std::lock_guard<std::mutex> lock(g_mu);
    auto& slot = ops()[q];
    TORCH_CHECK(!slot, q, " is already registered for replay");
    slot = std::make_unique<OpState>();
    slot->qualname = q;
    auto backend = std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                                    c10::parseDispatchKey(backend_key), __FILE__, __LINE__);
    backend->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ReplayKernel>(slot.get())));
    libraries().push_back(std::move(backend));
    if (autograd_key != nullptr && autograd_key[0] != '\0') {
      auto f = parse_formula(formula ? formula : "", handle.schema().arguments().size());
      auto ag = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::parseDispatchKey(autograd_key),
                                                 __FILE__, __LINE__);
      ag->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(f, q)));
      libraries().push_back(std::move(ag));
    }
    return 0;
  } catch (const std::exception& e) {
    set_error(err, errlen, e.what());
    return -1;
  }
}

// The Python callable run on a plan miss; called with the GIL held (ctypes.PyDLL).
void opgate_replay_set_handler(PyObject* fn) {
  Py_XINCREF(fn);
  Py_XDECREF(g_handler);
  g_handler = fn;
}

void opgate_replay_clear() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& [name, st] : ops()) {
    std::lock_guard<std::mutex> l(st->mu);
    st->plans.clear();
  }
}

// hits, misses, python calls, plans held (all -1 for an unknown op).
void opgate_replay_stats(const char* qualname, int64_t* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = ops().find(qualname);
  if (it == ops().end()) {
    for (int i = 0; i < 4; ++i) out[i] = -1;
    return;
  }
  OpState& st = *it->second;
  std::lock_guard<std::mutex> l(st.mu);
  out[0] = st.hits.load();
  out[1] = st.misses.load();
  out[2] = st.python_calls.load();
  out[3] = static_cast<int64_t>(st.plans.size());
}

// Every call to Python (1) or replayed where a plan exists (0).
void opgate_replay_set_bypass(int on) { g_bypass.store(on != 0); }

// Tests: log launches instead of calling the driver.
void opgate_replay_set_dry_run(int on) { g_dry_run.store(on != 0); }

// Copies the dry-run log out (at most ``cap`` words) and clears it; returns the word count.
size_t opgate_replay_take_log(int64_t* buf, size_t cap) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  const size_t n = g_log.size();
  if (buf == nullptr || cap < n) return n;
  std::memcpy(buf, g_log.data(), n * sizeof(int64_t));
  g_log.clear();
  return n;
}

}  // extern "C"
