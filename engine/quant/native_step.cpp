// Brisk's native decode step for fp16-cpu models (built and loaded by engine/quant/native.py).
//
// One call runs a few decode tokens (a plain step, or a speculative step's token and drafts)
// through every layer, the final norm and the head.  The projections are the app's own
// fbgemm fp16 layers (quantized::linear_dynamic_fp16, q/k/v and gate/up fused); everything
// between them (RMS norms, rotary embedding, writing keys and values into the KV cache,
// attention, SiLU, residual adds) is plain C++ here instead of some 45 small torch ops a layer.
//
// Every token (row) is computed by the same code whatever the number of rows, each attending
// to exactly the positions before it, so verifying k drafts in one call gives bit for bit the
// logits that k one-token calls would: speculative decoding cannot change a greedy reply.
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
#include <vector>

namespace {

constexpr int LANES = 16;

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[LANES] = {0};
  int64_t d = 0;
  for (; d + LANES <= n; d += LANES)
    for (int k = 0; k < LANES; ++k) acc[k] += a[d + k] * b[d + k];
  float s = 0.f;
  for (int k = 0; k < LANES; ++k) s += acc[k];
  for (; d < n; ++d) s += a[d] * b[d];
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

// exp(x) for x <= 0 in place (Cephes' expf polynomial), in a form the compiler vectorizes.
inline void exp_nonpositive(float* s, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = std::max(s[j], -87.0f);
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
    s[j] = p * __builtin_bit_cast(float, e);
  }
}

void rms_rows(const float* h, const float* w, float* out, int64_t rows, int64_t width, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = h + r * width;
    float* y = out + r * width;
    const float inv = 1.0f / std::sqrt(dot(x, x, width) / static_cast<float>(width) + eps);
    for (int64_t j = 0; j < width; ++j) y[j] = w[j] * (x[j] * inv);
  }
}

