// GGUF's K formats: super-blocks of 256 weights, sub-blocks of 16 or 32 with packed scales.
//
//   Q2_K  84 bytes: scales[16] (4-bit step, 4-bit minimum per 16), qs[64] (2 bits), d, dmin
//   Q3_K 110 bytes: hmask[32] (third bit), qs[64] (2 bits), scales[12] (16 6-bit steps, -32), d
//   Q4_K 144 bytes: d, dmin, scales[12] (8 6-bit steps and 8 6-bit minimums), qs[128] (nibbles)
//   Q5_K 176 bytes: d, dmin, scales[12] as Q4_K, qh[32] (fifth bit), qs[128]
//   Q6_K 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8 per 16), d
//
// Weights are w = d * step * q - dmin * minimum (Q2_K, Q4_K, Q5_K) or d * step * (q - offset) (Q3_K: 4,
// where its third bit is clear; Q6_K: 32).  Q4_K, Q5_K and Q6_K multiply activations quantized per
// 256 (Act256, 15-bit int16) with AVX2's madd, exact in int32 within a super-block (Q6_K: a half), the
// weights decoded and scaled once for every row, the minimums through the activations' 16-input sums;
// across super-blocks in eight float lanes.  Q2_K and Q3_K (and every K format on a CPU without
// AVX2) de-quantize a super-block once for every row and multiply the float32 inputs.
#include <cstring>

#include "gguf_blocks.h"


namespace gguf {
namespace {

inline float h16(const uint8_t* p) { return half_to_float(read_le<uint16_t>(p)); }

// Q4_K's and Q5_K's eight 6-bit steps and minimums from their 12 bytes
inline void steps_and_minimums(const uint8_t* s, uint8_t* step, uint8_t* minimum) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      step[j] = s[j] & 63;
      minimum[j] = s[j + 4] & 63;
    } else {
      step[j] = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
      minimum[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
  }
}

void dequantize_q2k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = h16(b + 80), dmin = h16(b + 82);
  int is = 0;
  for (int half = 0; half < 2; ++half, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
      }
    }
  }
}

void dequantize_q3k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* packed = b + 96;
  const float d = h16(b + 108);
  int8_t scales[16];
  for (int j = 0; j < 16; ++j) {  // low 4 bits from bytes 0-7, high 2 bits from bytes 8-11
    const int low = j < 8 ? (packed[j] & 0x0F) : (packed[j - 8] >> 4);
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    scales[j] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
  int is = 0;
  uint8_t m = 1;
  for (int half = 0; half < 2; ++half, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
      for (int part = 0; part < 2; ++part) {
        const float dl = d * static_cast<float>(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * part;
          const int v = ((q[k] >> shift) & 3) - ((hmask[k] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
    }
  }
}

void dequantize_q45k(const uint8_t* b, float* y, bool five) {
  const float d = h16(b), dmin = h16(b + 2);
  uint8_t step[8], minimum[8];
  steps_and_minimums(b + 4, step, minimum);
  const uint8_t* qh = b + 16;
  const uint8_t* q = five ? b + 48 : b + 16;
  for (int p = 0; p < 4; ++p, q += 32) {
    for (int part = 0; part < 2; ++part) {
      const int j = 2 * p + part;
      const float dl = d * static_cast<float>(step[j]), ml = dmin * static_cast<float>(minimum[j]);
      for (int l = 0; l < 32; ++l) {
        int v = part ? (q[l] >> 4) : (q[l] & 0x0F);
        if (five) v |= ((qh[l] >> j) & 1) << 4;
        *y++ = dl * static_cast<float>(v) - ml;
      }
    }
  }
}

void dequantize_q6k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = h16(b + 208);
  for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

int block_bytes(int type) {
  switch (type) {
    case Q2_K: return 84;
    case Q3_K: return 110;
    case Q4_K: return 144;
    case Q5_K: return 176;
    default: return 210;  // Q6_K
  }
}

#ifdef GGUF_AVX2
inline __m256i load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Q4_K's and Q5_K's sub-blocks 2p and 2p + 1 (the low and the high nibbles of qs[32 p ..]), Q5_K's fifth bits
// (bits 2p and 2p + 1 of qh, ``high``) added as 16: the unsigned values, 32 bytes each
inline void q45k_values(const uint8_t* qs, __m256i high, int p, bool five, __m256i& first, __m256i& second) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
  const __m256i bits = load(qs + 32 * p);
  first = _mm256_and_si256(bits, low4);
  second = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
  if (five) {
    const __m256i m0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * p)));
    const __m256i m1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * p + 1)));
    first = _mm256_or_si256(first, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(high, m0), m0), sixteen));
    second = _mm256_or_si256(second, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(high, m1), m1), sixteen));
  }
}

