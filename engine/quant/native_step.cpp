// Brisk's native decode step for fp16-cpu and q8-cpu models (built and loaded by engine/quant/native.py).
//
// One call runs a few decode tokens (a plain step, or a speculative step's token and drafts)
// through every layer, the final norm and the head.  The projections are either the app's own
// fbgemm fp16 layers (quantized::linear_dynamic_fp16, q/k/v and gate/up fused) or q8 layers:
// 8-bit weights with a float32 step and minimum per group of 32 inputs, times activations quantized
// at run time to 15-bit integers per group, summed exactly in int32 per group by the CPU's integer
// dot product (AVX-512 VNNI, else AVX2's madd) and in float32 across groups.
// Everything between the projections (RMS norms, rotary embedding, writing keys and values into
// the KV cache, attention, SiLU or GELU, residual adds) is plain C++ here instead of some 45 small
// torch ops a layer.  ``q8_linear`` exposes the same q8 product to the eager path (a few rows at a
// time multiply as a decode step does); ``q8_dequantize`` gives a prompt's many rows the weights in
// float32 for torch's GEMM.
//
// Layouts: Llama's (llama, mistral, qwen2: q/k/v biases live in the projections), Qwen3's (an RMS
// norm on each query and key head before the rotary embedding: ``set_head_norms``) and Phi-3's
// (its fused q/k/v and gate/up projections are this step's layout already), and Gemma 2's and
// Gemma 3's (``set_gemma``): an embedding scaled by sqrt(hidden), (1 + w) norms, a norm on the
// attention's and on the MLP's output before each residual add, GELU (tanh) in the MLP;
// ``set_soft_caps`` for Gemma 2's soft-capped attention scores and logits; Gemma 3's q/k head
// norms (``set_head_norms``) and its sliding layers' own rotary base (``set_rotary_tables``).
// Any layer may attend through a sliding window (``set_windows``: the last ``window`` positions only).
//
// Every token (row) is computed by the same code whatever the number of rows, each attending
// to exactly the positions before it (within its layer's window), so verifying k drafts in one
// call gives bit for bit the logits that k one-token calls would: speculative decoding cannot
// change a greedy reply.
// The loops are written so that the compiler vectorizes them (built with -O3 -march=native),
// and sums use fixed lanes, so results do not depend on the number of threads.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/api/object.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "gguf_blocks.h"
#include "gguf_product.h"

namespace {

constexpr int LANES = 16;

template <typename A>
inline float dot(const A* a, const float* b, int64_t n) {  // A: float, or at::Half (read as float32)
  float acc[LANES] = {0};
  int64_t d = 0;
  for (; d + LANES <= n; d += LANES)
    for (int k = 0; k < LANES; ++k) acc[k] += static_cast<float>(a[d + k]) * b[d + k];
  float s = 0.f;
  for (int k = 0; k < LANES; ++k) s += acc[k];
  for (; d < n; ++d) s += static_cast<float>(a[d]) * b[d];
  return s;
}

// The attention scores' dot products: with the CPU's widest FMA where the build has it
// (measured on one AVX-512 core: 1.7 ns a 64-wide key against 4 ns for dot() above).
inline float key_dot(const float* q, const float* k, int64_t n) {
#if defined(__AVX512F__) && (defined(__x86_64__) || defined(__i386__))
  __m512 acc = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), acc);
  float s = _mm512_reduce_add_ps(acc);
  for (; d < n; ++d) s += q[d] * k[d];
  return s;
#elif defined(__AVX2__) && defined(__FMA__) && (defined(__x86_64__) || defined(__i386__))
  __m256 acc = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
  float s = _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
  for (; d < n; ++d) s += q[d] * k[d];
  return s;
#else
  return dot(q, k, n);
#endif
}

inline float sum(const float* a, int64_t n) {
  float acc[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int k = 0; k < LANES; ++k) acc[k] += a[j + k];
  float s = 0.f;
  for (int k = 0; k < LANES; ++k) s += acc[k];
  for (; j < n; ++j) s += a[j];
  return s;
}

// exp(x) for x <= 0 (Cephes' expf polynomial), inlined into loops that the compiler vectorizes.
inline float exp_le0(float v) {
  const float x = std::max(v, -87.0f);
  const float k = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(k) + 127) << 23;
  return p * __builtin_bit_cast(float, e);
}

