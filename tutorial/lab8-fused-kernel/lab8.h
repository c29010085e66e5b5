/**
 * @file lab8.h
 * @brief Lab 8: the routing forward a student writes (student_routing.cu), the broken one
 *        (broken_routing.cu) and the answer (answer_routing.cpp) share this signature: device
 *        pointers, layouts of cuda/routing.h (sources N × P × d, alpha N × P × H, out P × d).
 */
#pragma once

/// True when the kernel handles width d with H heads.
bool lab8_supports(int d, int H);
/// out = Σ_i α_i · S_i and alpha, for eps = 1e-6, logit scale 1, key gain g (docs/design.md).
void lab8_routing_forward(float* out, float* alpha, const float* sources, const float* q,
                          const float* g, int N, int P, int d, int H);
