// Weight-only quantized linear layers on CPUs, built into the same `arbor_cpu` library as
// cpu_ops.cpp (by kernels/cpu_ops.py). Weights are int8, int4 or float8_e4m3 codes with a
// float32 scale and zero point per row and group of columns: w = (code - zero) * scale.
// int4 codes come two to a byte in blocks of 32: byte j of a block holds code j in its low
// nibble and code j + 16 in its high one, so 16 codes unpack with one shift and one mask.
// The torch reference is QuantWeight.dequantize / QuantLinear.reference.
//
// woq_linear serves decode-sized batches: with AVX-512, each group of a weight row is
// converted 16 codes at a time and multiplied into up to 8 rows of x at once, several weight
// rows together, the group's scale and zero point applied once to the sums
// (sum (c - z) x s = s (sum c x - z sum x)), so the weight is read once per 8 rows of x, at 1
// or 0.5 bytes a value. woq_dequantize writes the whole weight, for prefill-sized batches that
// a dense GEMM serves better.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace arbor_woq {  // cpu_woq_bf16.cpp: bfloat16 x times int4 / int8 codes with AVX512-BF16
bool has_bf16_path(const at::Tensor& x, int64_t kind, int64_t group);
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& zero,
                       int64_t group, int64_t kind);
}  // namespace arbor_woq

namespace {

enum Kind : int64_t { kInt8 = 0, kInt4 = 1, kFp8 = 2 };

float decode_e4m3(int bits) {
  const int sign = bits >> 7, exponent = (bits >> 3) & 15, mantissa = bits & 7;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa / 8.f, -6);  // subnormal
  } else {
    magnitude = std::ldexp(1.f + mantissa / 8.f, exponent - 7);
  }
  return sign ? -magnitude : magnitude;
}

struct Fp8Table {
  float value[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) value[i] = decode_e4m3(i);
  }
};

const Fp8Table& fp8_table() {
  static const Fp8Table table;
  return table;
}

// One row of weights into w[0, cols): (code - zero[g]) * scale[g] per group g.
void dequant_row(const uint8_t* q, const float* scale, const float* zero, int64_t cols, int64_t group,
                 int64_t kind, float* w) {
  const float* fp8 = fp8_table().value;
  for (int64_t g = 0; g * group < cols; ++g) {
    const float s = scale[g], z = zero[g];
    const int64_t lo = g * group, hi = lo + group;
    if (kind == kInt8) {
      const int8_t* qi = reinterpret_cast<const int8_t*>(q);
      for (int64_t k = lo; k < hi; ++k) w[k] = (static_cast<float>(qi[k]) - z) * s;
    } else if (kind == kInt4) {
      for (int64_t k = lo; k < hi; ++k) {
        const uint8_t byte = q[(k / 32) * 16 + k % 16];
        w[k] = (static_cast<float>(k % 32 < 16 ? byte & 15 : byte >> 4) - z) * s;
      }
    } else {
      for (int64_t k = lo; k < hi; ++k) w[k] = (fp8[q[k]] - z) * s;
    }
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {0.f};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += a[k + j] * b[k + j];
  }
  float sum = 0.f;
  for (int j = 0; j < 16; ++j) sum += acc[j];
  for (; k < n; ++k) sum += a[k] * b[k];
  return sum;
}

#if defined(__AVX512F__)
// Codes k .. k + 15 of a row as floats (float8: the value / 256, see below).
template <int64_t Kind>
inline __m512 load_codes(const uint8_t* row, int64_t k) {
  if constexpr (Kind == kInt8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k))));
  } else if constexpr (Kind == kInt4) {
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + (k / 32) * 16));
    if (k % 32) bytes = _mm_srli_epi16(bytes, 4);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(bytes, _mm_set1_epi8(0x0F))));
  } else {
    // e4m3 bits moved into float16's fields (sign; exponent and mantissa shifted by 7) read
    // as the value times 2^-8, subnormals included: float16's exponent bias is 8 more.
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8);
    const __m256i rest = _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7F)), 7);
    return _mm512_cvtph_ps(_mm256_or_si256(sign, rest));
  }
}