// Q6_K's half ``half`` of a super-block: q[k] its weights 32 k .. 32 k + 31 as unsigned 6-bit values (0..63)
inline void q6k_values(const uint8_t* b, int half, __m256i* q) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i l1 = load(b + 64 * half), l2 = load(b + 64 * half + 32), h = load(b + 128 + 32 * half);
  q[0] = _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x03)), 4));
  q[1] = _mm256_or_si256(_mm256_and_si256(l2, low4), _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(0x0C)), 2));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), _mm256_and_si256(h, _mm256_set1_epi8(0x30)));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), low4),
                         _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(static_cast<char>(0xC0))), 2));
}

// 32 bytes of small integers -> y[0..31] = dl * q - ml (the same float32 operations as the plain loops)
inline void scaled32(__m256i q, float dl, float ml, float* y) {
  alignas(32) uint8_t bytes[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), q);
  const __m256 d = _mm256_set1_ps(dl), m = _mm256_set1_ps(ml);
  for (int k = 0; k < 4; ++k) {
    const __m256i wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * k)));
    _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(wide)), m));
  }
}

void dequantize_q45k_avx2(const uint8_t* b, float* y, bool five) {
  const float d = h16(b), dmin = h16(b + 2);
  uint8_t step[8], minimum[8];
  steps_and_minimums(b + 4, step, minimum);
  const __m256i high = five ? load(b + 16) : _mm256_setzero_si256();
  const uint8_t* q = five ? b + 48 : b + 16;
  for (int p = 0; p < 4; ++p, y += 64) {
    __m256i first, second;
    q45k_values(q, high, p, five, first, second);
    scaled32(first, d * static_cast<float>(step[2 * p]), dmin * static_cast<float>(minimum[2 * p]), y);
    scaled32(second, d * static_cast<float>(step[2 * p + 1]), dmin * static_cast<float>(minimum[2 * p + 1]), y + 32);
  }
}

void dequantize_q6k_avx2(const uint8_t* b, float* y) {
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = h16(b + 208);
  const __m256i m32 = _mm256_set1_epi8(32);
  for (int half = 0; half < 2; ++half, y += 128) {
    __m256i q[4];
    q6k_values(b, half, q);
    for (int k = 0; k < 4; ++k) {
      alignas(32) int8_t v[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_sub_epi8(q[k], m32));
      for (int j = 0; j < 4; ++j) {  // (d * scale) * (q - 32), as the plain loop
        const __m256 scale = _mm256_set1_ps(d * static_cast<float>(sc[8 * half + 2 * k + j / 2]));
        const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + 8 * j)));
        _mm256_storeu_ps(y + 32 * k + 8 * j, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(wide)));
      }
    }
  }
}
#endif

void dequantize_block(int type, const uint8_t* b, float* y) {
#ifdef GGUF_AVX2
  if (type == Q4_K || type == Q5_K) return dequantize_q45k_avx2(b, y, type == Q5_K);
  if (type == Q6_K) return dequantize_q6k_avx2(b, y);
#endif
  switch (type) {
    case Q2_K: dequantize_q2k(b, y); break;
    case Q3_K: dequantize_q3k(b, y); break;
    case Q4_K: dequantize_q45k(b, y, false); break;
    case Q5_K: dequantize_q45k(b, y, true); break;
    default: dequantize_q6k(b, y); break;
  }
}

