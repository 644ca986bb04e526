// CPU kernels that read the paged KV pool in place and fuse the elementwise ops of a layer.
// Built at first use by kernels/cpu_ops.py (torch.utils.cpp_extension); torch references of
// each op live in kernels/reference.py. Work is split over torch's own thread pool
// (at::parallel_for), so torch.set_num_threads governs it.
//
// Rounding follows the torch references: values are widened to float for arithmetic and
// rounded back to the tensor dtype wherever the reference's torch ops would round.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kBlock = 64;  // keys scored per block before their softmax update
constexpr int64_t kPrefetch = 8;  // keys ahead whose K row is fetched into cache
constexpr int64_t kMaxGroup = 16, kMaxDim = 256;

template <typename T>
inline T round_to(float x) {
  return static_cast<T>(x);
}

template <>
inline c10::BFloat16 round_to(float x) {  // round to nearest even, as c10 does, vectorisable
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  c10::BFloat16 out;
  out.x = static_cast<uint16_t>(x != x ? 0x7FC0u : rounded);
  return out;
}

template <typename T>
inline float widen(T x) {
  return static_cast<float>(x);
}

template <>
inline float widen(c10::BFloat16 x) {  // a shift the compiler vectorises
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// float8 e4m3 (a float8 KV cache): a 256-entry table, filled once by c10's own conversion.
struct E4m3Table {
  float value[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) value[i] = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(i), c10::Float8_e4m3fn::from_bits()));
  }
};

const E4m3Table kE4m3;  // built when the library loads, so reads need no initialisation guard

template <>
inline float widen(c10::Float8_e4m3fn x) {
  return kE4m3.value[x.x];
}

// exp(x) for x <= 0 to about 1 ulp (range reduction by ln 2, degree-6 polynomial), written so
// that loops over it vectorise; inputs below -87 give about 1e-38 instead of 0.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.f);
  const float k = (x * 1.44269504f + 12582912.f) - 12582912.f;  // round to nearest
  const float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// ------------------------------------------------------------------ attention

template <typename T>
inline void prefetch_row(const T* row, int64_t dim) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < dim * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(p + off);
}

