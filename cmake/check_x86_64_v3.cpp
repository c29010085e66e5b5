// Configure-time check (cmake/ChooseCpuArch.cmake, MHAR_CPU_ARCH=auto): compiled with -march=x86-64-v3 and
// run on the build machine. Exits 0 only when the CPU has what x86-64-v3 code may use; on a CPU
// without AVX2 the vector loop below can also die with SIGILL, which counts as "no" as well.
#include <immintrin.h>

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("bmi") || !__builtin_cpu_supports("bmi2"))
    return 1;
  volatile float in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = in[i];
  __m256 v = _mm256_loadu_ps(a);
  v = _mm256_fmadd_ps(v, v, v);  // an FMA instruction, VEX-encoded
  _mm256_storeu_ps(a, v);
  return a[7] == 72.0f ? 0 : 1;
}
