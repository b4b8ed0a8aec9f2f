// Planted binary source: a kernel that calls an out-of-line device function and a warp shuffle.
// The device function and the compiler's shuffle helpers must not be counted as kernels.
__device__ __noinline__ float opgate_probe_helper(float v) { return v * 3.0f; }

__global__ void opgate_probe_shfl_kernel(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] : 0.0f;
  v += __shfl_down_sync(0xffffffffu, v, 1);
  if (i < n) x[i] = opgate_probe_helper(v);
}