class Stepper {
 public:
  Stepper(std::vector<at::Tensor> norms, const std::vector<py::object>& packed, int64_t head_dim, int64_t q_size,
          int64_t kv_size, int64_t intermediate, double eps, double scaling)
      : norms_(std::move(norms)),
        head_dim_(head_dim),
        q_heads_(q_size / head_dim),
        kv_heads_(kv_size / head_dim),
        intermediate_(intermediate),
        eps_(static_cast<float>(eps)),
        scaling_(static_cast<float>(scaling)),
        linear_(c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic_fp16", "")) {
    TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 1024, "head_dim must be even and at most 1024");
    TORCH_CHECK(q_size % head_dim == 0 && kv_size % head_dim == 0 && kv_heads_ > 0 && q_heads_ % kv_heads_ == 0,
                "query heads must be a multiple of key/value heads");
    TORCH_CHECK(norms_.size() % 2 == 1 && packed.size() == 2 * (norms_.size() - 1) + 1,
                "two norms and four packed weights a layer, then the final norm and the head");
    for (const auto& t : norms_)
      TORCH_CHECK(t.dim() == 1 && t.is_contiguous() && t.scalar_type() == at::kFloat, "norms: contiguous float32");
    for (const auto& p : packed) weights_.emplace_back(py::cast<torch::jit::Object>(p)._ivalue());
  }

  // Logits [rows, vocab] for tokens ``ids`` [n] (rows of ``embedding``) at positions past..past+n-1;
  // rows = n if all_rows else 1 (the last).  Writes keys and values of those positions into
  // ``keys``/``values`` (one [1, kv heads, capacity, head_dim] float32 buffer per layer).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& embedding, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values, int64_t past,
                     bool all_rows) const {
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && ids.numel() > 0, "ids: [n] int64");
    TORCH_CHECK(embedding.dim() == 2 && embedding.is_contiguous() && embedding.scalar_type() == at::kFloat,
                "embedding: contiguous float32 [vocab, hidden]");
    const int64_t n = ids.numel(), width = embedding.size(1), vocab = embedding.size(0), hd = head_dim_, half = hd / 2;
    const int64_t q_size = q_heads_ * hd, kv_size = kv_heads_ * hd, groups = q_heads_ / kv_heads_;
    const int64_t layers = static_cast<int64_t>(norms_.size() / 2);
    TORCH_CHECK(cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == n && cos.size(1) == hd &&
                    cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
                    sin.scalar_type() == at::kFloat,
                "cos/sin: [n, head_dim] contiguous float32");
    TORCH_CHECK(static_cast<int64_t>(keys.size()) == layers && values.size() == keys.size(), "one KV buffer a layer");
    for (int64_t i = 0; i < layers; ++i)
      for (const at::Tensor* t : {&keys[i], &values[i]})
        TORCH_CHECK(t->dim() == 4 && t->is_contiguous() && t->scalar_type() == at::kFloat && t->size(0) == 1 &&
                        t->size(1) == kv_heads_ && t->size(3) == hd && t->size(2) >= past + n && past >= 0,
                    "KV buffers: contiguous float32 [1, kv heads, capacity >= past + n, head_dim]");

    at::Tensor h = at::empty({n, width}, embedding.options());
    float* hp = h.data_ptr<float>();
    const at::Tensor id = ids.contiguous();
    for (int64_t r = 0; r < n; ++r) {
      const int64_t token = id.data_ptr<int64_t>()[r];
      TORCH_CHECK(token >= 0 && token < vocab, "token id out of range");
      std::memcpy(hp + r * width, embedding.data_ptr<float>() + token * width, width * sizeof(float));
    }
    at::Tensor x = at::empty({n, width}, h.options());
    at::Tensor attended = at::empty({n, q_size}, h.options());
    at::Tensor mid = at::empty({n, intermediate_}, h.options());
    float* xp = x.data_ptr<float>();
    float* ap = attended.data_ptr<float>();
    float* mp = mid.data_ptr<float>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();

    for (int64_t i = 0; i < layers; ++i) {
      rms_rows(hp, norms_[2 * i].data_ptr<float>(), xp, n, width, eps_);
      at::Tensor qkv = linear(x, 4 * i);
      TORCH_CHECK(qkv.is_contiguous() && qkv.size(1) == q_size + 2 * kv_size, "q/k/v: unexpected width");
      float* qp = qkv.data_ptr<float>();
      const int64_t stride = qkv.size(1);
      float* kb = keys[i].data_ptr<float>();
      float* vb = values[i].data_ptr<float>();
      const int64_t cap = keys[i].size(2);
      for (int64_t r = 0; r < n; ++r) {
        float* row = qp + r * stride;
        const float* c = cp + r * hd;
        const float* s = sp + r * hd;
        for (int64_t head = 0; head < q_heads_ + kv_heads_; ++head) {  // rotate queries and keys
          float* v = row + head * hd;
          for (int64_t d = 0; d < half; ++d) {
            const float x1 = v[d], x2 = v[d + half];
            v[d] = x1 * c[d] - x2 * s[d];
            v[d + half] = x2 * c[d + half] + x1 * s[d + half];
          }
        }
        for (int64_t g = 0; g < kv_heads_; ++g) {
          std::memcpy(kb + (g * cap + past + r) * hd, row + q_size + g * hd, hd * sizeof(float));
          std::memcpy(vb + (g * cap + past + r) * hd, row + q_size + kv_size + g * hd, hd * sizeof(float));
        }
      }
      // One head's attention over L positions takes about 4 ns a position here; below some 8,000
      // positions' work in all, waking the other threads costs more than it saves.
      const int64_t grain = std::max<int64_t>(1, 8192 / (past + n));
      at::parallel_for(0, n * q_heads_, grain, [&](int64_t begin, int64_t end) {
        std::vector<float> scores(past + n);
        float acc[1024];
        for (int64_t task = begin; task < end; ++task) {
          const int64_t r = task / q_heads_, head = task % q_heads_, g = head / groups;
          const float* q = qp + r * stride + head * hd;
          const float* K = kb + g * cap * hd;
          const float* V = vb + g * cap * hd;
          const int64_t len = past + r + 1;  // this row sees the positions up to its own
          float top = -INFINITY;
          for (int64_t j = 0; j < len; ++j) {
            scores[j] = key_dot(q, K + j * hd, hd) * scaling_;
            top = std::max(top, scores[j]);
          }
          for (int64_t j = 0; j < len; ++j) scores[j] -= top;
          exp_nonpositive(scores.data(), len);
          const float inv = 1.0f / sum(scores.data(), len);
          std::fill(acc, acc + hd, 0.f);
          for (int64_t j = 0; j < len; ++j) {
            const float p = scores[j];
            const float* v = V + j * hd;
            for (int64_t d = 0; d < hd; ++d) acc[d] += p * v[d];
          }
          float* out = ap + r * q_size + head * hd;
          for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
        }
      });
      add(hp, linear(attended, 4 * i + 1), n * width);
      rms_rows(hp, norms_[2 * i + 1].data_ptr<float>(), xp, n, width, eps_);
      at::Tensor gate_up = linear(x, 4 * i + 2);
      TORCH_CHECK(gate_up.is_contiguous() && gate_up.size(1) == 2 * intermediate_, "gate/up: unexpected width");
      const float* gp = gate_up.data_ptr<float>();
      for (int64_t r = 0; r < n; ++r) {
        const float* gate = gp + r * 2 * intermediate_;
        const float* up = gate + intermediate_;
        silu_times(mp + r * intermediate_, gate, up, intermediate_);
      }
      add(hp, linear(mid, 4 * i + 3), n * width);
    }
    const int64_t rows = all_rows ? n : 1;
    at::Tensor y = at::empty({rows, width}, h.options());
    rms_rows(hp + (n - rows) * width, norms_.back().data_ptr<float>(), y.data_ptr<float>(), rows, width, eps_);
    return linear(y, weights_.size() - 1);
  }

 private:
  at::Tensor linear(const at::Tensor& x, size_t i) const {
    torch::jit::Stack stack{c10::IValue(x), weights_[i]};
    linear_.callBoxed(&stack);
    return stack[0].toTensor();
  }

  static void add(float* h, const at::Tensor& y, int64_t count) {
    TORCH_CHECK(y.is_contiguous() && y.numel() == count, "projection: unexpected shape");
    const float* yp = y.data_ptr<float>();
    for (int64_t j = 0; j < count; ++j) h[j] += yp[j];
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

  std::vector<at::Tensor> norms_;
  std::vector<c10::IValue> weights_;
  int64_t head_dim_, q_heads_, kv_heads_, intermediate_;
  float eps_, scaling_;
  c10::OperatorHandle linear_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Stepper>(m, "Stepper")
      .def(py::init<std::vector<at::Tensor>, const std::vector<py::object>&, int64_t, int64_t, int64_t, int64_t,
                    double, double>())
      .def("forward", &Stepper::forward, py::call_guard<py::gil_scoped_release>());
}
