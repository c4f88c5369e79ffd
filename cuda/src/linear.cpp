#include <hyflow/cuda/linear.hpp>

#include <hyflow/core/error.hpp>
#include <hyflow/core/shape.hpp>
#include <hyflow/core/torch_compat.hpp>

#include <ATen/Context.h>
#include <torch/torch.h>

#include <string>

namespace hyflow::cuda {
namespace {

// `t` (when defined) can enter oneDNN: float32 on the CPU; `what` names the caller.
void check_float_cpu(const char* what, const char* name, const at::Tensor& t) {
  if (!at::hasMKLDNN()) throw ValueError(std::string(what) + ": this LibTorch was built without oneDNN");
  if (t.defined() && (!t.device().is_cpu() || t.scalar_type() != at::kFloat)) {
    throw ValueError(std::string(what) + ": " + name + " must be a float32 CPU tensor, got " +
                     std::string(c10::toString(t.scalar_type())) + " on " + t.device().str());
  }
}

// x (..., in), weight (out, in) and bias (out,) or undefined fit together.
void check_shapes(const char* what, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (x.dim() < 1 || weight.dim() != 2 || x.size(-1) != weight.size(1)) {
    throw ShapeError(std::string(what) + ": x " + shape_of(x) + " and weight " + shape_of(weight) +
                     " do not fit: need x (..., in) and weight (out, in)");
  }
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))) {
    throw ShapeError(std::string(what) + ": bias " + shape_of(bias) + " must be (out,) = (" +
                     std::to_string(weight.size(0)) + ",)");
  }
}

void check_inputs(const char* what, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_float_cpu(what, "x", x);
  check_float_cpu(what, "weight", weight);
  check_float_cpu(what, "bias", bias);
  check_shapes(what, x, weight, bias);
}

// a (N, in) @ b (out, in)^T [+ bias] through oneDNN's inner product -> dense (N, out).
at::Tensor inner_product(const at::Tensor& a, const at::Tensor& b_packed, const at::Tensor& bias) {
  using OptionalTensor = torch_compat::Optional<at::Tensor>;
  const OptionalTensor b = bias.defined() ? OptionalTensor(bias) : OptionalTensor();
  return at::mkldnn_linear(a.contiguous().to_mkldnn(), b_packed, b).to_dense();
}

// The three products spelled out for autograd: y = x W^T + b, dx = dy W, dW = dy^T x, db = sum dy.
struct OneDnnLinear : torch::autograd::Function<OneDnnLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x, at::Tensor weight, at::Tensor bias) {
    // `bias` is an empty tensor for bias-free layers: autograd inputs must be defined.
    const bool has_bias = bias.numel() > 0;
    ctx->save_for_backward({x, weight});
    ctx->saved_data["has_bias"] = has_bias;
    return inner_product(x, weight.contiguous().to_mkldnn(), has_bias ? bias : at::Tensor());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    auto dy = grads[0].contiguous();  // (N, out)
    auto dx = inner_product(dy, weight.t().contiguous().to_mkldnn(), {});
    auto dw = inner_product(dy.t(), x.t().contiguous().to_mkldnn(), {});
    auto db = ctx->saved_data["has_bias"].toBool() ? dy.sum(0) : at::Tensor();
    return {dx, dw, db};
  }
};

// (N, out) -> (..., out) with the leading dims of x.
at::Tensor unflatten(const at::Tensor& y, const at::Tensor& x) {
  auto shape = x.sizes().vec();
  shape.back() = y.size(1);
  return y.view(shape);
}

}  // namespace

bool onednn_linear_supported(const at::Tensor& x) {
  return at::hasMKLDNN() && x.device().is_cpu() && x.scalar_type() == at::kFloat;
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_inputs("onednn_linear", x, weight, bias);
  auto flat = x.reshape({-1, x.size(-1)});  // (N, in)
  auto y = OneDnnLinear::apply(flat, weight, bias.defined() ? bias : at::empty({0}, weight.options()));
  return unflatten(y, x);
}

at::Tensor pack_onednn_weight(const at::Tensor& weight) {
  check_float_cpu("pack_onednn_weight", "weight", weight);
  if (weight.dim() != 2) throw ShapeError("pack_onednn_weight: weight must be (out, in), got " + shape_of(weight));
  return weight.to_mkldnn();
}

at::Tensor onednn_linear_packed(const at::Tensor& x, const at::Tensor& packed_weight, const at::Tensor& bias) {
  if (!packed_weight.defined() || !packed_weight.is_mkldnn()) {
    throw ValueError("onednn_linear_packed: the weight must come from pack_onednn_weight (a oneDNN tensor)");
  }
  check_inputs("onednn_linear_packed", x, packed_weight, bias);
  return unflatten(inner_product(x.reshape({-1, x.size(-1)}), packed_weight, bias), x);
}

}  // namespace hyflow::cuda
