// GGUF's blocks of 32 weights with one float16 step (ggml's "legacy" formats and IQ4_NL).
//
//   Q4_0   18 bytes: d, 16 bytes of nibbles          w = d * (q - 8)
//   Q4_1   20 bytes: d, m, 16 bytes of nibbles       w = d * q + m
//   Q5_0   22 bytes: d, 4 bytes of fifth bits, nibbles  w = d * (q - 16)
//   Q5_1   24 bytes: d, m, fifth bits, nibbles       w = d * q + m
//   Q8_0   34 bytes: d, 32 int8                      w = d * q
//   IQ4_NL 18 bytes: d, nibbles indexing 16 levels   w = d * LEVELS[q]
//
// Weight j < 16 is the low nibble of byte j, weight j + 16 its high nibble; Q5's fifth bit of weight
// j is bit j of the 32-bit word after the step(s).  The dot products take activations quantized per
// 32 (Act32, 15-bit int16): over a block d_w * d_a * sum(q_w * q_a), exact in int32 (AVX2: the weights
// widened to int16 once for every row, madd), plus m * s_a where the format has a minimum.  The AVX2 path and plain C++ add the blocks in eight float lanes alike, and differ only
// where one rounds a fused multiply-add the other rounds twice.
#include "gguf_blocks.h"

#include <cstring>


namespace gguf {
namespace {

constexpr int8_t IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline uint16_t u16(const uint8_t* p) { return read_le<uint16_t>(p); }
inline uint32_t u32(const uint8_t* p) { return read_le<uint32_t>(p); }

// The 32 integer weights of a block (before its step and minimum), and where its nibbles start.
struct Layout {
  int bytes, nibbles;  // block size; offset of the nibbles (Q8_0: of the int8 weights)
  bool minimum, fifth;
};

constexpr Layout layout(int type) {
  switch (type) {
    case Q4_0: return {18, 2, false, false};
    case Q4_1: return {20, 4, true, false};
    case Q5_0: return {22, 6, false, true};
    case Q5_1: return {24, 8, true, true};
    case Q8_0: return {34, 2, false, false};
    default: return {18, 2, false, false};  // IQ4_NL
  }
}

// q[0..31] as the integers the step multiplies (offsets applied: Q4_0 -8, Q5_0 -16, IQ4_NL's levels)
inline void block_ints(int type, const uint8_t* b, int8_t* q) {
  const Layout l = layout(type);
  const uint8_t* nib = b + l.nibbles;
  if (type == Q8_0) {
    std::memcpy(q, nib, 32);
    return;
  }
  const uint32_t high = l.fifth ? u32(b + l.nibbles - 4) : 0u;
  for (int j = 0; j < 16; ++j) {
    int lo = nib[j] & 0x0F, hi = nib[j] >> 4;
    if (l.fifth) {
      lo |= ((high >> j) & 1u) << 4;
      hi |= ((high >> (j + 16)) & 1u) << 4;
    }
    switch (type) {
      case Q4_0: lo -= 8; hi -= 8; break;
      case Q5_0: lo -= 16; hi -= 16; break;
      case IQ4_NL: lo = IQ4_LEVELS[lo]; hi = IQ4_LEVELS[hi]; break;
      default: break;
    }
    q[j] = static_cast<int8_t>(lo);
    q[j + 16] = static_cast<int8_t>(hi);
  }
}

#ifdef GGUF_AVX2
// 16 bytes of nibbles -> 32 bytes: low nibbles, then high nibbles
inline __m256i nibbles32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
// 32 bits -> 32 bytes, 0xFF where the bit is set
inline __m256i bits32(const uint8_t* p) {
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(u32(p))), shuffle);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}
// the block's 32 integer weights in a register, as block_ints gives them
inline __m256i block_ints_avx2(int type, const uint8_t* b) {
  switch (type) {
    case Q8_0: return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    case Q4_0: return _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8));
    case Q4_1: return nibbles32(b + 4);
    case Q5_0: {  // (q | 0xF0 where the fifth bit is clear) read as int8 is q - 16 there, q + 16 - 16 elsewhere
      const __m256i clear = _mm256_andnot_si256(bits32(b + 2), _mm256_set1_epi8(static_cast<char>(0xF0)));
      return _mm256_or_si256(nibbles32(b + 6), clear);
    }
    case Q5_1: return _mm256_or_si256(nibbles32(b + 8), _mm256_and_si256(bits32(b + 4), _mm256_set1_epi8(0x10)));
    default: {  // IQ4_NL: each nibble looks up its level
      const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(IQ4_LEVELS));
      return _mm256_shuffle_epi8(_mm256_set_m128i(levels, levels), nibbles32(b + 2));
    }
  }
}
#endif

}  // namespace

