// A GGUF tensor's rows in the step: projections whose weights stay in the file's blocks (gguf_product.cpp).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace gguf {

// One part of a projection (q/k/v or gate/up side by side, or one layer alone): a uint8 tensor
// [out, bytes a row] viewing the file's blocks (memory-mapped: nothing copied), its ggml type, a
// float32 bias [out] or an empty tensor.
struct Part {
  at::Tensor w, b;
  int type;
  int64_t out, in;
};

// The parts of one projection, checked: (weights, bias) tensors in ``flat``, a type each in ``types``.
std::vector<Part> parts(const std::vector<at::Tensor>& flat, const std::vector<int64_t>& types);

// x [n, in] float32 -> [n, sum of the parts' outputs], the parts' outputs side by side: each row's
// dot products on the blocks, so a row's result is the same whatever else is computed with it (the
// step's rows); with ``gemm`` and PROMPT_ROWS rows or more (a prompt's), the weights de-quantized a
// tile at a time and multiplied by torch's float32 GEMM instead.
at::Tensor product(const at::Tensor& x, const std::vector<Part>& parts, bool gemm = false);

// The rows ``ids`` of a [rows, bytes] tensor of ``type`` as float32 [len(ids), in] (an embedding).
at::Tensor rows(const at::Tensor& w, int64_t type, const at::Tensor& ids);

// The whole tensor as float32 [out, in] (tests and references).
at::Tensor dequantize(const at::Tensor& w, int64_t type);

constexpr int64_t PROMPT_ROWS = 32;

}  // namespace gguf
