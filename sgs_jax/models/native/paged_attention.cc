// Paged decode attention for XLA:CPU, as an XLA FFI custom call.
//
// The CPU counterpart of the Pallas paged-attention kernels: each row's query attends over
// its own pages of the pool *in place*, so the keys and values are read once from the pool
// and never gathered into a copy (the XLA gather path moves each live page three times:
// read, write the copy, read the copy). Built and registered by `native/__init__.py`; the
// JAX side is `sgs_jax.models.paged_attention.native_attention`.
//
//   q           [S, Hq, D]                          f32 (already scaled by D^-1/2)
//   keys/values [Hkv, layers, pages, page_size, D]  f32 or bf16 (the pool, one shard's)
//   layer       []                                  s32
//   page_table  [S, max_pages]                      s32 (local page ids)
//   lengths     [S]                                 s32 (tokens to attend: positions 0..n-1;
//                                                        0 = inactive row, output zeros)
//   out         [S, Hq, D]                          f32
//
// Work is split in (row, KV head) units over XLA's intra-op thread pool (`common.h`); each unit computes
// its G = Hq / Hkv query heads' scores into a scratch row, takes an exact softmax (max,
// exp, sum) and accumulates the value rows weighted by it. Where the compiler targets AVX2
// and FMA (`-march=native` on such a CPU) and the head dim is 64 or 128, the score and value
// loops over a page use AVX2 directly (`PageScores`, `PageValues`); elsewhere the portable
// loops run. Either way a decode step reads every live key and value once, and the time
// goes to memory latency over the scattered pages (`benchmarks/paged_attention.py`). A page
// id outside [0, pages) (a bug in the host's allocator, `sampling.pages`) fails the call
// instead of reading past the pool.
//
// `SgsUnwrittenPool` makes a pool without writing it: its two results (keys, values) are
// left as XLA allocated them. Only this kernel may read such a pool, since it reads no
// position its row has not written; the XLA gather multiplies masked positions by zero,
// which garbage (NaN bits) would poison. For a pool this large XLA:CPU's buffers come
// straight from the OS as untouched pages, so a call pays only for the pages its rows write,
// not to zero the whole capacity.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using sgs_native::ExpNonPositive;

