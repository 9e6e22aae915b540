// Projections over a GGUF file's blocks (gguf_product.h): the step's and the eager path's product.
//
// A decode step's few rows: each input row quantized once a projection (gguf_blocks.h), then
// one parallel region over the output rows of all the parts, each weight row read once from memory
// and multiplied with every input row while it is in the cache.  A prompt's many rows: the weights
// de-quantized in tiles of output rows that stay in the cache, multiplied by torch's GEMM; the
// file's blocks are never copied whole into float32.
#include "gguf_product.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "gguf_blocks.h"

namespace gguf {
namespace {

constexpr int64_t TILE_BYTES = 4 << 20;  // float32 weights de-quantized at a time for a prompt's GEMM

int64_t in_of(int64_t type, int64_t row_bytes) {
  const TypeInfo info = type_info(static_cast<int>(type));
  TORCH_CHECK(info.block > 0, "GGUF tensor type ", type, " is not one Brisk reads");
  TORCH_CHECK(row_bytes % info.bytes == 0, "GGUF rows of ", row_bytes, " bytes are not whole blocks of type ", type);
  return row_bytes / info.bytes * info.block;
}

void check_rows(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == at::kByte && w.device().is_cpu() &&
                  w.size(0) > 0,
              "GGUF weights: contiguous uint8 [out, bytes a row] on the CPU");
}

}  // namespace

std::vector<Part> parts(const std::vector<at::Tensor>& flat, const std::vector<int64_t>& types) {
  TORCH_CHECK(!flat.empty() && flat.size() == 2 * types.size(), "GGUF parts: (weights, bias) and a type each");
  std::vector<Part> out;
  for (size_t i = 0; i < types.size(); ++i) {
    const at::Tensor &w = flat[2 * i], &b = flat[2 * i + 1];
    check_rows(w);
    const int64_t in = in_of(types[i], w.size(1));
    TORCH_CHECK(out.empty() || out[0].in == in, "GGUF parts of one projection take the same inputs");
    TORCH_CHECK(b.numel() == 0 || (b.dim() == 1 && b.is_contiguous() && b.scalar_type() == at::kFloat &&
                                   b.device().is_cpu() && b.size(0) == w.size(0)),
                "GGUF bias: empty, or contiguous float32 [out] on the CPU");
    out.push_back({w, b, static_cast<int>(types[i]), w.size(0), in});
  }
  return out;
}