// exp(x) for x <= 0 in place.  GCC does not vectorize exp_le0's loop (the float-to-int conversion), so
// with AVX-512 sixteen lanes at a time run the same polynomial, the last few through a mask, so that every
// element meets the same code wherever it lies (attention scores and SiLU's inputs; on the Xeon SiLU's
// share of a step went from 0.23 to 0.05 ms, bench/step_phases.py).
inline void exp_nonpositive(float* s, int64_t n) {
#if defined(__AVX512F__) && (defined(__x86_64__) || defined(__i386__))
  const auto c = [](float v) { return _mm512_set1_ps(v); };
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 some = n - j >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1u);
    const __m512 x = _mm512_max_ps(_mm512_maskz_loadu_ps(some, s + j), c(-87.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_fmadd_ps(x, c(1.44269504088896341f), c(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fmadd_ps(k, c(2.12194440e-4f), _mm512_fnmadd_ps(k, c(0.693359375f), x));
    __m512 p = c(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, c(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, c(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, c(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, c(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, c(5.0000001201E-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), c(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23);
    _mm512_mask_storeu_ps(s + j, some, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
  }
#else
  for (int64_t j = 0; j < n; ++j) s[j] = exp_le0(s[j]);
#endif
}

// tanh(x) as Cephes' tanhf (an odd polynomial below 0.625, else 1 - 2 / (exp(2|x|) + 1)), branch-free
// so that loops over it vectorize: std::tanh would be a library call per element, and Gemma takes one
// for every MLP input and, soft-capped, every attention score and logit.
inline float tanh_of(float x) {
  const float a = std::fabs(x);
  const float e = exp_le0(-2.0f * a);
  const float far = (1.0f - e) / (1.0f + e);
  const float s = a * a;
  const float near =
      ((((-5.70498872745E-3f * s + 2.06390887954E-2f) * s - 5.37397155531E-2f) * s + 1.33314422036E-1f) * s -
       3.33332819422E-1f) * s * a + a;
  return std::copysign(a < 0.625f ? near : far, x);
}

// x = tanh(x / cap) * cap in place: Gemma 2's soft-capping of attention scores and of the logits.
inline void soft_cap(float* x, int64_t n, float cap) {
  for (int64_t j = 0; j < n; ++j) x[j] = tanh_of(x[j] / cap) * cap;
}

// RMS norm of each row times its weight w, or times (1 + w) with ``offset`` (Gemma's norms keep
// their weights as offsets from 1; 1 + w is added here, in float32 as transformers adds it, so the
// weights stay the model's own tensors and a change to them is seen at the next call).
void rms_rows(const float* h, const float* w, float* out, int64_t rows, int64_t width, float eps,
              bool offset = false) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = h + r * width;
    float* y = out + r * width;
    const float inv = 1.0f / std::sqrt(dot(x, x, width) / static_cast<float>(width) + eps);
    if (offset)
      for (int64_t j = 0; j < width; ++j) y[j] = (1.0f + w[j]) * (x[j] * inv);
    else
      for (int64_t j = 0; j < width; ++j) y[j] = w[j] * (x[j] * inv);
  }
}


// ---- q8: 8-bit weights with a step and a minimum per group of 32 inputs, 15-bit activations --------
//
// Weights: uint8 q [out, in] and, per group of Q8_GROUP inputs, a float32 step d and minimum m, so
// that w = d * q + m (weights that came from a 4-bit GGUF, Q4_0/Q4_1/Q4_K, lie on such a grid exactly).
// Activations: each row's group of 32 is quantized at run time to integers x16 in -16383..16383 with
// a step xs.  Then sum_j w_j x_j = d * xs * sum_j q_j x16_j + m * xs * sum_j x16_j, where the integer
// sums are exact: only the float32 steps round.
//
// A layer whose every group lies on 16 levels (weights from a 4-bit GGUF) keeps q in 4 bits (BITS = 4):
// two a byte, [out, in / 2], each 64 inputs as 32 bytes whose low nibbles are the first 32 inputs and
// whose high nibbles the next 32.  Unpacked, the same integer sums and the same float32 operations run
// in the same order, so a 4-bit layer gives the result its 8-bit copy (q, d, m) gives, bit for bit,
// from half the bytes.

constexpr int64_t Q8_GROUP = 32;

// A step reads each weight once, front to back; asking for the bytes 4 KB ahead keeps enough lines in
// flight that one core is not held to what the hardware prefetcher alone fetches.  Measured on an
// Intel Xeon (2 cores, AVX-512 VNNI), SmolLM2-135M q8-cpu, 10 replies of 96 tokens each way,
// interleaved: the native step 9.51 ms a token without, 7.43 with (1 KB, 2 KB and 8 KB ahead: slower
// than 4 KB or no faster).
constexpr int64_t PREFETCH_AHEAD = 4096;

// A layer's steps and minimums are float32, or float16 where every one of them is exact in 16 bits
// (weights from a GGUF, which stores them so): S is float or at::Half.  Read as float32 either way, so
// a layer gives the same result, bit for bit, from either; float16 reads 4 bytes a group instead of 8.
inline float scale_at(const float* p, int64_t i) { return p[i]; }
inline float scale_at(const at::Half* p, int64_t i) { return static_cast<float>(p[i]); }
constexpr float X_LEVELS = 16383.f;

struct Q8Rows {
  std::vector<int16_t> x16;   // [rows, width]
  std::vector<float> xs;      // [rows, groups]: the group's step
  std::vector<float> xsum;    // [rows, groups]: xs * the sum of the group's x16 (for the minimum's term)
  std::vector<int8_t> hi;     // AVX-512 VNNI: x16 = 128 * hi + lo, hi in -128..127,
  std::vector<int8_t> lo;     //   lo in 0..127, both signed bytes for the integer dot product
  std::vector<float> lanes;   // AVX-512 VNNI: per 64 inputs, 16 floats: the first group's xs x8, the next's x8
};

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && (defined(__x86_64__) || defined(__i386__))
#define BRISK_Q8_VNNI512 1
#endif

Q8Rows quantize_rows(const float* x, int64_t rows, int64_t width) {
  const int64_t groups = width / Q8_GROUP;
  Q8Rows out;
  out.x16.resize(rows * width);
  out.xs.resize(rows * groups);
  out.xsum.resize(rows * groups);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = x + r * width + g * Q8_GROUP;
      float top = 0.f;
      for (int64_t j = 0; j < Q8_GROUP; ++j) top = std::max(top, std::fabs(v[j]));
      const float step = top / X_LEVELS;
      const float inv = step > 0.f ? X_LEVELS / top : 0.f;
      int16_t* q = out.x16.data() + r * width + g * Q8_GROUP;
      int32_t total = 0;
      for (int64_t j = 0; j < Q8_GROUP; ++j) {
        const int32_t k = std::clamp(static_cast<int32_t>(std::nearbyint(v[j] * inv)), -16383, 16383);
        q[j] = static_cast<int16_t>(k);
        total += k;
      }
      out.xs[r * groups + g] = step;
      out.xsum[r * groups + g] = step * static_cast<float>(total);
    }
#ifdef BRISK_Q8_VNNI512
  const int64_t pairs = width / 64;
  out.hi.resize(rows * width);
  out.lo.resize(rows * width);
  for (int64_t j = 0; j < rows * width; ++j) {
    const int32_t k = out.x16[j];
    out.hi[j] = static_cast<int8_t>(k >> 7);  // arithmetic shift: the floor, so lo = k - 128 * hi is 0..127
    out.lo[j] = static_cast<int8_t>(k & 127);
  }
  out.lanes.resize(rows * pairs * 16);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g2 = 0; g2 < pairs; ++g2)
      for (int k = 0; k < 16; ++k) out.lanes[(r * pairs + g2) * 16 + k] = out.xs[r * groups + 2 * g2 + k / 8];
#endif
  return out;
}

#if defined(__AVX2__) && (defined(__x86_64__) || defined(__i386__))
using gguf::hsum8;

// Group g's 32 weights q (0..255, or 0..15 unpacked from 4 bits) of a weight row, as 32 bytes.
template <int BITS>
inline __m256i group_weights(const uint8_t* wrow, int64_t g) {
  if constexpr (BITS == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrow + g * Q8_GROUP));
  } else {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrow + (g / 2) * Q8_GROUP));
    return _mm256_and_si256((g & 1) ? _mm256_srli_epi16(packed, 4) : packed, _mm256_set1_epi8(0x0F));
  }
}

// One group's sum_j q_j x16_j as eight exact int32 partial sums.
inline __m256i group_dot16(__m256i w, const int16_t* x) {
  const __m256i w0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(w));
  const __m256i w1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(w, 1));
  const __m256i p0 = _mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  const __m256i p1 = _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16)));
  return _mm256_add_epi32(p0, p1);  // |each| <= 4 * 255 * 16383 < 2**24: exact in float32 too
}
#endif

// Weight j of group g of a weight row (the portable path).
template <int BITS>
inline int32_t weight_at(const uint8_t* wrow, int64_t g, int64_t j) {
  if constexpr (BITS == 8) return wrow[g * Q8_GROUP + j];
  return (wrow[(g / 2) * Q8_GROUP + j] >> (4 * (g & 1))) & 15;
}

#ifdef BRISK_Q8_VNNI512
// 64 weights (groups 2 * g2 and 2 * g2 + 1) of a weight row as 64 bytes.
template <int BITS>
inline __m512i pair_weights(const uint8_t* wrow, int64_t g2) {
  if constexpr (BITS == 8) {
    return _mm512_loadu_si512(wrow + g2 * 64);
  } else {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrow + g2 * 32));
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i low = _mm256_and_si256(packed, nibble);
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
}
#endif