namespace legacy {

void dequantize(int type, const uint8_t* w, float* y, int64_t n) {
  const Layout l = layout(type);
#ifdef GGUF_AVX2
  for (int64_t i = 0; i < n / 32; ++i, w += l.bytes, y += 32) {
    const __m256 d = _mm256_set1_ps(half_to_float(u16(w)));
    const __m256 m = _mm256_set1_ps(l.minimum ? half_to_float(u16(w + 2)) : 0.f);
    alignas(32) int8_t q[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), block_ints_avx2(type, w));
    for (int k = 0; k < 4; ++k) {  // d * q + m, 8 weights at a time (the same float32 operations as below)
      const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * k)));
      _mm256_storeu_ps(y + 8 * k, _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(wide)), m));
    }
  }
#else
  int8_t q[32];
  for (int64_t i = 0; i < n / 32; ++i, w += l.bytes, y += 32) {
    const float d = half_to_float(u16(w));
    const float m = l.minimum ? half_to_float(u16(w + 2)) : 0.f;
    block_ints(type, w, q);
    for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]) + m;
  }
#endif
}

namespace {

template <int R, int TYPE>
void rows_of(const uint8_t* w, const Rows& rows, int64_t n, float* out) {
  constexpr int type = TYPE;  // each format's loop compiled apart: its block decoding inlined
  const Layout l = layout(type);
  const int64_t blocks = n / 32;
  float minimums[R] = {};
#ifdef GGUF_AVX2
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < blocks; ++i, w += l.bytes) {
    const __m256i q = block_ints_avx2(type, w);  // widened to int16 once for every row
    const __m256i q0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
    const __m256i q1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
    const float dw = half_to_float(u16(w));
    const float m = l.minimum ? half_to_float(u16(w + 2)) : 0.f;
    for (int r = 0; r < R; ++r) {
      const Act32& a = rows.a32[r][i];
      const __m256i p0 = _mm256_madd_epi16(q0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q)));
      const __m256i p1 = _mm256_madd_epi16(q1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + 16)));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), _mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), acc[r]);
      if (l.minimum) minimums[r] += m * a.s;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(acc[r]) + minimums[r];
#else
  float lanes[R][8] = {};
  int8_t q[32];
  for (int64_t i = 0; i < blocks; ++i, w += l.bytes) {
    block_ints(type, w, q);
    const float dw = half_to_float(u16(w));
    const float m = l.minimum ? half_to_float(u16(w + 2)) : 0.f;
    for (int r = 0; r < R; ++r) {
      const Act32& a = rows.a32[r][i];
      for (int k = 0; k < 8; ++k) {
        int32_t s = 0;
        for (int j : {2 * k, 2 * k + 1, 2 * k + 16, 2 * k + 17}) s += static_cast<int32_t>(q[j]) * a.q[j];
        lanes[r][k] += dw * a.d * static_cast<float>(s);
      }
      if (l.minimum) minimums[r] += m * a.s;
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* v = lanes[r];
    out[r] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])) + minimums[r];
  }
#endif
}

}  // namespace

template <int TYPE>
void rows_typed(const uint8_t* w, const Rows& rows, int64_t n, float* out) {
  switch (rows.n) {
    case 1: rows_of<1, TYPE>(w, rows, n, out); break;
    case 2: rows_of<2, TYPE>(w, rows, n, out); break;
    case 3: rows_of<3, TYPE>(w, rows, n, out); break;
    default: rows_of<4, TYPE>(w, rows, n, out); break;
  }
}

void dot_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out) {
  switch (type) {
    case Q4_0: rows_typed<Q4_0>(w, rows, n, out); break;
    case Q4_1: rows_typed<Q4_1>(w, rows, n, out); break;
    case Q5_0: rows_typed<Q5_0>(w, rows, n, out); break;
    case Q5_1: rows_typed<Q5_1>(w, rows, n, out); break;
    case Q8_0: rows_typed<Q8_0>(w, rows, n, out); break;
    default: rows_typed<IQ4_NL>(w, rows, n, out); break;
  }
}

}  // namespace legacy
}  // namespace gguf
