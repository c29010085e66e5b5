# MHAR_CPU_ARCH=auto on x86-64: the widest -march level this CPU runs that is also faster here.
#
# x86-64-v4 (AVX-512) is taken when the CPU runs it, unless a measurement on this CPU says that
# x86-64-v3 (AVX2 + FMA) is faster: both levels of a small Eigen SGEMM program (gemm_probe.cpp, the
# model's matrix shapes, one thread) are built and run here, alternately, three times each, and v3
# is kept only when its best rate beats v4's by more than 3 %. (GCC 12 tuned one AMD machine's
# AVX-512 code so that v3 was faster; an Intel Xeon ran v4 1.5× faster: docs/benchmarks.md.) On a
# CPU without AVX-512, x86-64-v3 when it runs; on one without AVX2, -march is left off.
#
# The choice is kept in the cache with the CPU's model name, so a reconfigure on the same machine
# does not measure again; a build directory moved to another CPU measures anew. Sets MHAR_MARCH.

function(mhar_cpu_model_name out)
  set(name "unknown CPU")
  if(EXISTS /proc/cpuinfo)
    file(STRINGS /proc/cpuinfo lines REGEX "^model name" LIMIT_COUNT 1)
    if(lines)
      string(REGEX REPLACE "^model name[ \t]*:[ \t]*" "" name "${lines}")
    endif()
  endif()
  set(${out} "${name}" PARENT_SCOPE)
endfunction()

# Builds cmake/check_x86_64_<level>.cpp with -march=x86-64-<level> and runs it: ok is TRUE when
# this CPU runs code of that level.
function(mhar_cpu_runs level ok)
  try_run(runs compiles ${CMAKE_BINARY_DIR}/check-x86-64-${level}
          ${CMAKE_SOURCE_DIR}/cmake/check_x86_64_${level}.cpp
          COMPILE_DEFINITIONS -march=x86-64-${level})
  if(compiles AND runs EQUAL 0)
    set(${ok} TRUE PARENT_SCOPE)
  else()
    set(${ok} FALSE PARENT_SCOPE)
  endif()
endfunction()

# Builds gemm_probe.cpp at -march=x86-64-<level> into ${CMAKE_BINARY_DIR}/gemm-probe-<level>;
# exe is the program's path, or empty when it did not build.
function(mhar_build_gemm_probe level exe)
  set(path ${CMAKE_BINARY_DIR}/gemm-probe-${level})
  try_compile(built ${CMAKE_BINARY_DIR}/gemm-probe-${level}-build
              ${CMAKE_SOURCE_DIR}/cmake/gemm_probe.cpp
              COMPILE_DEFINITIONS -O3 -DNDEBUG -march=x86-64-${level}
              LINK_LIBRARIES Eigen3::Eigen
              COPY_FILE ${path})
  if(built)
    set(${exe} ${path} PARENT_SCOPE)
  else()
    set(${exe} "" PARENT_SCOPE)
  endif()
endfunction()

# Runs the probes at exe4 and exe3 alternately, `rounds` times each; best_v4 and best_v3 are the
# best GFLOP/s of each.
function(mhar_race_gemm_probes exe4 exe3 rounds best_v4 best_v3)
  set(b4 0)
  set(b3 0)
  foreach(i RANGE 1 ${rounds})
    foreach(level 4 3)
      execute_process(COMMAND ${exe${level}} OUTPUT_VARIABLE rate RESULT_VARIABLE rc
                      OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(rc EQUAL 0 AND rate MATCHES "^[0-9.]+$" AND rate GREATER b${level})
        set(b${level} ${rate})
      endif()
    endforeach()
  endforeach()
  set(${best_v4} ${b4} PARENT_SCOPE)
  set(${best_v3} ${b3} PARENT_SCOPE)
endfunction()

# v4 versus v3 on this CPU: sets level (v4 or v3) and why (the numbers, for the configure line).
function(mhar_measure_v4_against_v3 level why)
  mhar_build_gemm_probe(v4 exe4)
  mhar_build_gemm_probe(v3 exe3)
  if(NOT exe4 OR NOT exe3)
    set(${level} v4 PARENT_SCOPE)
    set(${why} "the SGEMM probe did not build, so not measured" PARENT_SCOPE)
    return()
  endif()
  mhar_race_gemm_probes(${exe4} ${exe3} 3 r4 r3)
  # v3 is kept only when it is faster by more than 3 %: r3 > 1.03 · r4, in integer arithmetic.
  string(REGEX REPLACE "\\..*" "" i4 "${r4}")
  string(REGEX REPLACE "\\..*" "" i3 "${r3}")
  math(EXPR v3_scaled "${i3} * 100")
  math(EXPR v4_scaled "${i4} * 103")
  if(v3_scaled GREATER v4_scaled)
    set(${level} v3 PARENT_SCOPE)
    set(${why} "one-thread Eigen SGEMM here: x86-64-v3 ${r3} GFLOP/s, x86-64-v4 ${r4}: v3 is faster"
        PARENT_SCOPE)
  else()
    set(${level} v4 PARENT_SCOPE)
    set(${why} "one-thread Eigen SGEMM here: x86-64-v4 ${r4} GFLOP/s, x86-64-v3 ${r3}" PARENT_SCOPE)
  endif()
endfunction()

# The choice for MHAR_CPU_ARCH=auto: sets MHAR_MARCH in the caller and says why on the configure line.
function(mhar_choose_cpu_arch)
  mhar_cpu_model_name(cpu)
  if(DEFINED CACHE{MHAR_CPU_ARCH_CHOSEN} AND "$CACHE{MHAR_CPU_ARCH_CHOSEN_FOR}" STREQUAL "${cpu}")
    set(MHAR_MARCH "$CACHE{MHAR_CPU_ARCH_CHOSEN}" PARENT_SCOPE)
    message(STATUS "mhar: ${cpu}: -march=${MHAR_CPU_ARCH_CHOSEN}, as chosen at the first configure "
                   "(${MHAR_CPU_ARCH_WHY}); delete MHAR_CPU_ARCH_CHOSEN from the cache to measure again")
    return()
  endif()
  mhar_cpu_runs(v4 runs_v4)
  mhar_cpu_runs(v3 runs_v3)
  if(runs_v4)
    mhar_measure_v4_against_v3(level why)
    set(march x86-64-${level})
    set(why "it runs x86-64-v4 (AVX-512); ${why}")
  elseif(runs_v3)
    set(march x86-64-v3)
    set(why "it runs x86-64-v3 (AVX2 + FMA), not x86-64-v4")
  else()
    set(march "")
    set(why "it cannot run x86-64-v3 code (no AVX2/FMA): the build runs on any x86-64 CPU, "
            "matrix products are slower")
  endif()
  set(MHAR_CPU_ARCH_CHOSEN "${march}" CACHE INTERNAL "-march chosen by MHAR_CPU_ARCH=auto")
  set(MHAR_CPU_ARCH_CHOSEN_FOR "${cpu}" CACHE INTERNAL "the CPU it was chosen on")
  set(MHAR_CPU_ARCH_WHY "${why}" CACHE INTERNAL "why")
  if(march)
    message(STATUS "mhar: ${cpu}: building with -march=${march}: ${why}")
  else()
    message(STATUS "mhar: ${cpu}: -march left off: ${why}")
  endif()
  set(MHAR_MARCH "${march}" PARENT_SCOPE)
endfunction()
