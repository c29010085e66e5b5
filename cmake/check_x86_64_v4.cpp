// Configure-time check (cmake/ChooseCpuArch.cmake, MHAR_CPU_ARCH=auto): compiled with
// -march=x86-64-v4 and run on the build machine. Exits 0 only when the CPU has what x86-64-v4 code
// may use (AVX-512 F, BW, CD, DQ and VL, on top of x86-64-v3); on a CPU without AVX-512 the vector
// line below can also die with SIGILL, which counts as "no" as well.
#include <immintrin.h>

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512cd") || !__builtin_cpu_supports("avx512dq") ||
      !__builtin_cpu_supports("avx512vl"))
    return 1;
  volatile float in[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  float a[16];
  for (int i = 0; i < 16; ++i) a[i] = in[i];
  __m512 v = _mm512_loadu_ps(a);
  v = _mm512_fmadd_ps(v, v, v);  // an EVEX-encoded FMA on 512-bit registers
  _mm512_storeu_ps(a, v);
  return a[15] == 272.0f ? 0 : 1;
}
