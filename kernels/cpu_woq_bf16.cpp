// woq_linear for bfloat16 activations, where the CPU has AVX512-BF16 (vdpbf16ps): int4 and int8
// codes become bfloat16 by bit operations and are multiplied into x 32 pairs at a time. The
// float32 path (cpu_quant.cpp) converts every 16 codes to float32 and multiplies them one FMA
// at a time, which bounds it by the conversions, not by the bytes it reads.
//
// A value v in 0..15 OR-ed into the mantissa of bfloat16 128.0 (bits 0x4300) is exactly
// bfloat16 (128 + v). One 32-byte load of codes gives two vectors of 32 bfloat16:
// - int4, 64 codes (two blocks of 32, see cpu_quant.cpp): the low nibbles are columns 0-15
//   and 32-47 of the 64, the high nibbles 16-31 and 48-63;
// - int8, 32 codes: the low nibbles l and the high nibbles h of c + 128 = 16 h + l, the high
//   ones multiplied into 16 x (exact in bfloat16).
// x is laid out once per call to match (`layout_x`). Products of bfloat16 values are exact in
// float32, so only the order of the sums differs from the float32 reference. The offsets come
// back out through each group's sum of x: sum (c - z) x = sum (offset + c) x - (offset + z) sum x,
// with offset 128 for int4 (codes stored unsigned) and 128 + 128 * 17 = 2304 for int8.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace arbor_woq {

constexpr int64_t kInt8 = 0, kInt4 = 1;  // as cpu_quant.cpp numbers the kinds

bool has_bf16_path(const at::Tensor& x, int64_t kind, int64_t group) {
#if defined(__AVX512BF16__)
  return x.scalar_type() == at::kBFloat16 && ((kind == kInt4 && group % 64 == 0) || (kind == kInt8 && group % 32 == 0));
#else
  (void)x, (void)kind, (void)group;
  return false;
#endif
}

#if defined(__AVX512BF16__)
namespace {

constexpr int64_t kStepBytes = 32;  // codes read per step and weight row
constexpr int64_t kStepWords = 64;  // x values (bfloat16) per step: two vectors of 32
// Codes are prefetched this many weight rows ahead (once a cache line): the kernel is fast enough
// that a weight streamed from memory stalls it without (measured: the int8 LM head 1.0-2.3 ms
// without, 0.7-1.2 ms with, 8 and 4 rows ahead in between).
constexpr int64_t kPrefetchRows = 16;

inline uint16_t bf16_bits(float v) { return c10::BFloat16(v).x; }
inline float bf16_value(uint16_t bits) { return c10::detail::f32_from_bits(bits); }

// x [M, K] as the steps read it: per step, the 64 values the two code vectors multiply.
std::vector<uint16_t> layout_x(const uint16_t* x, int64_t m, int64_t cols, int64_t kind) {
  const int64_t steps = kind == kInt4 ? cols / 64 : cols / 32;
  std::vector<uint16_t> out(m * steps * kStepWords);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t s = 0; s < steps; ++s) {
      uint16_t* dst = out.data() + (i * steps + s) * kStepWords;
      if (kind == kInt4) {
        const uint16_t* src = x + i * cols + s * 64;
        for (int j = 0; j < 16; ++j) {
          dst[j] = src[j], dst[16 + j] = src[32 + j], dst[32 + j] = src[16 + j], dst[48 + j] = src[48 + j];
        }
      } else {
        const uint16_t* src = x + i * cols + s * 32;
        for (int j = 0; j < 32; ++j) dst[j] = src[j], dst[32 + j] = bf16_bits(16.f * bf16_value(src[j]));
      }
    }
  }
  return out;
}

