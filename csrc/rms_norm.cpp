// RMSNorm over the last dimension in one pass per row, as Hugging Face computes it:
//   float32:  out = (x * 1 / sqrt(mean(x^2) + eps)) * weight
//   bfloat16: out = bf16(weight * bf16(x * 1 / sqrt(mean(x^2) + eps))), statistics in float32
//
// torch 2.13 runs the same formula on CPU as five element-wise passes (pow, mean, add +
// rsqrt, mul, mul), each reading or writing the whole [tokens x width] tensor: 5.2 ms for
// 7700 x 1024 here, against 1.4 ms for one copy. This reads each row twice while it is in
// cache (sum of squares, then scale) and writes it once.
//
// x: [N, D] or [N0, N1, D], float32 or bfloat16, any strides on the leading dimensions,
// unit stride in D (q / k heads split out of a fused projection); weight: [D] of x's dtype.
// Returns a contiguous tensor of x's shape and dtype. Built lazily by
// vllm/model_executor/layers/cpu_kernels.py.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>

namespace {

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

template <typename T>
void norm_row(const T* x, const T* w, T* out, int64_t d, float eps) {
  // 16 independent partial sums, so the compiler vectorises the reduction.
  float partial[16] = {0.f};
  int64_t j = 0;
  for (; j + 16 <= d; j += 16) {
    for (int l = 0; l < 16; ++l) {
      const float v = to_float(x[j + l]);
      partial[l] += v * v;
    }
  }
  float sum = 0.f;
  for (int l = 0; l < 16; ++l) sum += partial[l];
  for (; j < d; ++j) sum += to_float(x[j]) * to_float(x[j]);
  const float scale = 1.f / std::sqrt(sum / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) {
    const T h = static_cast<T>(to_float(x[i]) * scale);  // rounded as Hugging Face does
    out[i] = static_cast<T>(to_float(w[i]) * to_float(h));
  }
}

template <typename T>
void norm_rows(const torch::Tensor& x, const torch::Tensor& weight, torch::Tensor& out,
               float eps) {
  const int64_t d = x.size(-1);
  const int64_t n0 = x.size(0), n1 = x.dim() == 3 ? x.size(1) : 1;
  const int64_t s0 = x.stride(0), s1 = x.dim() == 3 ? x.stride(1) : 0;
  const T* xp = x.data_ptr<T>();
  const T* wp = weight.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1));
  at::parallel_for(0, n0 * n1, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t a = r / n1, b = r % n1;
      norm_row<T>(xp + a * s0 + b * s1, wp, op + r * d, d, eps);
    }
  });
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16,
              "rms_norm: float32 or bfloat16 only");
  TORCH_CHECK(weight.scalar_type() == dtype, "rms_norm: weight must have x's dtype");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "rms_norm: x must be [N, D] or [N0, N1, D]");
  const int64_t d = x.size(-1);
  TORCH_CHECK(x.stride(-1) == 1, "rms_norm: the last dimension must have unit stride");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == d && weight.is_contiguous(),
              "rms_norm: weight must be a contiguous [D] vector");
  auto out = torch::empty(x.sizes(), x.options());
  if (dtype == torch::kFloat)
    norm_rows<float>(x, weight, out, static_cast<float>(eps));
  else
    norm_rows<c10::BFloat16>(x, weight, out, static_cast<float>(eps));
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension (float32 / bfloat16)");
}
