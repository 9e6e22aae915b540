// The block families' dispatch and the activations' quantization (see gguf_blocks.h).
//
// Activations are quantized as ggml quantizes them for its integer dots: per block, step d =
// max |x| / 127 and q = round(x / d) (0 for a block of zeros), so the same inputs give the same
// integers on every CPU.
#include <algorithm>
#include <cmath>

#include "gguf_blocks.h"

namespace gguf {

TypeInfo type_info(int type) {
#if defined(__AVX2__) && defined(__FMA__)
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
inline float block_step(const float* x, int64_t n) {
  float top = 0.f;
  for (int64_t j = 0; j < n; ++j) top = std::max(top, std::fabs(x[j]));
  return top / 127.f;
}
}  // namespace

void quantize_act32(const float* x, Act32* out, int64_t n) {
  for (int64_t i = 0; i < n / 32; ++i, x += 32) {
    const float d = block_step(x, 32), inv = d > 0.f ? 1.f / d : 0.f;
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) {
      out[i].q[j] = static_cast<int8_t>(std::nearbyint(x[j] * inv));
      s += out[i].q[j];
    }
    out[i].d = d;
    out[i].s = d * static_cast<float>(s);
  }
}

void quantize_act256(const float* x, Act256* out, int64_t n) {
  for (int64_t i = 0; i < n / 256; ++i, x += 256) {
    const float d = block_step(x, 256), inv = d > 0.f ? 1.f / d : 0.f;
    for (int j = 0; j < 256; ++j) out[i].q[j] = static_cast<int8_t>(std::nearbyint(x[j] * inv));
    for (int r = 0; r < 16; ++r) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += out[i].q[16 * r + j];
      out[i].sums[r] = static_cast<int16_t>(s);
    }
    out[i].d = d;
  }
}

void dequantize_row(int type, const uint8_t* w, float* y, int64_t n) {
  switch (type_info(type).block) {
    case 1: floats::dequantize(type, w, y, n); break;
    case 32: legacy::dequantize(type, w, y, n); break;
    default: kquants::dequantize(type, w, y, n); break;
  }
}

float dot(int type, const uint8_t* w, const float* x, const Act32* a32, const Act256* a256, int64_t n) {
  switch (type_info(type).block) {
    case 1: return floats::dot(type, w, x, n);
    case 32: return legacy::dot(type, w, a32, n);
    default: return kquants::dot(type, w, x, type_info(type).act == Act::Q256 ? a256 : nullptr, n);
  }
}

}  // namespace gguf
