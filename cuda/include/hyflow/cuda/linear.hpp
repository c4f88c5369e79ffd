#pragma once
// Linear layers on oneDNN's inner product: y = x W^T + b. Debian's LibTorch 1.13 runs float32
// GEMM on the reference BLAS; oneDNN, bundled in the same library, is 4-20x faster at the
// shapes of our models. LibTorch 1.13 has no autograd through oneDNN tensors, so training goes
// through a custom autograd function; inference can reuse a weight packed once.

#include <ATen/core/Tensor.h>

namespace hyflow::cuda {

/// True when the oneDNN path can run on `x`: LibTorch was built with oneDNN (MKLDNN), and x is
/// a float32 CPU tensor. Callers fall back to at::linear otherwise.
bool onednn_linear_supported(const at::Tensor& x);

/// y = x W^T + b for x (..., in), weight (out, in), bias (out,) or undefined -> (..., out),
/// differentiable in x, weight and bias. Forward is one oneDNN inner product; backward computes
/// dx = dy W and dW = dy^T x on oneDNN and db = sum dy. Weights are packed into oneDNN's
/// layout on every call, which is what training needs (they change after each step).
/// Throws hyflow::ValueError when !onednn_linear_supported(x) or weight/bias are not float32
/// CPU tensors, hyflow::ShapeError when the shapes do not fit.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

/// `weight` (out, in) in oneDNN's layout, for onednn_linear_packed. Pack once and reuse for as
/// long as the weight does not change (one generate call: see models::InferenceContext).
at::Tensor pack_onednn_weight(const at::Tensor& weight);

/// Inference-only y = x W^T + b with a weight from pack_onednn_weight: no packing per call and
/// no autograd graph (the result does not require grad). Same errors as onednn_linear.
at::Tensor onednn_linear_packed(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& bias = {});

}  // namespace hyflow::cuda