// out[t, h] = softmax(q[t, h] . K / sqrt) V over the keys of token t's request, which are the
// slots table[row, kv_start .. pos] of the pool (pos = the token's own position, so causal).
// Each task is one (token, KV head): every query head of the group reads each key row once.
// With a prior (the output and log-sum-exp of attention over other keys, e.g. a shared
// prefix), the softmax starts from that state, so the result covers both key sets. The pool
// holds T (q's dtype) or float8 e4m3 (KV), widened to float as rows are read.
template <typename T, typename KV, int64_t kDim>
void paged_attention_impl(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                          const at::Tensor& table, const at::Tensor& rows, const at::Tensor& kv_start,
                          const at::Tensor& seq_lens, const at::Tensor& qo_indptr, const float* prior_out,
                          const float* prior_lse, at::Tensor& out, at::Tensor& lse, double scale) {
  const int64_t tokens = q.size(0), hq = q.size(1), hkv = k_pool.size(1);
  const int64_t dim = kDim > 0 ? kDim : q.size(2);  // a compile-time head dim unrolls the inner loops
  const int64_t group = hq / hkv, width = table.size(1), batch = rows.size(0);
  const int64_t q_tok = q.stride(0), q_head = q.stride(1);
  const T* qd = q.data_ptr<T>();
  const KV* kd = k_pool.data_ptr<KV>();
  const KV* vd = v_pool.data_ptr<KV>();
  const int32_t* td = table.data_ptr<int32_t>();
  const int64_t* rd = rows.data_ptr<int64_t>();
  const int64_t* sd = kv_start.data_ptr<int64_t>();
  const int64_t* ld = seq_lens.data_ptr<int64_t>();
  const int64_t* qo = qo_indptr.data_ptr<int64_t>();
  float* od = out.data_ptr<float>();
  float* lsed = lse.data_ptr<float>();
  std::vector<int64_t> owner(tokens);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = qo[b]; t < qo[b + 1]; ++t) owner[t] = b;

  TORCH_CHECK(group <= kMaxGroup && dim <= kMaxDim, "paged_attention: at most 16 query heads per KV head, dim 256");
  at::parallel_for(0, tokens * hkv, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float qf[kMaxGroup * kMaxDim], acc[kMaxGroup * kMaxDim], row[kMaxDim], score[kMaxGroup * kBlock];
    float mx[kMaxGroup], sum[kMaxGroup];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / hkv, h = task % hkv, b = owner[t];
      const int64_t pos = ld[b] - (qo[b + 1] - qo[b]) + (t - qo[b]);
      const int32_t* slots = td + rd[b] * width;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t head = t * hq + h * group + g;
        const T* src = qd + t * q_tok + (h * group + g) * q_head;
        for (int64_t d = 0; d < dim; ++d) qf[g * dim + d] = widen(src[d]) * static_cast<float>(scale);
        // State (max, sum, acc) = (lse, 1, out) reproduces a prior; (-inf, 0, 0) is empty.
        const bool has_prior = prior_lse != nullptr && prior_lse[head] > -std::numeric_limits<float>::infinity();
        mx[g] = has_prior ? prior_lse[head] : -std::numeric_limits<float>::infinity();
        sum[g] = has_prior ? 1.f : 0.f;
        for (int64_t d = 0; d < dim; ++d) acc[g * dim + d] = has_prior ? prior_out[head * dim + d] : 0.f;
      }
      for (int64_t j0 = sd[b]; j0 <= pos; j0 += kBlock) {
        const int64_t n = std::min(kBlock, pos + 1 - j0);
        for (int64_t j = 0; j < n; ++j) {
          // Slots scatter over the pool (decode steps interleave requests), so each row is a
          // cache miss unless fetched ahead: K rows kPrefetch keys ahead, V rows for the V pass.
          if (j0 + j + kPrefetch <= pos) prefetch_row(kd + (static_cast<int64_t>(slots[j0 + j + kPrefetch]) * hkv + h) * dim, dim);
          prefetch_row(vd + (static_cast<int64_t>(slots[j0 + j]) * hkv + h) * dim, dim);
          const KV* kr = kd + (static_cast<int64_t>(slots[j0 + j]) * hkv + h) * dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) row[d] = widen(kr[d]);
          for (int64_t g = 0; g < group; ++g) {
            const float* qg = qf + g * dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < dim; ++d) dot += qg[d] * row[d];
            score[g * kBlock + j] = dot;
          }
        }
        for (int64_t g = 0; g < group; ++g) {
          float* sg = score + g * kBlock;
          float top = mx[g];
          for (int64_t j = 0; j < n; ++j) top = std::max(top, sg[j]);
          const float fix = mx[g] == -std::numeric_limits<float>::infinity() ? 0.f : exp_nonpositive(mx[g] - top);
          float total = 0.f;
#pragma omp simd reduction(+ : total)
          for (int64_t j = 0; j < n; ++j) {
            sg[j] = exp_nonpositive(sg[j] - top);
            total += sg[j];
          }
          float* ag = acc + g * dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) ag[d] *= fix;
          mx[g] = top;
          sum[g] = sum[g] * fix + total;
        }
        for (int64_t j = 0; j < n; ++j) {
          const KV* vr = vd + (static_cast<int64_t>(slots[j0 + j]) * hkv + h) * dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) row[d] = widen(vr[d]);
          for (int64_t g = 0; g < group; ++g) {
            const float p = score[g * kBlock + j];
            float* ag = acc + g * dim;
#pragma omp simd
            for (int64_t d = 0; d < dim; ++d) ag[d] += p * row[d];
          }
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t head = h * group + g;
        float* dst = od + (t * hq + head) * dim;
        const float inv = sum[g] > 0.f ? 1.f / sum[g] : 0.f;
        for (int64_t d = 0; d < dim; ++d) dst[d] = acc[g * dim + d] * inv;
        lsed[t * hq + head] = sum[g] > 0.f ? mx[g] + std::log(sum[g]) : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> paged_attention(const at::Tensor& q, const at::Tensor& k_pool,
                                                   const at::Tensor& v_pool, const at::Tensor& table,
                                                   const at::Tensor& rows, const at::Tensor& kv_start,
                                                   const at::Tensor& seq_lens, const at::Tensor& qo_indptr,
                                                   double scale, const std::optional<at::Tensor>& prior_out,
                                                   const std::optional<at::Tensor>& prior_lse) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [T, Hq, D] with unit last stride");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous(), "the KV pools must be contiguous");
  const bool fp8_pool = k_pool.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(k_pool.scalar_type() == v_pool.scalar_type() && (fp8_pool || q.scalar_type() == k_pool.scalar_type()),
              "the KV pool must hold q's dtype or float8_e4m3fn");
  TORCH_CHECK(table.scalar_type() == at::kInt && table.is_contiguous(), "table must be contiguous int32");
  for (const auto* idx : {&rows, &kv_start, &seq_lens, &qo_indptr})
    TORCH_CHECK(idx->scalar_type() == at::kLong && idx->is_contiguous(), "index tensors must be contiguous int64");
  TORCH_CHECK(prior_out.has_value() == prior_lse.has_value(), "give both prior_out and prior_lse, or neither");
  const float* po = nullptr;
  const float* pl = nullptr;
  if (prior_out.has_value()) {
    TORCH_CHECK(prior_out->scalar_type() == at::kFloat && prior_out->is_contiguous() &&
                    prior_out->sizes() == q.sizes(), "prior_out must be contiguous float32 shaped like q");
    TORCH_CHECK(prior_lse->scalar_type() == at::kFloat && prior_lse->is_contiguous() &&
                    prior_lse->numel() == q.size(0) * q.size(1), "prior_lse must be contiguous float32 [T, Hq]");
    po = prior_out->data_ptr<float>();
    pl = prior_lse->data_ptr<float>();
  }
  auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  auto lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention", [&] {
    const auto run = [&](auto dim) {
      if (fp8_pool) {
        paged_attention_impl<scalar_t, c10::Float8_e4m3fn, decltype(dim)::value>(
            q, k_pool, v_pool, table, rows, kv_start, seq_lens, qo_indptr, po, pl, out, lse, scale);
      } else {
        paged_attention_impl<scalar_t, scalar_t, decltype(dim)::value>(q, k_pool, v_pool, table, rows, kv_start,
                                                                       seq_lens, qo_indptr, po, pl, out, lse, scale);
      }
    };
    if (q.size(2) == 64) {
      run(std::integral_constant<int64_t, 64>{});
    } else if (q.size(2) == 128) {
      run(std::integral_constant<int64_t, 128>{});
    } else {
      run(std::integral_constant<int64_t, 0>{});
    }
  });
  return {out, lse};
}