namespace {

inline float ToFloat(float x) { return x; }

inline float ToFloat(uint16_t bf16_bits) {
  uint32_t bits = static_cast<uint32_t>(bf16_bits) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// scores[i] = q . page[i] for the page's first n keys ([n, dim] rows).
template <typename KV, int kDim>
void PageScoresPortable(const float* q, const KV* page, int64_t n, int64_t dim_arg, float* scores) {
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  for (int64_t i = 0; i < n; ++i) {
    const KV* k = page + i * dim;
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < dim; ++d) acc += q[d] * ToFloat(k[d]);
    scores[i] = acc;
  }
}

// acc[dim] += sum_i weights[i] * page[i] over the page's first n value rows.
template <typename KV, int kDim>
void PageValuesPortable(const float* weights, const KV* page, int64_t n, int64_t dim_arg, float* acc) {
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  for (int64_t i = 0; i < n; ++i) {
    const KV* v = page + i * dim;
    const float w = weights[i];
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) acc[d] += w * ToFloat(v[d]);
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// AVX2 versions for head dims that are multiples of 8 (kDim = 64 or 128). The portable
// loops above leave a chain of dependent FMAs and a horizontal sum per key; here eight keys
// are scored at once (eight independent accumulators, one transposing reduction), and the
// value accumulators stay in registers across a page.
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The eight lane sums of x[0..7], as one vector.
inline __m256 Sum8x8(const __m256 x[8]) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

template <typename KV, int kDim>
void PageScores(const float* q, const KV* page, int64_t n, int64_t dim, float* scores) {
  if constexpr (kDim % 8 != 0 || kDim == 0) {
    PageScoresPortable<KV, kDim>(q, page, n, dim, scores);
  } else {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 acc[8];
      for (int kk = 0; kk < 8; ++kk) acc[kk] = _mm256_setzero_ps();
      for (int64_t d = 0; d < kDim; d += 8) {
        const __m256 qd = _mm256_loadu_ps(q + d);
        for (int kk = 0; kk < 8; ++kk) acc[kk] = _mm256_fmadd_ps(qd, Load8(page + (i + kk) * kDim + d), acc[kk]);
      }
      _mm256_storeu_ps(scores + i, Sum8x8(acc));
    }
    PageScoresPortable<KV, kDim>(q, page + i * kDim, n - i, dim, scores + i);
  }
}

template <typename KV, int kDim>
void PageValues(const float* weights, const KV* page, int64_t n, int64_t dim, float* acc) {
  if constexpr (kDim % 64 != 0 || kDim == 0) {
    PageValuesPortable<KV, kDim>(weights, page, n, dim, acc);
  } else {
    for (int64_t d0 = 0; d0 < kDim; d0 += 64) {  // 64 dims = 8 registers of accumulators
      __m256 a[8];
      for (int j = 0; j < 8; ++j) a[j] = _mm256_loadu_ps(acc + d0 + 8 * j);
      for (int64_t i = 0; i < n; ++i) {
        const __m256 w = _mm256_broadcast_ss(weights + i);
        const KV* v = page + i * kDim + d0;
        for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(w, Load8(v + 8 * j), a[j]);
      }
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(acc + d0 + 8 * j, a[j]);
    }
  }
}
#else
template <typename KV, int kDim>
void PageScores(const float* q, const KV* page, int64_t n, int64_t dim, float* scores) {
  PageScoresPortable<KV, kDim>(q, page, n, dim, scores);
}
template <typename KV, int kDim>
void PageValues(const float* weights, const KV* page, int64_t n, int64_t dim, float* acc) {
  PageValuesPortable<KV, kDim>(weights, page, n, dim, acc);
}
#endif

struct Problem {
  const float* q;
  const void* keys;
  const void* values;
  const int32_t* page_table;
  const int32_t* lengths;
  float* out;
  int64_t rows, q_heads, kv_heads, dim, layers, pages, page_size, max_pages;
  int32_t layer;
};

// Per-thread scratch: the unit's scores [G, length], softmax sums [G] and output
// accumulators [G, D].
struct Scratch {
  std::vector<float> scores;
  std::vector<float> totals;
  std::vector<float> acc;
};

// One (row, kv head) unit: its G query heads over the row's first `length` positions.
// kDim > 0 fixes the head dim at compile time (the common sizes); 0 reads it from `p`.
// Returns false on a page id outside the pool (nothing read).
template <typename KV, int kDim>
bool AttendUnit(const Problem& p, int64_t row, int64_t head, Scratch& scratch) {
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t dim = kDim > 0 ? kDim : p.dim;
  float* out = p.out + (row * p.q_heads + head * group) * dim;
  const int64_t length = p.lengths[row];
  if (length <= 0) {
    std::fill(out, out + group * dim, 0.0f);
    return true;
  }
  const float* q = p.q + (row * p.q_heads + head * group) * dim;
  const int64_t page_elems = p.page_size * dim;
  const int64_t base = (head * p.layers + p.layer) * p.pages * page_elems;
  const KV* keys = static_cast<const KV*>(p.keys) + base;
  const KV* values = static_cast<const KV*>(p.values) + base;
  const int32_t* table = p.page_table + row * p.max_pages;
  const int64_t num_pages = (length + p.page_size - 1) / p.page_size;
  for (int64_t column = 0; column < num_pages; ++column) {
    if (table[column] < 0 || table[column] >= p.pages) return false;
  }
  // Pages are scattered over the pool and the hardware prefetchers stop at 4 KB
  // boundaries, so each page's successor is prefetched while the page is read.
  auto prefetch = [&](const KV* pool, int64_t column) {
    if (column >= num_pages) return;
    const char* bytes = reinterpret_cast<const char*>(pool + static_cast<int64_t>(table[column]) * page_elems);
    const int64_t size = std::min(p.page_size, length - column * p.page_size) * dim * static_cast<int64_t>(sizeof(KV));
    for (int64_t offset = 0; offset < size; offset += 64) __builtin_prefetch(bytes + offset);
  };
  // fn(page, first position, tokens) for each of the row's pages of `pool`, in order.
  auto for_each_page = [&](const KV* pool, auto fn) {
    prefetch(pool, 0);
    for (int64_t column = 0; column < num_pages; ++column) {
      prefetch(pool, column + 1);
      const int64_t start = column * p.page_size;
      fn(pool + static_cast<int64_t>(table[column]) * page_elems, start, std::min(p.page_size, length - start));
    }
  };
  scratch.scores.resize(static_cast<size_t>(group * length));
  float* scores = scratch.scores.data();

  // Scores, page by page (a page stays in L1 across the G query heads).
  for_each_page(keys, [&](const KV* page, int64_t start, int64_t n) {
    for (int64_t g = 0; g < group; ++g) PageScores<KV, kDim>(q + g * dim, page, n, dim, scores + g * length + start);
  });
  // Exact softmax per query head: weights e^(s - max), divided by their sum at the end.
  scratch.totals.resize(static_cast<size_t>(group));
  scratch.acc.assign(static_cast<size_t>(group * dim), 0.0f);
  float* acc = scratch.acc.data();
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores + g * length;
    float peak = s[0];
    for (int64_t t = 1; t < length; ++t) peak = std::max(peak, s[t]);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t t = 0; t < length; ++t) {
      s[t] = ExpNonPositive(s[t] - peak);
      total += s[t];
    }
    scratch.totals[g] = total;
  }
  // Weighted values, page by page.
  for_each_page(values, [&](const KV* page, int64_t start, int64_t n) {
    for (int64_t g = 0; g < group; ++g) PageValues<KV, kDim>(scores + g * length + start, page, n, dim, acc + g * dim);
  });
  for (int64_t g = 0; g < group; ++g) {
    const float inverse = 1.0f / scratch.totals[g];
    const float* ag = acc + g * dim;
    float* og = out + g * dim;
    for (int64_t d = 0; d < dim; ++d) og[d] = ag[d] * inverse;
  }
  return true;
}