// The two bfloat16 code vectors of one step of one weight row.
template <int64_t Kind>
inline void load_step(const uint8_t* codes, __m512bh& lo, __m512bh& hi) {
  const __m512i base = _mm512_set1_epi16(0x4300), nibble = _mm512_set1_epi16(0x000F);
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
  const __m512i high = _mm512_srli_epi16(w, 4);
  lo = reinterpret_cast<__m512bh>(_mm512_ternarylogic_epi32(w, nibble, base, 0xEA));  // (w & 15) | base
  if constexpr (Kind == kInt4) {
    hi = reinterpret_cast<__m512bh>(_mm512_or_si512(high, base));
  } else {  // the high nibble of c + 128: the sign bit flipped
    hi = reinterpret_cast<__m512bh>(_mm512_ternarylogic_epi32(high, _mm512_set1_epi16(8), base, 0xBE));  // (h ^ 8) | base
  }
}

// The horizontal sums of t[0] .. t[7], in order, in 24 shuffles and adds (8 separate
// reductions take about 64).
inline __m256 sum8(const __m512* t) {
  __m512 pair[4];  // per 128-bit lane: a0 + a2, b0 + b2, a1 + a3, b1 + b3 of t[2i] (a), t[2i + 1] (b)
  for (int i = 0; i < 4; ++i) {
    pair[i] = _mm512_add_ps(_mm512_unpacklo_ps(t[2 * i], t[2 * i + 1]), _mm512_unpackhi_ps(t[2 * i], t[2 * i + 1]));
  }
  __m512 quad[2];  // per lane: the lane's sum of t[4i], t[4i + 1], t[4i + 2], t[4i + 3]
  for (int i = 0; i < 2; ++i) {
    const __m512d a = _mm512_castps_pd(pair[2 * i]), b = _mm512_castps_pd(pair[2 * i + 1]);
    quad[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // lanes 0 + 1 and 2 + 3 of each, then the two halves of each
  const __m512 half = _mm512_add_ps(_mm512_shuffle_f32x4(quad[0], quad[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(quad[0], quad[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_add_ps(_mm512_castps512_ps256(_mm512_shuffle_f32x4(half, half, _MM_SHUFFLE(3, 1, 2, 0))),
                       _mm512_castps512_ps256(_mm512_shuffle_f32x4(half, half, _MM_SHUFFLE(2, 0, 3, 1))));
}

// Output rows n .. n + R - 1 for M rows of x, R x M independent accumulators. Each group's
// sums are scaled into vector totals; one horizontal sum per output at the end.
template <int M, int R, int64_t Kind>
void block(const uint16_t* xl, const float* xsum, const uint8_t* q, int64_t qs, const float* scale,
           const float* zero, int64_t groups, int64_t steps_per_group, at::BFloat16* out, int64_t rows, int64_t n) {
  constexpr float offset = Kind == kInt4 ? 128.f : 2304.f;
  const int64_t steps = groups * steps_per_group;
  __m512 total[R][M];
  float zterm[R][M] = {};
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) total[r][m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
    for (int64_t s = g * steps_per_group; s < (g + 1) * steps_per_group; ++s) {
      for (int r = 0; r < R; ++r) {
        __m512bh lo, hi;
        const uint8_t* codes = q + (n + r) * qs + s * kStepBytes;
        if ((s & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(codes + kPrefetchRows * qs), _MM_HINT_T0);
        load_step<Kind>(codes, lo, hi);
        for (int m = 0; m < M; ++m) {
          const uint16_t* xs = xl + (m * steps + s) * kStepWords;
          const __m512bh x0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xs));
          const __m512bh x1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xs + 32));
          acc[r][m] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][m], lo, x0), hi, x1);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const float s = scale[(n + r) * groups + g], z = zero[(n + r) * groups + g];
      for (int m = 0; m < M; ++m) {
        total[r][m] = _mm512_fmadd_ps(_mm512_set1_ps(s), acc[r][m], total[r][m]);
        zterm[r][m] += s * (offset + z) * xsum[m * groups + g];
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    if constexpr (R == 8) {  // eight outputs at once, rounded to bfloat16 (nearest even) together
      __m512 t[8];
      float z[8];
      for (int r = 0; r < 8; ++r) t[r] = total[r][m], z[r] = zterm[r][m];
      const __m128bh y = _mm256_cvtneps_pbh(_mm256_sub_ps(sum8(t), _mm256_loadu_ps(z)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + m * rows + n), reinterpret_cast<__m128i>(y));
    } else {
      for (int r = 0; r < R; ++r) out[m * rows + n + r] = at::BFloat16(_mm512_reduce_add_ps(total[r][m]) - zterm[r][m]);
    }
  }
}

// Weight rows in blocks of R (8 at one row of x, fewer as the rows of x take registers).
template <int M, int64_t Kind>
void rows_of(const uint16_t* xl, const float* xsum, const uint8_t* q, int64_t qs, const float* scale,
             const float* zero, int64_t groups, int64_t spg, at::BFloat16* out, int64_t rows) {
  constexpr int R = M == 1 ? 8 : (M == 2 ? 4 : (M <= 4 ? 2 : 1));
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    int64_t n = begin;
    for (; n + R <= end; n += R) block<M, R, Kind>(xl, xsum, q, qs, scale, zero, groups, spg, out, rows, n);
    for (; n < end; ++n) block<M, 1, Kind>(xl, xsum, q, qs, scale, zero, groups, spg, out, rows, n);
  });
}

template <int M>
void rows_kind(int64_t kind, const uint16_t* xl, const float* xsum, const uint8_t* q, int64_t qs, const float* scale,
               const float* zero, int64_t groups, int64_t spg, at::BFloat16* out, int64_t rows) {
  if (kind == kInt4) {
    rows_of<M, kInt4>(xl, xsum, q, qs, scale, zero, groups, spg, out, rows);
  } else {
    rows_of<M, kInt8>(xl, xsum, q, qs, scale, zero, groups, spg, out, rows);
  }
}

using RowsFn = void (*)(int64_t, const uint16_t*, const float*, const uint8_t*, int64_t, const float*, const float*,
                        int64_t, int64_t, at::BFloat16*, int64_t);
constexpr RowsFn kRows[8] = {rows_kind<1>, rows_kind<2>, rows_kind<3>, rows_kind<4>,
                             rows_kind<5>, rows_kind<6>, rows_kind<7>, rows_kind<8>};

}  // namespace

// x [M, K] bfloat16 -> [M, N] bfloat16 for a weight [N, K] of int4 or int8 codes (arguments
// checked by the caller, has_bf16_path true).
at::Tensor linear_bf16(const at::Tensor& x_in, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& zero,
                       int64_t group, int64_t kind) {
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), cols = x.size(1), rows = q.size(0), groups = cols / group;
  const int64_t spg = kind == kInt4 ? group / 64 : group / 32;
  const auto* xb = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const std::vector<uint16_t> xl = layout_x(xb, m, cols, kind);
  std::vector<float> xsum(m * groups, 0.f);
  for (int64_t i = 0; i < m * cols; ++i) xsum[i / group] += bf16_value(xb[i]);
  at::Tensor out = at::empty({m, rows}, x.options());
  const int64_t per_row = groups * spg * kStepWords;
  for (int64_t first = 0; first < m; first += 8) {  // blocks of up to 8 rows of x, each in registers
    const int64_t count = std::min<int64_t>(8, m - first);
    kRows[count - 1](kind, xl.data() + first * per_row, xsum.data() + first * groups, q.data_ptr<uint8_t>(), q.size(1),
                     scale.data_ptr<float>(), zero.data_ptr<float>(), groups, spg,
                     out.data_ptr<at::BFloat16>() + first * rows, rows);
  }
  return out;
}
#else
at::Tensor linear_bf16(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t) {
  TORCH_CHECK(false, "woq_linear: built without AVX512-BF16");
}
#endif

}  // namespace arbor_woq