// y[r * y_stride + o] = sum over groups of (d[o, g] * xs[r, g] * sum_j q[o, j] x16[r, j]) + m[o, g] * xsum[r, g]
// (+ bias[o]), for ROWS activation rows from r0 and outputs o in [begin, end).  Each (r, o) is computed
// by the same operations in the same order whatever the number of rows, the range or the thread, so a
// row's result never depends on its company.  ROWS is a compile-time count so the sums stay in registers.
#ifdef BRISK_Q8_VNNI512
// OUTS weight rows from o times ROWS activation rows from r0, each (o, r) in its own sum: independent
// chains of additions keep the CPU busy while one waits.  Per (o, r) the operations and their order
// are the same whatever OUTS and ROWS, so results never depend on them.
template <int BITS, int ROWS, int OUTS, bool STREAM, typename S>
inline void q8_vnni(const uint8_t* w, const S* wd, const S* wm, const float* bias, const Q8Rows& x, int64_t r0,
                    int64_t width, int64_t o, float* y, int64_t y_stride) {
  const int64_t groups = width / Q8_GROUP;
  const int64_t pairs = width / 64;
  const int64_t stride = width * BITS / 8;  // bytes a weight row
  // 64 inputs (two groups) an instruction: lanes 0-7 sum the first group, lanes 8-15 the second
  const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  __m512 acc[OUTS][ROWS];
  for (int k = 0; k < OUTS; ++k)
    for (int r = 0; r < ROWS; ++r) acc[k][r] = _mm512_setzero_ps();
  // sum_j q_j x16_j of a group pair, exact in int32: 128 * (q . hi) + (q . lo), the second product added
  // onto the first by the instruction itself
  const auto pair_dot = [](__m512i wv, const int8_t* hi, const int8_t* lo) {
    const __m512i high = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(hi));
    return _mm512_dpbusd_epi32(_mm512_slli_epi32(high, 7), wv, _mm512_loadu_si512(lo));
  };
  const auto pair_steps = [&pick](const S* drow, int64_t g2) {
    __m128 two;  // the pair's two steps in lanes 0 and 1
    if constexpr (std::is_same_v<S, float>) {
      two = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(drow + 2 * g2)));
    } else {
      int32_t bits;
      std::memcpy(&bits, drow + 2 * g2, sizeof(bits));
      two = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    }
    return _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(two));
  };
  // sixteen minimums (``some`` of them) as float32
  const auto mins16 = [](const S* m, __mmask16 some) {
    if constexpr (std::is_same_v<S, float>)
      return _mm512_maskz_loadu_ps(some, m);
    else
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(some, m));
  };
  if constexpr (STREAM) {  // a step's few rows: weights from memory, each row front to back
#pragma GCC unroll 4
    for (int k = 0; k < OUTS; ++k) {
      const uint8_t* wrow = w + (o + k) * stride;
      const S* drow = wd + (o + k) * groups;
      for (int64_t g2 = 0; g2 < pairs; ++g2) {
        _mm_prefetch(reinterpret_cast<const char*>(wrow + g2 * (BITS * 8) + PREFETCH_AHEAD), _MM_HINT_T0);
        const __m512i wv = pair_weights<BITS>(wrow, g2);
        const __m512 sw = pair_steps(drow, g2);
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; ++r) {
          const int64_t at = (r0 + r) * width + g2 * 64;
          const __m512i dot = pair_dot(wv, x.hi.data() + at, x.lo.data() + at);
          const __m512 scale = _mm512_mul_ps(sw, _mm512_loadu_ps(x.lanes.data() + ((r0 + r) * pairs + g2) * 16));
          acc[k][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[k][r]);
        }
      }
    }
  } else {  // a prompt's rows: weights from the L1 cache, so each pair's activations are read once for OUTS rows
    for (int64_t g2 = 0; g2 < pairs; ++g2) {
      __m512i wv[OUTS];
      __m512 sw[OUTS];
      for (int k = 0; k < OUTS; ++k) {
        wv[k] = pair_weights<BITS>(w + (o + k) * stride, g2);
        sw[k] = pair_steps(wd + (o + k) * groups, g2);
      }
#pragma GCC unroll 4
      for (int r = 0; r < ROWS; ++r) {
        const int64_t at = (r0 + r) * width + g2 * 64;
        const __m512 lanes = _mm512_loadu_ps(x.lanes.data() + ((r0 + r) * pairs + g2) * 16);
        for (int k = 0; k < OUTS; ++k) {
          const __m512i dot = pair_dot(wv[k], x.hi.data() + at, x.lo.data() + at);
          acc[k][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sw[k], lanes), acc[k][r]);
        }
      }
    }
  }
  for (int k = 0; k < OUTS; ++k) {
    const uint8_t* wrow = w + (o + k) * stride;
    const S* drow = wd + (o + k) * groups;
    const S* mrow = wm + (o + k) * groups;
    for (int r = 0; r < ROWS; ++r) {
      // the minimums' term, sum over groups of m * xsum, sixteen groups an instruction
      const float* xsum = x.xsum.data() + (r0 + r) * groups;
      __m512 sum = acc[k][r];
      int64_t g = 0;
      for (; g + 16 <= groups; g += 16) sum = _mm512_fmadd_ps(mins16(mrow + g, 0xFFFF), _mm512_loadu_ps(xsum + g), sum);
      if (g < groups) {
        const __mmask16 some = static_cast<__mmask16>((1u << (groups - g)) - 1u);
        sum = _mm512_fmadd_ps(mins16(mrow + g, some), _mm512_maskz_loadu_ps(some, xsum + g), sum);
      }
      float odd = 0.f;
      if (groups % 2) {  // an odd last group (8-bit only: 4-bit rows are whole pairs)
        const int64_t last = groups - 1;
        const __m256i dot = group_dot16(group_weights<8>(wrow, last), x.x16.data() + (r0 + r) * width + last * Q8_GROUP);
        odd = hsum8(_mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(scale_at(drow, last) * x.xs[(r0 + r) * groups + last])));
      }
      const float v = _mm512_reduce_add_ps(sum) + odd;
      y[(r0 + r) * y_stride + o + k] = bias != nullptr ? v + bias[o + k] : v;
    }
  }
}
#endif

template <int BITS, int ROWS, bool STREAM, typename S>
void q8_tile(const uint8_t* w, const S* wd, const S* wm, const float* bias, const Q8Rows& x, int64_t r0, int64_t width,
             int64_t begin, int64_t end, float* y, int64_t y_stride) {
#ifdef BRISK_Q8_VNNI512
  // a step's rows (STREAM): weight rows read once each, in order; a prompt's: two at a time from the cache
  constexpr int OUTS = ROWS == 1 ? 4 : (STREAM ? (ROWS == 2 ? 2 : 1) : 2);
  int64_t o = begin;
  for (; o + OUTS <= end; o += OUTS) q8_vnni<BITS, ROWS, OUTS, STREAM, S>(w, wd, wm, bias, x, r0, width, o, y, y_stride);
  for (; o < end; ++o) q8_vnni<BITS, ROWS, 1, STREAM, S>(w, wd, wm, bias, x, r0, width, o, y, y_stride);
#else
  const int64_t groups = width / Q8_GROUP;
  for (int64_t o = begin; o < end; ++o) {
    const uint8_t* wrow = w + o * (width * BITS / 8);
    const S* drow = wd + o * groups;
    const S* mrow = wm + o * groups;
    float result[ROWS];
#if defined(__AVX2__) && (defined(__x86_64__) || defined(__i386__))
    __m256 acc[ROWS];
    for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      if constexpr (STREAM)  // once a cache line: every 2 groups in 8 bits, every 4 in 4
        if (g % (64 / (BITS * 4)) == 0)
          _mm_prefetch(reinterpret_cast<const char*>(wrow + g * (BITS * 4) + PREFETCH_AHEAD), _MM_HINT_T0);
#pragma GCC unroll 4
      for (int r = 0; r < ROWS; ++r) {
        const __m256i dot = group_dot16(group_weights<BITS>(wrow, g), x.x16.data() + (r0 + r) * width + g * Q8_GROUP);
        const __m256 scale = _mm256_set1_ps(scale_at(drow, g) * x.xs[(r0 + r) * groups + g]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
      }
    }
    for (int r = 0; r < ROWS; ++r) result[r] = hsum8(acc[r]) + dot(mrow, x.xsum.data() + (r0 + r) * groups, groups);
#else
    for (int r = 0; r < ROWS; ++r) {
      float lanes[8] = {0};
      for (int64_t g = 0; g < groups; ++g) {
        const int16_t* xg = x.x16.data() + (r0 + r) * width + g * Q8_GROUP;
        const float scale = scale_at(drow, g) * x.xs[(r0 + r) * groups + g];
        for (int k = 0; k < 8; ++k) {
          int32_t part = 0;
          for (int j = 0; j < 4; ++j) part += weight_at<BITS>(wrow, g, 4 * k + j) * static_cast<int32_t>(xg[4 * k + j]);
          lanes[k] += static_cast<float>(part) * scale;
        }
      }
      result[r] = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7])) +
                  dot(mrow, x.xsum.data() + (r0 + r) * groups, groups);
    }
#endif
    for (int r = 0; r < ROWS; ++r) y[(r0 + r) * y_stride + o] = bias != nullptr ? result[r] + bias[o] : result[r];
  }
#endif
}

// All n rows, in tiles of up to 4 (a weight row is read once a tile; a tile's sums fit in registers),
// over blocks of 16 weight rows, so that a prompt's many tiles find a block's weights in the L1 cache.
template <int BITS, bool STREAM, typename S>
void q8_block(const uint8_t* w, const S* wd, const S* wm, const float* bias, const Q8Rows& x, int64_t n, int64_t width,
              int64_t begin, int64_t end, float* y, int64_t y_stride) {
  for (int64_t b0 = begin; b0 < end; b0 += 16) {
    const int64_t b1 = std::min(end, b0 + 16);
    int64_t r0 = 0;
    for (; r0 + 4 <= n; r0 += 4) q8_tile<BITS, 4, STREAM, S>(w, wd, wm, bias, x, r0, width, b0, b1, y, y_stride);
    switch (n - r0) {
      case 3: q8_tile<BITS, 3, STREAM, S>(w, wd, wm, bias, x, r0, width, b0, b1, y, y_stride); break;
      case 2: q8_tile<BITS, 2, STREAM, S>(w, wd, wm, bias, x, r0, width, b0, b1, y, y_stride); break;
      case 1: q8_tile<BITS, 1, STREAM, S>(w, wd, wm, bias, x, r0, width, b0, b1, y, y_stride); break;
      default: break;
    }
  }
}