// ---------------------------------------------------------------- elementwise

// out = weight * round(x / rms(x)); with a residual, x = round(x + residual) first and is
// returned as the new residual. x [N, H] rows may be strided; outputs are contiguous.
template <typename T>
void rmsnorm_impl(const at::Tensor& x, const at::Tensor* residual, const at::Tensor& weight, double eps,
                  at::Tensor& out, at::Tensor* summed) {
  const int64_t n = x.size(0), hidden = x.size(1);
  const T* xd = x.data_ptr<T>();
  const T* rd = residual ? residual->data_ptr<T>() : nullptr;
  const T* wd = weight.data_ptr<T>();
  T* od = out.data_ptr<T>();
  T* sd = summed ? summed->data_ptr<T>() : nullptr;
  const int64_t xs = x.stride(0), rs = residual ? residual->stride(0) : 0;
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> h(hidden);
    for (int64_t i = begin; i < end; ++i) {
      float sq = 0.f;
      for (int64_t j = 0; j < hidden; ++j) {
        float v = widen(xd[i * xs + j]);
        if (rd) {
          const T s = round_to<T>(v + widen(rd[i * rs + j]));
          sd[i * hidden + j] = s;
          v = widen(s);
        }
        h[j] = v;
        sq += v * v;
      }
      const float inv = 1.f / std::sqrt(sq / static_cast<float>(hidden) + static_cast<float>(eps));
      for (int64_t j = 0; j < hidden; ++j) {
        const float normed = widen(round_to<T>(h[j] * inv));
        od[i * hidden + j] = round_to<T>(widen(wd[j]) * normed);
      }
    }
  });
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && weight.scalar_type() == x.scalar_type(), "rmsnorm: bad input");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rmsnorm", [&] {
    rmsnorm_impl<scalar_t>(x, nullptr, weight, eps, out, nullptr);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> add_rmsnorm(const at::Tensor& x, const at::Tensor& residual,
                                               const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && residual.stride(1) == 1, "add_rmsnorm: bad input");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(), "add_rmsnorm: shapes");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  auto summed = at::empty({x.size(0), x.size(1)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rmsnorm", [&] {
    rmsnorm_impl<scalar_t>(x, &residual, weight, eps, out, &summed);
  });
  return {out, summed};
}

