// Elementwise math the CPU kernels share, written so that GCC vectorises the loops that
// call it (std::exp on float would be a scalar libm call per element). Included by the
// kernels' .cpp files; cpu_kernels hashes it into every kernel's build key.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace linbench {

// exp for float, vectorisable: x = k ln2 + r with |r| <= ln2 / 2, e^r by Cephes' degree-5
// polynomial (within 1 ulp of the exact value), 2^k written into the exponent bits. The
// input is clamped so that 2^k stays a normal float: below the clamp the result is 0 (the
// true value is a denormal at most), above it 2.2e38 (the scan's dt A <= 0 never gets there).
inline float exp_approx(float x) {
    const float lo = -87.3f, hi = 88.3f;
    // lo > x ? lo : x is maxps(lo, x), which passes a NaN x through (as does the min).
    float xc = lo > x ? lo : x;
    xc = hi < xc ? hi : xc;
    const float k = std::nearbyint(xc * 1.44269504088896341f);
    // fma, so that -fassociative-math cannot fold the two parts of ln2 into one constant
    const float r = std::fma(k, 2.12194440e-4f, std::fma(k, -0.693359375f, xc));
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * r * r + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : er * scale;
}

// double exists for exact tests; its speed does not matter.
inline double exp_approx(double x) { return std::exp(x); }

template <typename S>
inline S sigmoid(S x) { return S(1) / (S(1) + exp_approx(-x)); }

}  // namespace linbench
