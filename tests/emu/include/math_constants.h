/// @file math_constants.h (emulator): the two constants cuda/*.cu use.
#pragma once
#include <limits>
#define CUDART_NAN_F std::numeric_limits<float>::quiet_NaN()
#define CUDART_INF_F std::numeric_limits<float>::infinity()