#ifdef GGUF_AVX2
inline __m256i load16(const int16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Q4_K and Q5_K: per row, sum over the sub-blocks of step * sum(q * a), a = 128 hi + lo multiplied as bytes
// (maddubs: the weights' small unsigned values times hi, and times lo), the steps applied by madd (hi's
// times 128 step): at most 31 * 127 * 2 * 128 * 63 * 2 * 8 in a lane, exact in int32; less dmin * each
// sub-block's minimum * its inputs' sum.  Bytes, not int16: no widening shuffles, which two threads on
// one core's siblings contend for (measured: 1.08x with two threads, 1.8x this way)
template <int R>
void rows_q45k(const uint8_t* w, const Rows& rows, int64_t n, float* out, bool five) {
  const int bytes = five ? 176 : 144;
  __m256 acc[R];
  float minimums[R] = {};
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 256; ++i, w += bytes) {
    uint8_t step[8], minimum[8];
    steps_and_minimums(w + 4, step, minimum);
    const float d = h16(w), dmin = h16(w + 2);
    const uint8_t* q = five ? w + 48 : w + 16;
    const __m256i high = five ? load(w + 16) : _mm256_setzero_si256();
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      __m256i first, second;
      q45k_values(q, high, p, five, first, second);
      const __m256i s0 = _mm256_set1_epi16(step[2 * p]), s1 = _mm256_set1_epi16(step[2 * p + 1]);
      const __m256i t0 = _mm256_set1_epi16(static_cast<int16_t>(128 * step[2 * p]));
      const __m256i t1 = _mm256_set1_epi16(static_cast<int16_t>(128 * step[2 * p + 1]));
      for (int r = 0; r < R; ++r) {
        const Act256& a = rows.a256[r][i];
        const int at = 64 * p;
        const __m256i h0 = _mm256_madd_epi16(_mm256_maddubs_epi16(first, load(a.hi + at)), t0);
        const __m256i l0 = _mm256_madd_epi16(_mm256_maddubs_epi16(first, load(a.lo + at)), s0);
        const __m256i h1 = _mm256_madd_epi16(_mm256_maddubs_epi16(second, load(a.hi + at + 32)), t1);
        const __m256i l1 = _mm256_madd_epi16(_mm256_maddubs_epi16(second, load(a.lo + at + 32)), s1);
        sum[r] = _mm256_add_epi32(sum[r], _mm256_add_epi32(_mm256_add_epi32(h0, l0), _mm256_add_epi32(h1, l1)));
      }
    }
    for (int r = 0; r < R; ++r) {
      const Act256& a = rows.a256[r][i];
      int64_t msum = 0;
      for (int j = 0; j < 8; ++j) msum += static_cast<int64_t>(minimum[j]) * (a.sums[2 * j] + a.sums[2 * j + 1]);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(a.d * d), _mm256_cvtepi32_ps(sum[r]), acc[r]);
      minimums[r] += a.d * dmin * static_cast<float>(msum);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(acc[r]) - minimums[r];
}

// Q6_K: per row, sum of (scale * (q - 32)) * a over 16-weight runs (widened to int16 once for every row,
// madd), each half of the super-block exact in int32 (at most 32 * 128 * 16256 * 16 in a lane)
template <int R>
void rows_q6k(const uint8_t* w, const Rows& rows, int64_t n, float* out) {
  const __m256i m32 = _mm256_set1_epi8(32);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 256; ++i, w += 210) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    const float d = h16(w + 208);
    for (int half = 0; half < 2; ++half) {
      __m256i q[4];
      q6k_values(w, half, q);
      __m256i f[8];
      for (int k = 0; k < 4; ++k) {
        const __m256i centred = _mm256_sub_epi8(q[k], m32);
        const int s = 8 * half + 2 * k;
        f[2 * k] = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(centred)), _mm256_set1_epi16(sc[s]));
        f[2 * k + 1] =
            _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(centred, 1)), _mm256_set1_epi16(sc[s + 1]));
      }
      for (int r = 0; r < R; ++r) {
        const int16_t* a = rows.a256[r][i].q + 128 * half;
        __m256i sum = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) sum = _mm256_add_epi32(sum, _mm256_madd_epi16(f[k], load16(a + 16 * k)));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(rows.a256[r][i].d * d), _mm256_cvtepi32_ps(sum), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(acc[r]);
}

template <int R>
bool integer_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out) {
  if (type == Q4_K || type == Q5_K) {
    rows_q45k<R>(w, rows, n, out, type == Q5_K);
    return true;
  }
  if (type == Q6_K) {
    rows_q6k<R>(w, rows, n, out);
    return true;
  }
  return false;
}
#endif

}  // namespace

namespace kquants {

void dequantize(int type, const uint8_t* w, float* y, int64_t n) {
  const int bytes = block_bytes(type);
  for (int64_t i = 0; i < n / 256; ++i) dequantize_block(type, w + i * bytes, y + 256 * i);
}

void dot_rows(int type, const uint8_t* w, const Rows& rows, int64_t n, float* out) {
#ifdef GGUF_AVX2
  if (rows.a256[0] != nullptr) {
    bool done = false;
    switch (rows.n) {
      case 1: done = integer_rows<1>(type, w, rows, n, out); break;
      case 2: done = integer_rows<2>(type, w, rows, n, out); break;
      case 3: done = integer_rows<3>(type, w, rows, n, out); break;
      default: done = integer_rows<4>(type, w, rows, n, out); break;
    }
    if (done) return;
  }
#endif
  float_rows(w, 256, block_bytes(type), rows, n, out, [type](const uint8_t* b, float* y) { dequantize_block(type, b, y); });
}

}  // namespace kquants
}  // namespace gguf