at::Tensor product(const at::Tensor& x_in, const std::vector<Part>& parts, bool gemm) {
  const int64_t width = parts[0].in;
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && x_in.device().is_cpu() && x_in.dim() == 2 && x_in.size(1) == width,
              "GGUF product: float32 [rows, ", width, "] on the CPU");
  const at::Tensor x = x_in.contiguous();
  const int64_t n = x.size(0);
  std::vector<int64_t> starts(parts.size() + 1, 0);
  for (size_t i = 0; i < parts.size(); ++i) starts[i + 1] = starts[i] + parts[i].out;
  const int64_t total = starts.back();
  if (gemm && n >= PROMPT_ROWS) {  // a prompt: tiles of float32 weights, torch's GEMM
    const int64_t tile = std::max<int64_t>(16, TILE_BYTES / (4 * width));
    at::Tensor buffer = at::empty({tile, width}, x.options());  // one tile's weights, reused: no new pages a tile
    at::Tensor y = at::empty({n, total}, x.options());
    for (size_t i = 0; i < parts.size(); ++i) {
      const Part& p = parts[i];
      const int64_t row_bytes = p.w.size(1);
      for (int64_t o = 0; o < p.out; o += tile) {
        const int64_t rows = std::min(tile, p.out - o);
        const uint8_t* src = p.w.data_ptr<uint8_t>() + o * row_bytes;
        float* dst = buffer.data_ptr<float>();
        at::parallel_for(0, rows, 8, [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) dequantize_row(p.type, src + r * row_bytes, dst + r * width, width);
        });
        at::Tensor out = y.narrow(1, starts[i] + o, rows);
        if (p.b.numel())
          out.copy_(at::addmm(p.b.narrow(0, o, rows), x, buffer.narrow(0, 0, rows).t()));
        else
          out.copy_(at::mm(x, buffer.narrow(0, 0, rows).t()));
      }
    }
    return y;
  }
  bool need32 = false, need256 = false;
  for (const Part& p : parts) {
    const Act act = type_info(p.type).act;
    need32 |= act == Act::Q32;
    need256 |= act == Act::Q256;
  }
  const float* xp = x.data_ptr<float>();
  std::vector<Act32> a32(need32 ? n * (width / 32) : 0);
  std::vector<Act256> a256(need256 ? n * (width / 256) : 0);
  for (int64_t r = 0; r < n; ++r) {
    if (need32) quantize_act32(xp + r * width, a32.data() + r * (width / 32), width);
    if (need256) quantize_act256(xp + r * width, a256.data() + r * (width / 256), width);
  }
  at::Tensor y = at::empty({n, total}, x.options());
  float* yp = y.data_ptr<float>();
  const int64_t row_bytes = parts[0].w.size(1);
  const int64_t grain = std::max<int64_t>(8, 32768 / std::max<int64_t>(1, row_bytes * std::min<int64_t>(n, 4)));
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    float got[MAX_ROWS];
    for (size_t i = 0; i < parts.size(); ++i) {
      const int64_t lo = std::max(begin, starts[i]), hi = std::min(end, starts[i + 1]);
      if (lo >= hi) continue;
      const Part& p = parts[i];
      const int64_t bytes = p.w.size(1);
      const uint8_t* w = p.w.data_ptr<uint8_t>();
      const float* bias = p.b.numel() ? p.b.data_ptr<float>() : nullptr;
      for (int64_t o = lo - starts[i]; o < hi - starts[i]; ++o) {
        const uint8_t* wrow = w + o * bytes;
        for (int64_t r0 = 0; r0 < n; r0 += MAX_ROWS) {  // each weight block decoded once for up to 4 rows
          Rows rows{static_cast<int>(std::min<int64_t>(MAX_ROWS, n - r0)), {}, {}, {}};
          for (int k = 0; k < rows.n; ++k) {
            const int64_t r = r0 + k;
            rows.x[k] = xp + r * width;
            rows.a32[k] = need32 ? a32.data() + r * (width / 32) : nullptr;
            rows.a256[k] = need256 ? a256.data() + r * (width / 256) : nullptr;
          }
          dot_rows(p.type, wrow, rows, width, got);
          for (int k = 0; k < rows.n; ++k) yp[(r0 + k) * total + starts[i] + o] = bias ? got[k] + bias[o] : got[k];
        }
      }
    }
  });
  return y;
}

at::Tensor rows(const at::Tensor& w, int64_t type, const at::Tensor& ids_in) {
  check_rows(w);
  const int64_t in = in_of(type, w.size(1));
  const at::Tensor ids = ids_in.to(at::kLong).contiguous().view(-1);
  const int64_t n = ids.size(0);
  at::Tensor out = at::empty({n, in}, at::TensorOptions().dtype(at::kFloat));
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k)
    TORCH_CHECK(ip[k] >= 0 && ip[k] < w.size(0), "token id ", ip[k], " is outside the embedding's ", w.size(0), " rows");
  at::parallel_for(0, n, 16, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k)
      dequantize_row(static_cast<int>(type), w.data_ptr<uint8_t>() + ip[k] * w.size(1), out.data_ptr<float>() + k * in,
                     in);
  });
  return out;
}

at::Tensor dequantize(const at::Tensor& w, int64_t type) {
  return rows(w, type, at::arange(w.size(0), at::TensorOptions().dtype(at::kLong)));
}

}  // namespace gguf
