// A GGUF file's weights in their own block formats: what every block family gives the step.
//
// A tensor in a GGUF file is rows of blocks; a row of ``in`` weights is ``in / block`` blocks of
// ``bytes`` bytes (``type_info``).  Each family file holds its formats' layouts (as ggml writes
// them, little-endian), a row's de-quantization to float32 and a row's dot product with activations:
//
//   gguf_legacy.cpp   Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL   blocks of 32 weights, one float16 step each
//   gguf_kquants.cpp  Q2_K, Q3_K, Q4_K, Q5_K, Q6_K          super-blocks of 256 with packed sub-block scales
//   gguf_float.cpp    F32, F16, BF16                         one weight a value
//
// Activations (a row of the layer's float32 inputs) are quantized once a projection to 15-bit integers
// (int16, |q| at most 127 * 128) with one float32 step per 32 inputs (``Act32``, with the block's sum for
// formats that add a minimum) or per 256 (``Act256``, with the sums of its sixteen 16-input runs for the
// K formats' minimums), and multiplied by the weights widened to int16 once for every row (the K
// formats' times their sub-block scales) with AVX2's madd.  15 bits keep a decode step's logits as near
// a float32 product's as q8-cpu's (8 bits, as ggml uses, flipped 2 % of a real model's greedy choices).
// The integer products are exact within a block; blocks add in float32.  ``dot_rows`` decodes each
// block of a weight row once for up to four rows of activations, and gives every row the same
// sums in the same order whatever the rows beside it, so a row's result never depends on them.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define GGUF_AVX2 1  // the families' AVX2 paths (else plain C++)
#endif

namespace gguf {

// ggml's type ids, as a GGUF file stores them
enum Type : int {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, BF16 = 30,
};

// What a dot product of a format takes: float32 inputs, or inputs quantized per 32 or per 256
enum class Act { Float, Q32, Q256 };

struct TypeInfo {
  int block;  // weights a block
  int bytes;  // bytes a block
  Act act;    // the activations its dot product reads
};

// The format of ``type``; ``block`` is 0 for a type this file does not know.
TypeInfo type_info(int type);

struct Act32 {  // 32 inputs: x ~= d * q (q 15 bits); s = d * sum(q) (for formats with a minimum)
  float d, s;
  int16_t q[32];
};

struct Act256 {  // 256 inputs: x ~= d * q (q 15 bits) = d * (128 hi + lo), lo in 0..127; sums[i]: of q over 16 i ..
  float d;
  int16_t q[256];
  int8_t hi[256], lo[256];  // q as two bytes, for 8-bit products (maddubs) by small unsigned weights
  int32_t sums[16];
};

constexpr int MAX_ROWS = 4;  // rows of activations a weight block is decoded for at once

struct Rows {  // up to MAX_ROWS rows of one projection's inputs, as the format's dot product reads them
  int n;
  const float* x[MAX_ROWS];
  const Act32* a32[MAX_ROWS];
  const Act256* a256[MAX_ROWS];
};

void quantize_act32(const float* x, Act32* out, int64_t n);   // n a multiple of 32
void quantize_act256(const float* x, Act256* out, int64_t n); // n a multiple of 256

// One row of ``n`` weights of ``type`` at ``w`` -> float32 ``y``.
void dequantize_row(int type, const uint8_t* w, float* y, int64_t n);

// A row of ``n`` weights of ``type`` at ``w`` times ``rows.n`` rows of activations -> out[0 .. rows.n - 1]:
// ``rows.x`` (float32, always given) and their quantized forms (``a32`` / ``a256``: given where
// ``type_info(type).act`` asks for them).
void dot_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out);

// The families' own entry points (dispatched by the two above).
namespace legacy {
void dequantize(int type, const uint8_t* w, float* y, int64_t n);
void dot_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out);
}  // namespace legacy
namespace kquants {
void dequantize(int type, const uint8_t* w, float* y, int64_t n);
void dot_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out);
}  // namespace kquants
namespace floats {
void dequantize(int type, const uint8_t* w, float* y, int64_t n);
void dot_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out);
}  // namespace floats

// Where a format has no integer path: ``span`` weights de-quantized at a time (``dequantize(w, y)``, w
// advanced by ``bytes`` a span) and multiplied by every row's float32 inputs in 16 fixed lanes.
template <typename Dequantize>
void float_rows(const uint8_t* w, int span, int bytes, const Rows& rows, int64_t n, float* out, Dequantize dequantize) {
  float acc[MAX_ROWS][16] = {};
  alignas(32) float y[256];
  for (int64_t i = 0; i < n; i += span, w += bytes) {
    dequantize(w, y);
    for (int r = 0; r < rows.n; ++r)
      for (int j = 0; j < span; j += 16)
        for (int k = 0; k < 16; ++k) acc[r][k] += y[j + k] * rows.x[r][i + j + k];
  }
  for (int r = 0; r < rows.n; ++r) {
    float s = 0.f;
    for (float v : acc[r]) s += v;
    out[r] = s;
  }
}

#if defined(__AVX2__)
// The sum of 8 float lanes (also the native step's)
inline float hsum8(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
}
#endif

// A little-endian value of type T at p (blocks are not aligned)
template <typename T>
inline T read_le(const uint8_t* p) {
  T v;
  __builtin_memcpy(&v, p, sizeof(T));
  return v;
}

// float16 and bfloat16 bits -> float32 (inline: a step is converted for every block)
float half_to_float_plain(uint16_t h);
inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return half_to_float_plain(h);
#endif
}
inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

}  // namespace gguf