// In place: x[t, h] = x * cos + rotate_half(x) * sin at positions[t], each product and the
// sum rounded to x's dtype as the torch reference does; cos/sin [max_pos, D] float32.
template <typename T>
void rotate(const at::Tensor& x, const int64_t* pos, const float* cd, const float* sd, int64_t dim) {
  const int64_t n = x.size(0), heads = x.size(1), half = dim / 2;
  const int64_t xs = x.stride(0), hs = x.stride(1);
  T* xd = x.data_ptr<T>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cd + pos[t] * dim;
      const float* s = sd + pos[t] * dim;
      for (int64_t h = 0; h < heads; ++h) {
        T* v = xd + t * xs + h * hs;
        for (int64_t d = 0; d < half; ++d) {
          const float a = widen(v[d]), b = widen(v[d + half]);
          const float c0 = widen(round_to<T>(c[d])), s0 = widen(round_to<T>(s[d]));
          const float c1 = widen(round_to<T>(c[d + half]));
          const float s1 = widen(round_to<T>(s[d + half]));
          const float lo = widen(round_to<T>(a * c0)) + widen(round_to<T>(-b * s0));
          const float hi = widen(round_to<T>(b * c1)) + widen(round_to<T>(a * s1));
          v[d] = round_to<T>(lo);
          v[d + half] = round_to<T>(hi);
        }
      }
    }
  });
}

void rotary(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
            const at::Tensor& sin) {
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1, "rotary: q/k need a unit last stride");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous(), "rotary: positions int64");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous(), "rotary: tables");
  const int64_t dim = q.size(2);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "rotary", [&] {
    rotate<scalar_t>(q, positions.data_ptr<int64_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(), dim);
    rotate<scalar_t>(k, positions.data_ptr<int64_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(), dim);
  });
}

// ------------------------------------------------------------------ argmax

// The first index of a row's maximum; a NaN wins (its first index), as in torch.max.
template <typename T>
int64_t argmax_row_scalar(const T* row, int64_t n) {
  int64_t at = 0;
  float best = widen(row[0]);
  for (int64_t j = 0; j < n; ++j) {
    const float v = widen(row[j]);
    if (v != v) return j;
    if (v > best) best = v, at = j;
  }
  return at;
}

#if defined(__AVX512F__)
// bf16 rows, 32 values a step: a vector max pass (NaNs noted), then a scan for its first index.
int64_t argmax_row_bf16(const c10::BFloat16* row, int64_t n) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(row);
  const int64_t full = n - n % 16;
  __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 nan = 0;
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j))), 16));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, v);
  }
  float top = _mm512_reduce_max_ps(best);
  for (int64_t j = full; j < n; ++j) {
    const float v = widen(row[j]);
    if (v != v) nan = 1;
    top = std::max(top, v);
  }
  if (nan) return argmax_row_scalar(row, n);
  const __m512 target = _mm512_set1_ps(top);
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j))), 16));
    const __mmask16 hit = _mm512_cmp_ps_mask(v, target, _CMP_EQ_OQ);
    if (hit) return j + __builtin_ctz(hit);
  }
  for (int64_t j = full; j < n; ++j)
    if (widen(row[j]) == top) return j;
  return 0;
}
#endif

