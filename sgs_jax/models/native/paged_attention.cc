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
// exp, sum) and accumulates the value rows weighted by it. A page id outside [0, pages) (a
// bug in the host's allocator, `sampling.pages`) fails the call instead of reading past the
// pool.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

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
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * dim;
      float* s = scores + g * length + start;
      for (int64_t i = 0; i < n; ++i) {
        const KV* k = page + i * dim;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < dim; ++d) acc += qg[d] * ToFloat(k[d]);
        s[i] = acc;
      }
    }
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
    for (int64_t i = 0; i < n; ++i) {
      const KV* v = page + i * dim;
      for (int64_t g = 0; g < group; ++g) {
        const float w = scores[g * length + start + i];
        float* ag = acc + g * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) ag[d] += w * ToFloat(v[d]);
      }
    }
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