// One q8 projection's parts (q/k/v, or gate/up, side by side; or one layer alone): uint8 weights
// [out, in] (or [out, in / 2]: 4 bits, in a multiple of 64), float32 steps and minimums [out, in / 32],
// float32 bias [out] or an empty tensor.
struct Q8Part {
  at::Tensor w, d, m, b;
  int64_t in;  // inputs (the steps' groups times 32)
  int bits;    // 8, or 4: two weights a byte
  bool half;   // steps and minimums in float16 (else float32)
};

constexpr size_t Q8_TENSORS = 4;

// Where each part's weight rows start among all the parts' (side by side), and their total at the end.
std::vector<int64_t> part_starts(const std::vector<Q8Part>& parts) {
  std::vector<int64_t> starts(parts.size() + 1, 0);
  for (size_t i = 0; i < parts.size(); ++i) starts[i + 1] = starts[i] + parts[i].w.size(0);
  return starts;
}

std::vector<Q8Part> q8_parts(const std::vector<at::Tensor>& flat) {
  TORCH_CHECK(!flat.empty() && flat.size() % Q8_TENSORS == 0,
              "q8 parts: (weights, steps, minimums, bias) for each part");
  std::vector<Q8Part> parts;
  int64_t width = -1;
  for (size_t i = 0; i < flat.size(); i += Q8_TENSORS) {
    const at::Tensor &w = flat[i], &d = flat[i + 1], &m = flat[i + 2], &b = flat[i + 3];
    TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.device().is_cpu(),
                "q8 weights: contiguous uint8 [out, in] or [out, in / 2] on the CPU");
    TORCH_CHECK(d.dim() == 2 && d.size(1) > 0, "q8 steps: [out, in / 32]");
    const int64_t in = d.size(1) * Q8_GROUP;
    const int bits = w.size(1) == in ? 8 : 4;
    TORCH_CHECK(w.size(0) > 0 && (bits == 8 || (2 * w.size(1) == in && in % 64 == 0)),
                "q8 weights: [out, in] in 8 bits, or [out, in / 2] in 4 bits with inputs a multiple of 64");
    TORCH_CHECK(width < 0 || in == width, "q8 parts of one projection take the same inputs");
    width = in;
    const bool half = d.scalar_type() == at::kHalf;
    for (const at::Tensor* t : {&d, &m})
      TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->scalar_type() == (half ? at::kHalf : at::kFloat) &&
                      t->device().is_cpu() && t->size(0) == w.size(0) && t->size(1) == in / Q8_GROUP,
                  "q8 steps and minimums: both contiguous float32, or both float16, [out, in / 32] on the CPU");
    TORCH_CHECK(b.numel() == 0 || (b.dim() == 1 && b.is_contiguous() && b.scalar_type() == at::kFloat &&
                                   b.device().is_cpu() && b.size(0) == w.size(0)),
                "q8 bias: empty, or contiguous float32 [out] on the CPU");
    parts.push_back({w, d, m, b, in, bits, half});
  }
  return parts;
}

// x [n, in] float32 -> [n, sum of the parts' outputs] float32, the parts' outputs side by side.
at::Tensor q8_product(const float* x, int64_t n, const std::vector<Q8Part>& parts, const at::TensorOptions& options) {
  const int64_t width = parts[0].in;
  const std::vector<int64_t> starts = part_starts(parts);
  const int64_t total = starts.back();
  const Q8Rows rows = quantize_rows(x, n, width);
  at::Tensor y = at::empty({n, total}, options);
  float* yp = y.data_ptr<float>();
  // One parallel region over all the parts' weight rows (q/k/v or gate/up side by side): one fork and
  // one join a projection.  Tasks of about 32 KB of weights a row of activations: worth a thread,
  // small enough to balance.
  const int64_t grain = std::max<int64_t>(16, 32768 / std::max<int64_t>(1, width * std::min<int64_t>(n, 4)));
  // up to 4 rows (a decode step, a verification): weights streamed from memory once; more (a prompt's
  // rows): blocks of weight rows stay in the cache while every tile of rows passes over them
  const bool stream = n <= 4;
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t lo = std::max(begin, starts[i]), hi = std::min(end, starts[i + 1]);
      if (lo >= hi) continue;
      const Q8Part& p = parts[i];
      const uint8_t* w = p.w.data_ptr<uint8_t>();
      const float* b = p.b.numel() ? p.b.data_ptr<float>() : nullptr;
      float* out = yp + starts[i];  // this part's outputs start at its column; rows are its own
      const int64_t from = lo - starts[i], to = hi - starts[i];
      const auto run = [&](const auto* d, const auto* m) {
        if (p.bits == 4)
          stream ? q8_block<4, true>(w, d, m, b, rows, n, width, from, to, out, total)
                 : q8_block<4, false>(w, d, m, b, rows, n, width, from, to, out, total);
        else
          stream ? q8_block<8, true>(w, d, m, b, rows, n, width, from, to, out, total)
                 : q8_block<8, false>(w, d, m, b, rows, n, width, from, to, out, total);
      };
      if (p.half)
        run(p.d.data_ptr<at::Half>(), p.m.data_ptr<at::Half>());
      else
        run(p.d.data_ptr<float>(), p.m.data_ptr<float>());
    }
  });
  return y;
}

// The parts' weights as float32 [sum of their outputs, in]: d * q + m per group, side by side, for a
// prompt's many rows, which torch's float32 GEMM multiplies faster than the integer kernel (whose
// per-group work is done again for every row).  Biases are not applied.
at::Tensor q8_dequantize(const std::vector<at::Tensor>& flat) {
  const std::vector<Q8Part> parts = q8_parts(flat);
  const int64_t width = parts[0].in, groups = width / Q8_GROUP;
  const std::vector<int64_t> starts = part_starts(parts);
  at::Tensor out = at::empty({starts.back(), width}, parts[0].w.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, starts.back(), 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      size_t i = 0;
      while (o >= starts[i + 1]) ++i;
      const Q8Part& p = parts[i];
      const int64_t row = o - starts[i];
      const uint8_t* wrow = p.w.data_ptr<uint8_t>() + row * (width * p.bits / 8);
      float* dst = op + o * width;
      const int64_t first = row * groups;  // the row's first step and minimum
      const float* d = p.half ? nullptr : p.d.data_ptr<float>() + first;
      const float* m = p.half ? nullptr : p.m.data_ptr<float>() + first;
      const at::Half* dh = p.half ? p.d.data_ptr<at::Half>() + first : nullptr;
      const at::Half* mh = p.half ? p.m.data_ptr<at::Half>() + first : nullptr;
      for (int64_t g = 0; g < groups; ++g) {
        const float step = p.half ? scale_at(dh, g) : d[g];
        const float low = p.half ? scale_at(mh, g) : m[g];
        float* v = dst + g * Q8_GROUP;
        if (p.bits == 4)
          for (int64_t j = 0; j < Q8_GROUP; ++j) v[j] = step * static_cast<float>(weight_at<4>(wrow, g, j)) + low;
        else
          for (int64_t j = 0; j < Q8_GROUP; ++j) v[j] = step * static_cast<float>(weight_at<8>(wrow, g, j)) + low;
      }
    }
  });
  return out;
}

