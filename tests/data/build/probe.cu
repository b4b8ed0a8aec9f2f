// Planted binary source for the build-check tests: one kernel, no torch.
// Built in the tests with different -gencode sets (sm_80 only, sm_80+sm_90, +PTX).
__global__ void opgate_probe_kernel(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 2.0f * x[i];
}