// Output rows n .. n + R - 1 for M rows of x: R x M independent accumulators, so the FMAs
// over one group's codes overlap instead of waiting on one chain (one chain bound the kernel
// at one row of x: 4 cycles per 16 codes), and each 16 values of x are loaded once for R rows.
template <int M, int R, int64_t Kind>
inline void gemv_block(const float* x, const float* xsum, const uint8_t* q, int64_t qs, const float* scale,
                       const float* zero, int64_t groups, int64_t cols, int64_t group, float* out, int64_t rows,
                       int64_t n) {
  const float unit = Kind == kFp8 ? 256.f : 1.f;
  float total[R][M] = {};
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
    for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
      __m512 w[R];
      for (int r = 0; r < R; ++r) w[r] = load_codes<Kind>(q + (n + r) * qs, k);
      for (int m = 0; m < M; ++m) {
        const __m512 xv = _mm512_loadu_ps(x + m * cols + k);
        for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(w[r], xv, acc[r][m]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const float s = scale[(n + r) * groups + g] * unit, z = zero[(n + r) * groups + g] / unit;
      for (int m = 0; m < M; ++m) total[r][m] += s * (_mm512_reduce_add_ps(acc[r][m]) - z * xsum[m * groups + g]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) out[m * rows + n + r] = total[r][m];
}

// Output rows [begin, end): blocks of R rows, then one row at a time. One or two rows of x
// (decode) take 8 or 4 weight rows a block; from three rows of x on, the M chains of one
// weight row already overlap, and wider blocks measured slower (registers run out).
template <int M, int64_t Kind>
void gemv_rows(const float* x, const float* xsum, const uint8_t* q, int64_t qs, const float* scale,
               const float* zero, int64_t groups, int64_t cols, int64_t group, float* out, int64_t rows,
               int64_t begin, int64_t end) {
  constexpr int R = M == 1 ? 8 : (M == 2 ? 4 : 1);
  int64_t n = begin;
  for (; n + R <= end; n += R) gemv_block<M, R, Kind>(x, xsum, q, qs, scale, zero, groups, cols, group, out, rows, n);
  for (; n < end; ++n) gemv_block<M, 1, Kind>(x, xsum, q, qs, scale, zero, groups, cols, group, out, rows, n);
}

// One row of weights into w (float32, or bfloat16 rounded to nearest even where the CPU
// converts in hardware).
template <int64_t Kind, typename Out>
void dequant_row_avx512(const uint8_t* row, const float* scale, const float* zero, int64_t cols, int64_t group,
                        Out* w) {
  const float unit = Kind == kFp8 ? 256.f : 1.f;
  for (int64_t g = 0; g * group < cols; ++g) {
    const __m512 s = _mm512_set1_ps(scale[g] * unit), z = _mm512_set1_ps(zero[g] / unit);
    for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
      const __m512 v = _mm512_mul_ps(_mm512_sub_ps(load_codes<Kind>(row, k), z), s);
      if constexpr (std::is_same_v<Out, float>) {
        _mm512_storeu_ps(w + k, v);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + k), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
      }
    }
  }
}

template <typename Out>
void dequant_rows_avx512(int64_t kind, const uint8_t* row, const float* s, const float* z, int64_t cols,
                         int64_t group, Out* w) {
  if (kind == kInt8) {
    dequant_row_avx512<kInt8>(row, s, z, cols, group, w);
  } else if (kind == kInt4) {
    dequant_row_avx512<kInt4>(row, s, z, cols, group, w);
  } else {
    dequant_row_avx512<kFp8>(row, s, z, cols, group, w);
  }
}

template <int M>
void gemv_kind(int64_t kind, const float* x, const float* xsum, const uint8_t* q, int64_t qs, const float* scale,
               const float* zero, int64_t groups, int64_t cols, int64_t group, float* out, int64_t rows) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    if (kind == kInt8) {
      gemv_rows<M, kInt8>(x, xsum, q, qs, scale, zero, groups, cols, group, out, rows, begin, end);
    } else if (kind == kInt4) {
      gemv_rows<M, kInt4>(x, xsum, q, qs, scale, zero, groups, cols, group, out, rows, begin, end);
    } else {
      gemv_rows<M, kFp8>(x, xsum, q, qs, scale, zero, groups, cols, group, out, rows, begin, end);
    }
  });
}

using GemvFn = void (*)(int64_t, const float*, const float*, const uint8_t*, int64_t, const float*, const float*,
                        int64_t, int64_t, int64_t, float*, int64_t);
constexpr GemvFn kGemv[8] = {gemv_kind<1>, gemv_kind<2>, gemv_kind<3>, gemv_kind<4>,
                             gemv_kind<5>, gemv_kind<6>, gemv_kind<7>, gemv_kind<8>};