// For the eager path: x [..., in] float32 -> [..., out], through the same product as the step.
at::Tensor q8_linear(const at::Tensor& x, const std::vector<at::Tensor>& flat) {
  const std::vector<Q8Part> parts = q8_parts(flat);
  const int64_t width = parts[0].in;
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() >= 1 && x.size(-1) == width,
              "q8_linear: float32 input on the CPU whose last dimension is the weights' inputs");
  const at::Tensor flat_x = x.reshape({-1, width}).contiguous();
  const int64_t n = flat_x.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  at::Tensor y;
  if (n == 0) {
    y = at::empty({0, part_starts(parts).back()}, x.options());
  } else {
    y = q8_product(flat_x.data_ptr<float>(), n, parts, x.options());
  }
  shape.back() = y.size(1);
  return y.view(shape);
}

class Stepper {
 public:
  // fp16-cpu: ``packed`` holds fbgemm's packed weights, four a layer (q/k/v, o, gate/up, down), then the head.
  Stepper(std::vector<at::Tensor> norms, const std::vector<py::object>& packed, int64_t head_dim, int64_t q_size,
          int64_t kv_size, int64_t intermediate, double eps, double scaling)
      : Stepper(std::move(norms), head_dim, q_size, kv_size, intermediate, eps, scaling) {
    TORCH_CHECK(packed.size() == 2 * (norms_.size() - 1) + 1,
                "two norms and four packed weights a layer, then the final norm and the head");
    linear_ = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic_fp16", "");
    for (const auto& p : packed) weights_.emplace_back(py::cast<torch::jit::Object>(p)._ivalue());
  }

  // q8-cpu: ``projections`` as above, each a list of (weights, scales, bias) parts (see q8_parts).
  static Stepper q8(std::vector<at::Tensor> norms, const std::vector<std::vector<at::Tensor>>& projections,
                    int64_t head_dim, int64_t q_size, int64_t kv_size, int64_t intermediate, double eps,
                    double scaling) {
    Stepper step(std::move(norms), head_dim, q_size, kv_size, intermediate, eps, scaling);
    TORCH_CHECK(projections.size() == 2 * (step.norms_.size() - 1) + 1,
                "two norms and four projections a layer, then the final norm and the head");
    for (const auto& flat : projections) step.q8_.push_back(q8_parts(flat));
    step.check_shapes("q8", q_size, kv_size, intermediate, [&](size_t i) {
      return std::make_pair(step.q8_[i][0].in, part_starts(step.q8_[i]).back());
    });
    return step;
  }

  // A GGUF file's blocks as they are: ``projections`` as above, each a flat list of (weights, bias)
  // parts with one ggml type a part in ``types`` (see gguf_product.h).
  static Stepper gguf(std::vector<at::Tensor> norms, const std::vector<std::vector<at::Tensor>>& projections,
                      const std::vector<std::vector<int64_t>>& types, int64_t head_dim, int64_t q_size,
                      int64_t kv_size, int64_t intermediate, double eps, double scaling) {
    Stepper step(std::move(norms), head_dim, q_size, kv_size, intermediate, eps, scaling);
    TORCH_CHECK(projections.size() == 2 * (step.norms_.size() - 1) + 1 && types.size() == projections.size(),
                "two norms and four projections a layer, then the final norm and the head");
    for (size_t i = 0; i < projections.size(); ++i) step.gguf_.push_back(gguf::parts(projections[i], types[i]));
    step.check_shapes("GGUF", q_size, kv_size, intermediate, [&](size_t i) {
      int64_t out = 0;
      for (const auto& p : step.gguf_[i]) out += p.out;
      return std::make_pair(step.gguf_[i][0].in, out);
    });
    return step;
  }

 private:
  // Every layer's four projections of the widths the heads and the MLP give ((inputs, outputs) of projection
  // i from ``shape``), and a head over the hidden width.
  template <typename Shape>
  void check_shapes(const char* kind, int64_t q_size, int64_t kv_size, int64_t intermediate, Shape shape) const {
    const int64_t layers = static_cast<int64_t>(norms_.size() / 2);
    const int64_t width = norms_[0].size(0);
    for (int64_t i = 0; i < layers; ++i) {
      const int64_t expect_in[4] = {width, q_size, width, intermediate};
      const int64_t expect_out[4] = {q_size + 2 * kv_size, width, 2 * intermediate, width};
      for (int k = 0; k < 4; ++k) {
        const auto [in, out] = shape(static_cast<size_t>(4 * i + k));
        TORCH_CHECK(in == expect_in[k] && out == expect_out[k], kind, " projection of layer ", i, ": [", out, ", ",
                    in, "], expected [", expect_out[k], ", ", expect_in[k], "]");
      }
    }
    TORCH_CHECK(shape(static_cast<size_t>(4 * layers)).first == width, kind,
                " head: its inputs must be the hidden width");
  }