template <typename KV>
bool AttendUnitAnyDim(const Problem& p, int64_t row, int64_t head, Scratch& scratch) {
  switch (p.dim) {
    case 64:
      return AttendUnit<KV, 64>(p, row, head, scratch);
    case 128:
      return AttendUnit<KV, 128>(p, row, head, scratch);
    default:
      return AttendUnit<KV, 0>(p, row, head, scratch);
  }
}

ffi::Error PagedAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer keys, ffi::AnyBuffer values,
                              ffi::Buffer<ffi::S32> layer, ffi::Buffer<ffi::S32> page_table, ffi::Buffer<ffi::S32> lengths,
                              ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions();
  auto kd = keys.dimensions();
  auto td = page_table.dimensions();
  if (qd.size() != 3 || kd.size() != 5 || td.size() != 2) {
    return ffi::Error::InvalidArgument("paged attention: expected q [S, Hq, D], pool [Hkv, L, P, page, D], table [S, pages]");
  }
  if (keys.element_type() != values.element_type() ||
      (keys.element_type() != ffi::F32 && keys.element_type() != ffi::BF16)) {
    return ffi::Error::InvalidArgument("paged attention: the pool must be f32 or bf16, keys and values alike");
  }
  Problem p;
  p.rows = qd[0];
  p.q_heads = qd[1];
  p.dim = qd[2];
  p.kv_heads = kd[0];
  p.layers = kd[1];
  p.pages = kd[2];
  p.page_size = kd[3];
  p.max_pages = td[1];
  if (kd[4] != p.dim || p.q_heads % p.kv_heads != 0 || td[0] != p.rows || lengths.dimensions()[0] != p.rows) {
    return ffi::Error::InvalidArgument("paged attention: inconsistent shapes");
  }
  p.q = q.typed_data();
  p.keys = keys.untyped_data();
  p.values = values.untyped_data();
  p.page_table = page_table.typed_data();
  p.lengths = lengths.typed_data();
  p.out = out->typed_data();
  p.layer = layer.typed_data()[0];
  if (p.layer < 0 || p.layer >= p.layers) return ffi::Error::InvalidArgument("paged attention: layer out of range");
  for (int64_t r = 0; r < p.rows; ++r) {
    if (p.lengths[r] > p.max_pages * p.page_size) {
      return ffi::Error::InvalidArgument("paged attention: a row is longer than its page table");
    }
  }
  const bool bf16 = keys.element_type() == ffi::BF16;
  std::atomic<bool> bad_page{false};
  sgs_native::ParallelFor(pool, p.rows * p.kv_heads, [&p, bf16, &bad_page](int64_t unit) {
    thread_local Scratch scratch;
    const int64_t row = unit / p.kv_heads, head = unit % p.kv_heads;
    const bool ok = bf16 ? AttendUnitAnyDim<uint16_t>(p, row, head, scratch) : AttendUnitAnyDim<float>(p, row, head, scratch);
    if (!ok) bad_page.store(true, std::memory_order_relaxed);
  });
  if (bad_page.load()) return ffi::Error::InvalidArgument("paged attention: a page id outside the pool");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SgsPagedAttention, PagedAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::AnyBuffer>()         // keys
                                  .Arg<ffi::AnyBuffer>()         // values
                                  .Arg<ffi::Buffer<ffi::S32>>()  // layer
                                  .Arg<ffi::Buffer<ffi::S32>>()  // page_table
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lengths
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out
);

namespace {
ffi::Error UnwrittenPoolImpl(ffi::Result<ffi::AnyBuffer> keys, ffi::Result<ffi::AnyBuffer> values) {
  (void)keys;
  (void)values;
  return ffi::Error::Success();
}
}  // namespace

// One call with both results: two identical result-only calls could be merged into one
// buffer by XLA's common-subexpression pass.
XLA_FFI_DEFINE_HANDLER_SYMBOL(SgsUnwrittenPool, UnwrittenPoolImpl,
                              ffi::Ffi::Bind()
                                  .Ret<ffi::AnyBuffer>()  // keys
                                  .Ret<ffi::AnyBuffer>()  // values
);
