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
// Activations (a row of the layer's float32 inputs) are quantized once a projection, as ggml does, to
// 8 bits with one float32 step per 32 inputs (``Act32``, with the block's sum for formats that add a
// minimum) or per 256 (``Act256``, with the sums of its sixteen 16-input runs for the K formats'
// minimums); the integer products are summed exactly in int32 within a block (AVX2's maddubs and
// madd, else plain C++) and in float32 across blocks.  Formats without an integer path here take the
// float32 activations and de-quantize a block at a time.  ``dot`` sums in a fixed order whatever the
// number of rows or threads, so a row's result never depends on what else was computed with it.
#pragma once

#include <cstddef>
#include <cstdint>

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

struct Act32 {  // 32 inputs: x ~= d * q; s = d * sum(q) (for formats with a minimum)
  float d, s;
  int8_t q[32];
};

struct Act256 {  // 256 inputs: x ~= d * q; sums[i] = sum of q over inputs 16 i .. 16 i + 15
  float d;
  int8_t q[256];
  int16_t sums[16];
};

void quantize_act32(const float* x, Act32* out, int64_t n);   // n a multiple of 32
void quantize_act256(const float* x, Act256* out, int64_t n); // n a multiple of 256

// One row of ``n`` weights of ``type`` at ``w`` -> float32 ``y``.
void dequantize_row(int type, const uint8_t* w, float* y, int64_t n);

// A row of ``n`` weights of ``type`` times one row of activations: ``x`` (float32, always given) and
// its quantized forms (``a32`` / ``a256``: given where ``type_info(type).act`` asks for them).
float dot(int type, const uint8_t* w, const float* x, const Act32* a32, const Act256* a256, int64_t n);

// The families' own entry points (dispatched by the two above).
namespace legacy {
void dequantize(int type, const uint8_t* w, float* y, int64_t n);
float dot(int type, const uint8_t* w, const Act32* a, int64_t n);
}  // namespace legacy
namespace kquants {
void dequantize(int type, const uint8_t* w, float* y, int64_t n);
float dot(int type, const uint8_t* w, const float* x, const Act256* a, int64_t n);
}  // namespace kquants
namespace floats {
void dequantize(int type, const uint8_t* w, float* y, int64_t n);
float dot(int type, const uint8_t* w, const float* x, int64_t n);
}  // namespace floats

// float16 and bfloat16 bits -> float32
float half_to_float(uint16_t h);
inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

}  // namespace gguf
