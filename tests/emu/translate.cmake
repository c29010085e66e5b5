# cmake -DIN=cuda/routing.cu -DOUT=build/.../routing.emu.cpp -P translate.cmake
#
# Turns a .cu file (or a .cuh header with device code) into C++ the CPU emulator
# (include/cuda_runtime.h) compiles. Only the launch syntax and the shared-memory declarations
# change; every other line is the kernel source as written, and `#line` keeps compiler messages
# pointing at cuda/*.
#   kernel<<<grid, block, smem>>>(args)  ->  mhar_emu::launch(kernel, "kernel", mhar_emu::Config(grid, block, smem))(args)
#                                            (the name, for the planted fault MHAR_EMU_WRONG_KERNEL)
#   extern __shared__ float smem[];      ->  float* smem = mhar_emu::dynamic_shared<float>();
#   __shared__ float s[8][32];           ->  auto& s = mhar_emu::static_shared<float[8][32]>([] {});
#                                            (one array per declaration, NaN at every block's start)
#   #include "x.h"                       ->  #include "cuda/x.h"  (the output lives in the build tree)
file(READ "${IN}" src)
string(REGEX REPLACE "extern __shared__ ([A-Za-z0-9_]+) ([A-Za-z0-9_]+)\\[\\];"
       "\\1* \\2 = mhar_emu::dynamic_shared<\\1>();" src "${src}")
string(REGEX REPLACE "__shared__ ([A-Za-z0-9_:]+) ([A-Za-z0-9_]+)((\\[[^];]+\\])+);"
       "auto& \\2 = mhar_emu::static_shared<\\1\\3>([] {});" src "${src}")
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*)<<<" "mhar_emu::launch(\\1, \"\\1\", mhar_emu::Config(" src "${src}")
string(REPLACE ">>>(" "))(" src "${src}")
string(REGEX REPLACE "#include \"([A-Za-z0-9_]+\\.(h|cuh))\"" "#include \"cuda/\\1\"" src "${src}")
foreach(left "<<<" ">>>" "__shared__")
  string(FIND "${src}" "${left}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "translate.cmake: '${left}' left untranslated in ${IN} (offset ${at})")
  endif()
endforeach()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