 private:
  Stepper(std::vector<at::Tensor> norms, int64_t head_dim, int64_t q_size, int64_t kv_size, int64_t intermediate,
          double eps, double scaling)
      : norms_(std::move(norms)),
        head_dim_(head_dim),
        q_heads_(head_dim > 0 ? q_size / head_dim : 0),
        kv_heads_(head_dim > 0 ? kv_size / head_dim : 0),
        intermediate_(intermediate),
        eps_(static_cast<float>(eps)),
        scaling_(static_cast<float>(scaling)) {
    TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 1024, "head_dim must be even and at most 1024");
    TORCH_CHECK(q_size % head_dim == 0 && kv_size % head_dim == 0 && kv_heads_ > 0 && q_heads_ % kv_heads_ == 0,
                "query heads must be a multiple of key/value heads");
    TORCH_CHECK(intermediate > 0, "the MLP's width must be positive");
    TORCH_CHECK(norms_.size() % 2 == 1 && norms_.size() >= 3, "two norms a layer, then the final norm");
    for (const auto& t : norms_)
      TORCH_CHECK(t.dim() == 1 && t.is_contiguous() && t.scalar_type() == at::kFloat && t.device().is_cpu() &&
                      t.size(0) == norms_[0].size(0),
                  "norms: contiguous float32 on the CPU, all of the hidden width");
  }

 public:
  // Qwen3: an RMS norm over each query head and each key head (after the projection, before the
  // rotary embedding), two weights [head_dim] a layer (queries', keys'), with the step's epsilon.
  void set_head_norms(std::vector<at::Tensor> norms) {
    const int64_t layers = static_cast<int64_t>(norms_.size() / 2);
    TORCH_CHECK(norms.empty() || static_cast<int64_t>(norms.size()) == 2 * layers,
                "head norms: none, or two a layer (queries', keys')");
    for (const auto& t : norms)
      TORCH_CHECK(t.dim() == 1 && t.is_contiguous() && t.scalar_type() == at::kFloat && t.device().is_cpu() &&
                      t.size(0) == head_dim_,
                  "head norms: contiguous float32 [head_dim] on the CPU");
    head_norms_ = std::move(norms);
  }

  // Gemma 2 and 3: every norm (the constructor's, the head norms and these) multiplies by (1 + w), each
  // layer's attention output and MLP output are normed before their residual adds (``output_norms``: two
  // a layer, the attention's then the MLP's; the constructor's two a layer are then the input norm and
  // the pre-feedforward norm), and the MLP is gelu_tanh(gate) * up instead of silu(gate) * up.
  void set_gemma(std::vector<at::Tensor> output_norms) {
    TORCH_CHECK(output_norms.size() == norms_.size() - 1, "output norms: two a layer (attention's, the MLP's)");
    for (const auto& t : output_norms)
      TORCH_CHECK(t.dim() == 1 && t.is_contiguous() && t.scalar_type() == at::kFloat && t.device().is_cpu() &&
                      t.size(0) == norms_[0].size(0),
                  "output norms: contiguous float32 on the CPU, all of the hidden width");
    output_norms_ = std::move(output_norms);
    gemma_ = true;
  }

  // Soft-capping, x -> tanh(x / cap) * cap (0: none): of the attention scores before the softmax and of
  // the logits after the head (Gemma 2).
  void set_soft_caps(double attention, double logits) {
    TORCH_CHECK(attention >= 0 && logits >= 0, "soft caps: 0 (none) or positive");
    attention_cap_ = static_cast<float>(attention);
    logit_cap_ = static_cast<float>(logits);
  }

  // Rotary tables: layer i rotates its queries and keys by table ``tables[i]`` of forward's cos/sin
  // [tables, n, head_dim] (Gemma 3's sliding layers have a rotary base of their own); none: one table.
  void set_rotary_tables(std::vector<int64_t> tables) {
    TORCH_CHECK(tables.empty() || tables.size() == norms_.size() / 2, "rotary tables: none, or one a layer");
    for (const int64_t t : tables) TORCH_CHECK(t >= 0, "rotary tables: an index of 0 or more");
    tables_ = std::move(tables);
  }

  // Sliding windows: one a layer, the number of last positions a row attends to (0: all of them).
  void set_windows(std::vector<int64_t> windows) {
    TORCH_CHECK(windows.empty() || windows.size() == norms_.size() / 2, "windows: none, or one a layer");
    for (const int64_t w : windows) TORCH_CHECK(w >= 0, "windows: 0 (none) or a positive number of positions");
    windows_ = std::move(windows);
  }

  // Logits [rows, vocab] for tokens ``ids`` [n] (rows of ``embedding``, times ``embed_scale``: Gemma's
  // sqrt(hidden), else 1) at positions past..past+n-1; rows = n if all_rows else 1 (the last).  Writes
  // keys and values of those positions into ``keys``/``values`` (one [1, kv heads, capacity, head_dim]
  // float32 buffer per layer).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& embedding, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values, int64_t past,
                     bool all_rows, double embed_scale) const {
    return forward_batch(ids, embedding, cos, sin, {keys}, {values}, {past}, {ids.numel()}, {all_rows}, embed_scale,
                         {}, {}, {});
  }

  // Several sequences in one call (continuous batching): ``ids`` [n] are the rows of sequence 0, then of
  // sequence 1..., ``counts[s]`` of them for sequence s, at its positions pasts[s]..pasts[s]+counts[s]-1,
  // its keys and values in ``keys[s]``/``values[s]`` (one buffer per layer, as above); ``cos``/``sin``
  // [n, head_dim] are each row's own ([tables, n, head_dim] with ``set_rotary_tables``).  Returns the
  // logits of every row of a sequence with all_rows[s], else of its last row, in sequence order.  Each
  // row is computed by the same code as in a call of its own (each projection row by row alike, each
  // row attending to its own sequence only), so a sequence's logits do not depend on the others in the
  // batch.
  //
  // A shared prefix (a chat about a document reads the document's KV where it is, without copying it):
  // ``starts[s][i]`` > 0 says layer i of sequence s keeps positions 0..start-1 in ``base_keys[s][i]`` /
  // ``base_values[s][i]`` (views [1, kv heads, start, head_dim] of a larger buffer: rows contiguous, any head
  // stride) and position p >= start at index p - start of its own buffer.  Empty ``starts``: no sequence has
  // one.  Each row attends to the same positions in the same order either way, so the logits do not depend
  // on where the positions are kept.
  at::Tensor forward_batch(const at::Tensor& ids, const at::Tensor& embedding, const at::Tensor& cos,
                           const at::Tensor& sin, const std::vector<std::vector<at::Tensor>>& keys,
                           const std::vector<std::vector<at::Tensor>>& values, const std::vector<int64_t>& pasts,
                           const std::vector<int64_t>& counts, const std::vector<bool>& all_rows,
                           double embed_scale, const std::vector<std::vector<at::Tensor>>& base_keys,
                           const std::vector<std::vector<at::Tensor>>& base_values,
                           const std::vector<std::vector<int64_t>>& starts) const {
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && ids.numel() > 0, "ids: [n] int64");
    TORCH_CHECK(embedding.dim() == 2 && embedding.is_contiguous() && embedding.scalar_type() == at::kFloat,
                "embedding: contiguous float32 [vocab, hidden]");
    TORCH_CHECK(embedding.device().is_cpu() && embedding.size(1) == norms_[0].size(0),
                "embedding: on the CPU, as wide as the norms");
    const int64_t n = ids.numel(), width = embedding.size(1), vocab = embedding.size(0), hd = head_dim_, half = hd / 2;
    const int64_t q_size = q_heads_ * hd, kv_size = kv_heads_ * hd, groups = q_heads_ / kv_heads_;
    const int64_t layers = static_cast<int64_t>(norms_.size() / 2);
    const size_t seqs = counts.size();
    TORCH_CHECK(seqs > 0 && pasts.size() == seqs && keys.size() == seqs && values.size() == seqs &&
                    all_rows.size() == seqs,
                "one past, count, KV list and all_rows flag a sequence");
    const int64_t tables = cos.dim() == 3 ? cos.size(0) : 1;
    TORCH_CHECK(cos.sizes() == sin.sizes() && (cos.dim() == 2 || (cos.dim() == 3 && tables > 0)) &&
                    cos.size(-2) == n && cos.size(-1) == hd && cos.is_contiguous() && sin.is_contiguous() &&
                    cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.device().is_cpu() &&
                    sin.device().is_cpu(),
                "cos/sin: [n, head_dim] or [tables, n, head_dim] contiguous float32 on the CPU");
    for (const int64_t t : tables_) TORCH_CHECK(t < tables, "cos/sin: fewer tables than the layers use");
    TORCH_CHECK(ids.device().is_cpu(), "ids: on the CPU");
    std::vector<int64_t> seq_of(n), pos_of(n), kept;
    int64_t row = 0, longest = 0;
    const bool shared = !starts.empty();
    TORCH_CHECK(!shared || (starts.size() == seqs && base_keys.size() == seqs && base_values.size() == seqs),
                "shared prefixes: a list of starts and of base keys and values for each sequence, or none");
    for (size_t s = 0; s < seqs; ++s) {
      TORCH_CHECK(counts[s] > 0 && pasts[s] >= 0, "each sequence: at least one row, a past of 0 or more");
      TORCH_CHECK(static_cast<int64_t>(keys[s].size()) == layers && values[s].size() == keys[s].size(),
                  "one KV buffer a layer");
      TORCH_CHECK(!shared || (static_cast<int64_t>(starts[s].size()) == layers &&
                              static_cast<int64_t>(base_keys[s].size()) == layers &&
                              static_cast<int64_t>(base_values[s].size()) == layers),
                  "shared prefixes: one start and one base a layer");
      for (int64_t i = 0; i < layers; ++i) {
        const int64_t start = shared ? starts[s][i] : 0;
        TORCH_CHECK(start >= 0 && start <= pasts[s], "a shared prefix ends at or before the sequence's past");
        for (const at::Tensor* t : {&keys[s][i], &values[s][i]})
          TORCH_CHECK(t->dim() == 4 && t->is_contiguous() && t->scalar_type() == at::kFloat && t->device().is_cpu() &&
                          t->size(0) == 1 && t->size(1) == kv_heads_ && t->size(3) == hd &&
                          t->size(2) >= pasts[s] - start + counts[s],
                      "KV buffers: contiguous float32 [1, kv heads, capacity >= past - start + n, head_dim] on the "
                      "CPU");
        if (start > 0)
          for (const at::Tensor* t : {&base_keys[s][i], &base_values[s][i]})
            TORCH_CHECK(t->dim() == 4 && t->scalar_type() == at::kFloat && t->device().is_cpu() && t->size(0) == 1 &&
                            t->size(1) == kv_heads_ && t->size(2) == start && t->size(3) == hd && t->stride(3) == 1 &&
                            t->stride(2) == hd,
                        "shared prefixes: float32 [1, kv heads, start, head_dim] on the CPU, rows contiguous");
      }
      for (int64_t j = 0; j < counts[s]; ++j, ++row) {
        TORCH_CHECK(row < n, "the counts add up to more rows than ids");
        seq_of[row] = static_cast<int64_t>(s);
        pos_of[row] = pasts[s] + j;
        if (all_rows[s] || j == counts[s] - 1) kept.push_back(row);
      }
      longest = std::max(longest, pasts[s] + counts[s]);
    }
    TORCH_CHECK(row == n, "the counts must add up to the number of ids");

    at::Tensor h = at::empty({n, width}, embedding.options());
    float* hp = h.data_ptr<float>();
    const at::Tensor id = ids.contiguous();
    for (int64_t r = 0; r < n; ++r) {
      const int64_t token = id.data_ptr<int64_t>()[r];
      TORCH_CHECK(token >= 0 && token < vocab, "token id out of range");
      std::memcpy(hp + r * width, embedding.data_ptr<float>() + token * width, width * sizeof(float));
    }
    const float scale = static_cast<float>(embed_scale);  // float32 times float32, as Gemma's embedding module
    if (scale != 1.0f)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < width; ++j) hp[r * width + j] *= scale;
    at::Tensor x = at::empty({n, width}, h.options());
    at::Tensor attended = at::empty({n, q_size}, h.options());
    at::Tensor mid = at::empty({n, intermediate_}, h.options());
    float* xp = x.data_ptr<float>();
    float* ap = attended.data_ptr<float>();
    float* mp = mid.data_ptr<float>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    std::vector<float*> kbs(seqs), vbs(seqs);
    std::vector<const float*> bks(seqs), bvs(seqs);
    std::vector<int64_t> caps(seqs), bstrides(seqs), begins(seqs);

    for (int64_t i = 0; i < layers; ++i) {
      rms_rows(hp, norms_[2 * i].data_ptr<float>(), xp, n, width, eps_, gemma_);
      at::Tensor qkv = linear(x, 4 * i);
      TORCH_CHECK(qkv.is_contiguous() && qkv.size(1) == q_size + 2 * kv_size, "q/k/v: unexpected width");
      float* qp = qkv.data_ptr<float>();
      const int64_t stride = qkv.size(1);
      for (size_t s = 0; s < seqs; ++s) {
        kbs[s] = keys[s][i].data_ptr<float>();
        vbs[s] = values[s][i].data_ptr<float>();
        caps[s] = keys[s][i].size(2);
        begins[s] = shared ? starts[s][i] : 0;  // the position of index 0 of the sequence's own buffer
        bks[s] = begins[s] > 0 ? base_keys[s][i].data_ptr<float>() : nullptr;
        bvs[s] = begins[s] > 0 ? base_values[s][i].data_ptr<float>() : nullptr;
        bstrides[s] = begins[s] > 0 ? base_keys[s][i].stride(1) : 0;
        TORCH_CHECK(begins[s] == 0 || base_values[s][i].stride(1) == bstrides[s],
                    "shared prefixes: keys and values with one head stride");
      }
      for (int64_t r = 0; r < n; ++r) {
        float* row_q = qp + r * stride;
        const int64_t table = tables_.empty() ? 0 : tables_[i];
        const float* c = cp + (table * n + r) * hd;
        const float* s = sp + (table * n + r) * hd;
        if (!head_norms_.empty()) {  // Qwen3, Gemma 3: each query head, then each key head, normed in place
          const float* qn = head_norms_[2 * i].data_ptr<float>();
          const float* kn = head_norms_[2 * i + 1].data_ptr<float>();
          for (int64_t head = 0; head < q_heads_ + kv_heads_; ++head)
            rms_rows(row_q + head * hd, head < q_heads_ ? qn : kn, row_q + head * hd, 1, hd, eps_, gemma_);
        }
        for (int64_t head = 0; head < q_heads_ + kv_heads_; ++head) {  // rotate queries and keys
          float* v = row_q + head * hd;
          for (int64_t d = 0; d < half; ++d) {
            const float x1 = v[d], x2 = v[d + half];
            v[d] = x1 * c[d] - x2 * s[d];
            v[d + half] = x2 * c[d + half] + x1 * s[d + half];
          }
        }
        const int64_t q = seq_of[r], cap = caps[q], at = pos_of[r] - begins[q];
        for (int64_t g = 0; g < kv_heads_; ++g) {
          std::memcpy(kbs[q] + (g * cap + at) * hd, row_q + q_size + g * hd, hd * sizeof(float));
          std::memcpy(vbs[q] + (g * cap + at) * hd, row_q + q_size + kv_size + g * hd, hd * sizeof(float));
        }
      }
      // Tasks of at least some 1,000 positions' work: below that, waking the other threads costs more than
      // it saves.  (8,000 until the step's other waits were gone; bench/step_phases.py on the Xeon, a
      // reply of 96 tokens to a one-line prompt: attention 0.62 -> 0.48 ms a step with 1,000.)
      const int64_t grain = std::max<int64_t>(1, 1024 / longest);
      const int64_t window = windows_.empty() ? 0 : windows_[i];
      at::parallel_for(0, n * q_heads_, grain, [&](int64_t begin, int64_t end) {
        std::vector<float> scores(longest);
        float acc[1024];
        for (int64_t task = begin; task < end; ++task) {
          const int64_t r = task / q_heads_, head = task % q_heads_, g = head / groups;
          const int64_t q = seq_of[r], cap = caps[q], begin = begins[q];
          const float* query = qp + r * stride + head * hd;
          // this row sees its sequence's positions up to its own, the last ``window`` of them if windowed:
          // those before ``begin`` in the shared prefix, the rest in the sequence's own buffer
          const int64_t first = window > 0 ? std::max<int64_t>(0, pos_of[r] + 1 - window) : 0;
          const int64_t len = pos_of[r] + 1 - first;
          const int64_t in_base = std::max<int64_t>(0, std::min(begin, pos_of[r] + 1) - first);
          const float* BK = in_base > 0 ? bks[q] + g * bstrides[q] + first * hd : nullptr;
          const float* BV = in_base > 0 ? bvs[q] + g * bstrides[q] + first * hd : nullptr;
          const float* K = kbs[q] + g * cap * hd + (first + in_base - begin) * hd;
          const float* V = vbs[q] + g * cap * hd + (first + in_base - begin) * hd;
          for (int64_t j = 0; j < in_base; ++j) scores[j] = key_dot(query, BK + j * hd, hd) * scaling_;
          for (int64_t j = in_base; j < len; ++j) scores[j] = key_dot(query, K + (j - in_base) * hd, hd) * scaling_;
          if (attention_cap_ > 0.f) soft_cap(scores.data(), len, attention_cap_);
          float top = -INFINITY;
          for (int64_t j = 0; j < len; ++j) top = std::max(top, scores[j]);
          for (int64_t j = 0; j < len; ++j) scores[j] -= top;
          exp_nonpositive(scores.data(), len);
          const float inv = 1.0f / sum(scores.data(), len);
          std::fill(acc, acc + hd, 0.f);
          for (int64_t j = 0; j < in_base; ++j) {
            const float p = scores[j];
            const float* v = BV + j * hd;
            for (int64_t d = 0; d < hd; ++d) acc[d] += p * v[d];
          }
          for (int64_t j = in_base; j < len; ++j) {
            const float p = scores[j];
            const float* v = V + (j - in_base) * hd;
            for (int64_t d = 0; d < hd; ++d) acc[d] += p * v[d];
          }
          float* out = ap + r * q_size + head * hd;
          for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
        }
      });
      residual(hp, linear(attended, 4 * i + 1), n, width, gemma_ ? output_norms_[2 * i].data_ptr<float>() : nullptr);
      rms_rows(hp, norms_[2 * i + 1].data_ptr<float>(), xp, n, width, eps_, gemma_);
      at::Tensor gate_up = linear(x, 4 * i + 2);
      TORCH_CHECK(gate_up.is_contiguous() && gate_up.size(1) == 2 * intermediate_, "gate/up: unexpected width");
      const float* gp = gate_up.data_ptr<float>();
      for (int64_t r = 0; r < n; ++r) {
        const float* gate = gp + r * 2 * intermediate_;
        const float* up = gate + intermediate_;
        if (gemma_)
          gelu_tanh_times(mp + r * intermediate_, gate, up, intermediate_);
        else
          silu_times(mp + r * intermediate_, gate, up, intermediate_);
      }
      residual(hp, linear(mid, 4 * i + 3), n, width, gemma_ ? output_norms_[2 * i + 1].data_ptr<float>() : nullptr);
    }
    const int64_t rows = static_cast<int64_t>(kept.size());
    at::Tensor y = at::empty({rows, width}, h.options());
    for (int64_t k = 0; k < rows; ++k)
      rms_rows(hp + kept[k] * width, norms_.back().data_ptr<float>(), y.data_ptr<float>() + k * width, 1, width, eps_,
               gemma_);
    at::Tensor logits = linear(y, projections() - 1);
    if (logit_cap_ > 0.f) {  // row by row, so that a row's elements meet the same (vector or scalar) code
      TORCH_CHECK(logits.is_contiguous() && logits.dim() == 2 && logits.size(0) == rows, "head: unexpected shape");
      const int64_t vocab_out = logits.size(1);
      for (int64_t k = 0; k < rows; ++k) soft_cap(logits.data_ptr<float>() + k * vocab_out, vocab_out, logit_cap_);
    }
    return logits;
  }

 private:
  at::Tensor linear(const at::Tensor& x, size_t i) const {
    if (!q8_.empty()) return q8_product(x.data_ptr<float>(), x.size(0), q8_[i], x.options());
    if (!gguf_.empty()) return gguf::product(x, gguf_[i]);
    torch::jit::Stack stack{c10::IValue(x), weights_[i]};
    linear_->callBoxed(&stack);
    return stack[0].toTensor();
  }
  size_t projections() const { return !q8_.empty() ? q8_.size() : !gguf_.empty() ? gguf_.size() : weights_.size(); }

  // h += y [n, width], a projection's output; normed first (in place, a (1 + w) norm) where ``norm`` is given.
  void residual(float* h, const at::Tensor& y, int64_t n, int64_t width, const float* norm) const {
    TORCH_CHECK(y.is_contiguous() && y.numel() == n * width, "projection: unexpected shape");
    float* yp = y.data_ptr<float>();
    if (norm != nullptr) rms_rows(yp, norm, yp, n, width, eps_, true);
    for (int64_t j = 0; j < n * width; ++j) h[j] += yp[j];
  }

  // m = silu(gate) * up, silu(a) = a / (1 + exp(-a)); exp(-a) is exp(-|a|), inverted where a < 0.
  static void silu_times(float* m, const float* gate, const float* up, int64_t n) {
    for (int64_t j = 0; j < n; ++j) m[j] = -std::fabs(gate[j]);
    exp_nonpositive(m, n);
    for (int64_t j = 0; j < n; ++j) {
      const float e = gate[j] >= 0.f ? m[j] : 1.0f / m[j];  // exp(-gate)
      m[j] = gate[j] / (1.0f + e) * up[j];
    }
  }

  // m = gelu_tanh(gate) * up, with torch's formula: 0.5 a (1 + tanh(sqrt(2 / pi) (a + 0.044715 a^3))).
  static void gelu_tanh_times(float* m, const float* gate, const float* up, int64_t n) {
    constexpr float beta = 0.7978845608028654f, kappa = 0.044715f;
    for (int64_t j = 0; j < n; ++j) {
      const float a = gate[j];
      m[j] = 0.5f * a * (1.0f + tanh_of(beta * (a + kappa * (a * a * a)))) * up[j];
    }
  }

  std::vector<at::Tensor> norms_;
  std::vector<at::Tensor> head_norms_;            // Qwen3, Gemma 3: queries' and keys' head norms, two a layer; or none
  std::vector<at::Tensor> output_norms_;          // Gemma: attention's and the MLP's output norms, two a layer
  std::vector<int64_t> windows_;                  // sliding windows, one a layer (0: none); or none
  std::vector<int64_t> tables_;                   // each layer's rotary table (Gemma 3); or none: one table
  bool gemma_ = false;                            // (1 + w) norms, output norms, GELU (set_gemma)
  float attention_cap_ = 0.f, logit_cap_ = 0.f;   // soft caps (0: none)
  std::vector<c10::IValue> weights_;              // fp16-cpu: fbgemm's packed weights
  std::vector<std::vector<Q8Part>> q8_;          // q8-cpu: each projection's parts
  std::vector<std::vector<gguf::Part>> gguf_;    // a GGUF file's blocks: each projection's parts
  int64_t head_dim_, q_heads_, kv_heads_, intermediate_;
  float eps_, scaling_;
  std::optional<c10::OperatorHandle> linear_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Stepper>(m, "Stepper")
      .def(py::init<std::vector<at::Tensor>, const std::vector<py::object>&, int64_t, int64_t, int64_t, int64_t,
                    double, double>())
      .def("set_head_norms", &Stepper::set_head_norms)
      .def("set_windows", &Stepper::set_windows)
      .def("set_gemma", &Stepper::set_gemma)
      .def("set_soft_caps", &Stepper::set_soft_caps)
      .def("set_rotary_tables", &Stepper::set_rotary_tables)
      .def("forward", &Stepper::forward, py::arg("ids"), py::arg("embedding"), py::arg("cos"), py::arg("sin"),
           py::arg("keys"), py::arg("values"), py::arg("past"), py::arg("all_rows"), py::arg("embed_scale") = 1.0,
           py::call_guard<py::gil_scoped_release>())
      .def("forward_batch", &Stepper::forward_batch, py::arg("ids"), py::arg("embedding"), py::arg("cos"),
           py::arg("sin"), py::arg("keys"), py::arg("values"), py::arg("pasts"), py::arg("counts"),
           py::arg("all_rows"), py::arg("embed_scale") = 1.0,
           py::arg("base_keys") = std::vector<std::vector<at::Tensor>>{},
           py::arg("base_values") = std::vector<std::vector<at::Tensor>>{},
           py::arg("starts") = std::vector<std::vector<int64_t>>{}, py::call_guard<py::gil_scoped_release>());
  m.def("q8_stepper", &Stepper::q8, "A decode step over q8 projections (see Stepper::q8)");
  m.def("gguf_stepper", &Stepper::gguf, "A decode step over a GGUF file's blocks (see Stepper::gguf)");
  m.def(
      "gguf_linear",
      [](const at::Tensor& x, const std::vector<at::Tensor>& flat, const std::vector<int64_t>& types) {
        const std::vector<gguf::Part> parts = gguf::parts(flat, types);
        TORCH_CHECK(x.dim() >= 1 && x.size(-1) == parts[0].in, "gguf_linear: x's last dimension must be ",
                    parts[0].in);
        std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
        at::Tensor y = gguf::product(x.reshape({-1, parts[0].in}), parts, true);
        shape.back() = y.size(1);
        return y.view(shape);
      },
      py::call_guard<py::gil_scoped_release>(),
      "x [..., in] float32 times GGUF parts [(weights, bias), ...] of types [...] -> [..., sum of outputs]");
  m.def("gguf_rows", &gguf::rows, py::call_guard<py::gil_scoped_release>(),
        "(weights [rows, bytes], type, ids) -> those rows as float32 [len(ids), in]");
  m.def("gguf_dequantize", &gguf::dequantize, py::call_guard<py::gil_scoped_release>(),
        "(weights [rows, bytes], type) -> float32 [rows, in]");
  m.def(
      "gguf_type_info",
      [](int64_t type) {
        const gguf::TypeInfo info = gguf::type_info(static_cast<int>(type));
        return py::make_tuple(info.block, info.bytes, static_cast<int>(info.act));
      },
      "ggml type id -> (weights a block, bytes a block, activations: 0 float32, 1 per 32, 2 per 256); block 0: unknown");
  m.def("q8_dequantize", &q8_dequantize, py::call_guard<py::gil_scoped_release>(),
        "q8 parts [(weights, steps, minimums, bias), ...] -> their weights as float32 [sum of outputs, in]");
  m.def("q8_linear", &q8_linear, py::call_guard<py::gil_scoped_release>(),
        "x [..., in] float32 times q8 parts [(weights, scales, bias), ...] -> [..., sum of outputs]");
}
