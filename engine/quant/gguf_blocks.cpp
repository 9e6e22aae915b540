// The block families' dispatch and the activations' quantization (see gguf_blocks.h).
//
// Activations are quantized per block to step d = max |x| / (127 * 128) and q = round(x / d) (0 for a
// block of zeros), so the same inputs give the same integers on every CPU.
#include <algorithm>
#include <cmath>

#include "gguf_blocks.h"

namespace gguf {

TypeInfo type_info(int type) {
#ifdef GGUF_AVX2
  constexpr Act k_int = Act::Q256;
#else
  constexpr Act k_int = Act::Float;
#endif
  switch (type) {
    case F32: return {1, 4, Act::Float};
    case F16: return {1, 2, Act::Float};
    case BF16: return {1, 2, Act::Float};
    case Q4_0: return {32, 18, Act::Q32};
    case Q4_1: return {32, 20, Act::Q32};
    case Q5_0: return {32, 22, Act::Q32};
    case Q5_1: return {32, 24, Act::Q32};
    case Q8_0: return {32, 34, Act::Q32};
    case IQ4_NL: return {32, 18, Act::Q32};
    case Q2_K: return {256, 84, Act::Float};
    case Q3_K: return {256, 110, Act::Float};
    case Q4_K: return {256, 144, k_int};
    case Q5_K: return {256, 176, k_int};
    case Q6_K: return {256, 210, k_int};
    default: return {0, 0, Act::Float};
  }
}

namespace {
constexpr float LEVELS = 127.f * 128.f;  // |q| at most 127 * 128: products with the widest weights fit int32

// One block of n inputs -> its step, q = round(x / step), and the sums of q over runs of ``run`` inputs.
inline float quantize(const float* x, int64_t n, int16_t* q, int32_t* sums, int run) {
  float top = 0.f;
  for (int64_t j = 0; j < n; ++j) top = std::max(top, std::fabs(x[j]));
  const float d = top / LEVELS, inv = d > 0.f ? 1.f / d : 0.f;
  for (int64_t j = 0; j < n; ++j) {
    q[j] = static_cast<int16_t>(std::max(-LEVELS, std::min(LEVELS, std::nearbyint(x[j] * inv))));
    sums[j / run] += q[j];
  }
  return d;
}
}  // namespace

void quantize_act32(const float* x, Act32* out, int64_t n) {
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    int32_t sum = 0;
    out[i].d = quantize(x, 32, out[i].q, &sum, 32);
    out[i].s = out[i].d * static_cast<float>(sum);
  }
}

void quantize_act256(const float* x, Act256* out, int64_t n) {
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    std::fill(out[i].sums, out[i].sums + 16, 0);
    out[i].d = quantize(x, 256, out[i].q, out[i].sums, 16);
    for (int j = 0; j < 256; ++j) {
      out[i].hi[j] = static_cast<int8_t>(out[i].q[j] >> 7);  // floor(q / 128): -127 .. 127
      out[i].lo[j] = static_cast<int8_t>(out[i].q[j] & 127);
    }
  }
}

void dequantize_row(int type, const uint8_t* w, float* y, int64_t n) {
  switch (type_info(type).block) {
    case 1: floats::dequantize(type, w, y, n); break;
    case 32: legacy::dequantize(type, w, y, n); break;
    default: kquants::dequantize(type, w, y, n); break;
  }
}

void dot_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out) {
  switch (type_info(type).block) {
    case 1: floats::dot_rows(type, w, rows, n, out); break;
    case 32: legacy::dot_rows(type, w, rows, n, out); break;
    default: kquants::dot_rows(type, w, rows, n, out); break;
  }
}

}  // namespace gguf