template <typename T>
int64_t argmax_row(const T* row, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) return argmax_row_bf16(row, n);
#endif
  return argmax_row_scalar(row, n);
}

// logits [B, V] -> [B] int64, each row's argmax (torch.max(-1).indices), with no float copy.
at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1 && logits.size(1) > 0,
              "argmax_rows: logits must be [B, V] with unit stride");
  const int64_t rows = logits.size(0), vocab = logits.size(1), ls = logits.stride(0);
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  int64_t* od = out.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "argmax_rows", [&] {
    const scalar_t* ld = logits.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) od[r] = argmax_row(ld + r * ls, vocab);
    });
  });
  return out;
}

// ------------------------------------------------------------------ elementwise (cont.)

// x [N, 2I] = gate | up -> round(silu(gate)) * up, rounded: [N, I].
at::Tensor silu_and_mul(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "silu_and_mul: x must be [N, 2I]");
  const int64_t n = x.size(0), inter = x.size(1) / 2, xs = x.stride(0);
  auto out = at::empty({n, inter}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* xd = x.data_ptr<scalar_t>();
    scalar_t* od = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t j = 0; j < inter; ++j) {
          const float g = widen(xd[i * xs + j]);
          const float e = exp_nonpositive(-std::fabs(g));  // sigmoid without overflow
          const float sig = g >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
          const float act = widen(round_to<scalar_t>(g * sig));
          od[i * inter + j] = round_to<scalar_t>(act * widen(xd[i * xs + inter + j]));
        }
      }
    });
  });
  return out;
}

// ------------------------------------------------------------------ KV store

// k_pool[slots[t]] = k[t] and v_pool[slots[t]] = v[t]: pools [S, Hkv, D] of k's dtype, k and v
// [T, Hkv, D] with each token's Hkv x D values contiguous (views into the fused qkv output).
void store_kv(const at::Tensor& k_pool, const at::Tensor& v_pool, const at::Tensor& slots, const at::Tensor& k,
              const at::Tensor& v) {
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous(), "store_kv: the pools must be contiguous");
  TORCH_CHECK(k.scalar_type() == k_pool.scalar_type() && v.scalar_type() == v_pool.scalar_type(),
              "store_kv: k/v must have the pool's dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == k.size(0),
              "store_kv: slots must be contiguous int64, one per token");
  const int64_t row = k_pool.size(1) * k_pool.size(2), bytes = row * k_pool.element_size();
  for (const at::Tensor* t : {&k, &v}) {
    TORCH_CHECK(t->dim() == 3 && t->size(1) * t->size(2) == row && t->stride(2) == 1 && t->stride(1) == t->size(2),
                "store_kv: each token's k/v must be one contiguous [Hkv, D] row");
  }
  const int64_t* sd = slots.data_ptr<int64_t>();
  auto* kp = static_cast<char*>(k_pool.data_ptr());
  auto* vp = static_cast<char*>(v_pool.data_ptr());
  const auto* kd = static_cast<const char*>(k.data_ptr());
  const auto* vd = static_cast<const char*>(v.data_ptr());
  const int64_t ks = k.stride(0) * k.element_size(), vs = v.stride(0) * v.element_size();
  for (int64_t t = 0; t < slots.numel(); ++t) {
    TORCH_CHECK(sd[t] >= 0 && sd[t] < k_pool.size(0), "store_kv: slot ", sd[t], " is outside the pool");
    std::memcpy(kp + sd[t] * bytes, kd + t * ks, bytes);
    std::memcpy(vp + sd[t] * bytes, vd + t * vs, bytes);
  }
}

}  // namespace

TORCH_LIBRARY(arbor_cpu, m) {
  m.def("paged_attention", &paged_attention);
  m.def("rmsnorm", &rmsnorm);
  m.def("add_rmsnorm", &add_rmsnorm);
  m.def("rotary", &rotary);
  m.def("silu_and_mul", &silu_and_mul);
  m.def("argmax_rows", &argmax_rows);
  m.def("store_kv", &store_kv);
}