#endif

void check(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& zero, int64_t cols, int64_t group,
           int64_t kind) {
  TORCH_CHECK(kind >= kInt8 && kind <= kFp8, "woq: unknown weight kind ", kind);
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte && q.is_contiguous(), "woq: q must be [N, *] uint8");
  TORCH_CHECK(q.size(1) == (kind == kInt4 ? cols / 2 : cols), "woq: q has ", q.size(1), " bytes a row for ", cols,
              " columns");
  TORCH_CHECK(group > 0 && cols % group == 0 && group % (kind == kInt4 ? 32 : 16) == 0, "woq: group ", group,
              " must divide ", cols, " and be a multiple of 16 (32 for int4)");
  for (const at::Tensor* t : {&scale, &zero}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->size(0) == q.size(0) &&
                    t->size(1) == cols / group, "woq: scale and zero must be float32 [N, groups]");
  }
}

// x [M, K] -> [M, N] in x's dtype, for a weight [N, K] stored as `kind` codes.
at::Tensor woq_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& zero,
                      int64_t group, int64_t kind) {
  TORCH_CHECK(x.dim() == 2, "woq_linear: x must be [M, K]");
  const int64_t m = x.size(0), cols = x.size(1), rows = q.size(0);
  check(q, scale, zero, cols, group, kind);
  if (arbor_woq::has_bf16_path(x, kind, group)) return arbor_woq::linear_bf16(x, q, scale, zero, group, kind);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({m, rows}, x.options().dtype(at::kFloat));
  const float* xd = xf.data_ptr<float>();
  float* od = out.data_ptr<float>();
  const uint8_t* qd = q.data_ptr<uint8_t>();
  const float *sd = scale.data_ptr<float>(), *zd = zero.data_ptr<float>();
  const int64_t qs = q.size(1), groups = scale.size(1);
#if defined(__AVX512F__)
  const at::Tensor xsum = xf.view({m, groups, group}).sum(-1).contiguous();
  for (int64_t first = 0; first < m; first += 8) {  // blocks of up to 8 rows of x, each in registers
    const int64_t count = std::min<int64_t>(8, m - first);
    kGemv[count - 1](kind, xd + first * cols, xsum.data_ptr<float>() + first * groups, qd, qs, sd, zd, groups, cols,
                     group, od + first * rows, rows);
  }
  return out.scalar_type() == x.scalar_type() ? out : out.to(x.scalar_type());
#endif
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> w(cols);
    for (int64_t n = begin; n < end; ++n) {
      dequant_row(qd + n * qs, sd + n * groups, zd + n * groups, cols, group, kind, w.data());
      for (int64_t i = 0; i < m; ++i) od[i * rows + n] = dot(xd + i * cols, w.data(), cols);
    }
  });
  return out.scalar_type() == x.scalar_type() ? out : out.to(x.scalar_type());
}

// The weight [N, K] in `dtype`, from `kind` codes.
at::Tensor woq_dequantize(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& zero, int64_t cols,
                          int64_t group, int64_t kind, at::ScalarType dtype) {
  check(q, scale, zero, cols, group, kind);
  const int64_t rows = q.size(0), qs = q.size(1), groups = scale.size(1);
  const uint8_t* qd = q.data_ptr<uint8_t>();
  const float *sd = scale.data_ptr<float>(), *zd = zero.data_ptr<float>();
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) {
    at::Tensor out = at::empty({rows, cols}, q.options().dtype(at::kBFloat16));
    auto* od = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());  // bfloat16 bits
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        dequant_rows_avx512(kind, qd + n * qs, sd + n * groups, zd + n * groups, cols, group, od + n * cols);
      }
    });
    return out;
  }
#endif
  at::Tensor out = at::empty({rows, cols}, q.options().dtype(at::kFloat));
  float* od = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
#if defined(__AVX512F__)
      dequant_rows_avx512(kind, qd + n * qs, sd + n * groups, zd + n * groups, cols, group, od + n * cols);
#else
      dequant_row(qd + n * qs, sd + n * groups, zd + n * groups, cols, group, kind, od + n * cols);
#endif
    }
  });
  return dtype == at::kFloat ? out : out.to(dtype);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(arbor_cpu, m) {
  m.def("woq_linear", &woq_linear);
  m.def("woq_dequantize", &woq_dequantize);
}
