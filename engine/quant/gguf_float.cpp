// GGUF's unquantized weights: F32, F16 and BF16, one value a weight (blocks of one).
//
// A row's dot product multiplies the float32 inputs in 16 fixed lanes, 16 weights converted at a time for
// every row (the compiler vectorizes the loops; float16 converts with F16C where the build has it).
#include <cstring>

#include "gguf_blocks.h"

namespace gguf {

float half_to_float_plain(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace floats {
namespace {

template <typename Read>
float dot_lanes(const uint8_t* w, const float* x, int64_t n, int size, Read read) {
  float acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += read(w + (i + k) * size) * x[i + k];
  float s = 0.f;
  for (float v : acc) s += v;
  for (; i < n; ++i) s += read(w + i * size) * x[i];
  return s;
}

inline float read_f32(const uint8_t* p) { return read_le<float>(p); }
inline uint16_t bits16(const uint8_t* p) { return read_le<uint16_t>(p); }

}  // namespace

void dequantize(int type, const uint8_t* w, float* y, int64_t n) {
  if (type == F32) {
    std::memcpy(y, w, static_cast<size_t>(n) * 4);
  } else if (type == F16) {
    for (int64_t i = 0; i < n; ++i) y[i] = half_to_float(bits16(w + 2 * i));
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(bits16(w + 2 * i));
  }
}

void dot_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out) {
  const int size = type == F32 ? 4 : 2;
  if (n % 16 == 0) {  // 16 weights de-quantized at a time, multiplied by every row
    float_rows(w, 16, 16 * size, rows, n, out, [type](const uint8_t* b, float* y) { dequantize(type, b, y, 16); });
    return;
  }
  for (int r = 0; r < rows.n; ++r) {
    if (type == F32) out[r] = dot_lanes(w, rows.x[r], n, 4, read_f32);
    else if (type == F16) out[r] = dot_lanes(w, rows.x[r], n, 2, [](const uint8_t* p) { return half_to_float(bits16(p)); });
    else out[r] = dot_lanes(w, rows.x[r], n, 2, [](const uint8_t* p) { return bf16_to_float(bits16(p)); });
  }
}

}  // namespace floats
}  // namespace gguf
