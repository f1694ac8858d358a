// Causal self-attention for XLA:CPU training, forward and backward, as XLA FFI custom calls.
//
// The CPU counterpart of the fused training kernels (cuDNN, splash): FlashAttention-2's
// schedule in tiles of 64 queries x 64 keys, so the [T, S] scores never exist whole and the
// tiles above the diagonal are never computed. The JAX side
// (`sgs_jax.models.attention.native`) wraps the two calls in a custom VJP. Built and
// registered by `native/__init__.py`.
//
//   forward:  q [B, T, Hq, D], k/v [B, T, Hkv, D], segments [B, T] s32 (0 = padding)
//             -> out [B, T, Hq, D], lse [B, Hq, T]      (q pre-scaled by D^-1/2; all f32)
//   backward: q, k, v, segments, out, lse, d_out -> dq (w.r.t. the scaled q), dk, dv
//
// D must be a multiple of 16 (one 16-float vector per 16 dims; the JAX side checks). Query t
// sees keys s <= t of its own segment (segments[s] == segments[t] != 0): one segment per row
// for unpacked rows, several for packed ones. A query that sees no key (padding) gets output
// 0 and log-sum-exp -1e30 (and no gradient). Only the tiles where some query sees some key
// are computed: a row's queries past its last real token (right padding) and, in packed
// rows, the tiles between two segments cost nothing. Inside a tile on the diagonal or at a
// segment's edge, the products skip the register blocks no query sees (`TileView`).
// Work is split in (batch row, KV head) units over XLA's intra-op thread pool, longest rows
// first; a unit owns its G = Hq / Hkv query heads, so dk / dv sum over the group without
// sharing. Inside a unit, rows are copied into zero-padded [T64, D] buffers (T64 = T
// rounded up to 64), so every tile is full and the tile products below run on fixed shapes
// the compiler keeps in vector registers.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace {

constexpr int64_t kTile = 64;  // query and key rows per tile
constexpr float kMasked = -1e30f;

// One vector register of floats: 16 with AVX-512, else 8 (AVX2; without AVX the compiler
// splits it in two). The tile products below are register-blocked for the register file
// of the target: 32 vector registers with AVX-512, 16 without. (Blocked for 32 registers,
// an AVX2 build spilled its accumulators on every FMA and ran 3x slower than XLA's
// blockwise attention.)
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
typedef float Vec __attribute__((vector_size(4 * kLanes)));
constexpr int64_t kTileVecs = kTile / kLanes;  // vectors per 64-float tile row

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }
// v, as a value the compiler must hold in a register and cannot look through.
inline Vec Opaque(Vec v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#elif defined(__AVX__)
  asm("" : "+x"(v));
#endif
  return v;
}
// Load, kept in a register: a value reused by several FMAs is otherwise folded into each
// of them as a memory operand, one load per FMA.
inline Vec LoadOnce(const float* p) { return Opaque(Load(p)); }
// x in every lane. (x - 0 is x for every x, so the compiler drops the subtraction and
// broadcasts; `Vec{} + x` is not, for x = -0, and kept a scalar add before each broadcast.)
inline Vec Splat(float x) { return x - Vec{}; }

// sgs_native::ExpNonPositive on every lane: the same operations in the same order, so the
// same values, written on vectors because GCC vectorises the scalar form's loops (a max and
// a select per element) only with AVX-512's masks; compiled for AVX2 they ran scalar, a
// third of the forward's time. nearbyint becomes the add-and-subtract of 1.5 x 2^23, which
// rounds to the nearest integer, ties to even, for |t| < 2^22 (here |t| <= 126); t is kept
// opaque so the multiply is not fused into that add (it rounds first, as nearbyint's
// argument does).
inline Vec ExpNonPositive(Vec x) {
  typedef int32_t Ints __attribute__((vector_size(sizeof(Vec))));
  const Vec lowest = Splat(-87.0f), shifter = Splat(12582912.0f);
  x = x < lowest ? lowest : x;  // std::max(x, -87)
  const Vec t = Opaque(x * 1.44269504088896341f);
  const Vec n = (t + shifter) - shifter;
  const Vec poly = sgs_native::ExpTaylor7(sgs_native::MinusNLn2(x, n));
  return (Vec)((Ints)poly + __builtin_convertvector(n, Ints) * (1 << 23));
}
using sgs_native::ExpNonPositive;  // and the scalar form

// max(init, x[0], ..., x[63]): lane-wise over the row's vectors, then across the lanes. (A
// scalar loop, which GCC would not vectorise here even under `omp simd reduction(max)`.)
inline float RowMax(const float* x, float init) {
  Vec m = Load(x);
  for (int64_t j = 1; j < kTileVecs; ++j) {
    const Vec v = Load(x + kLanes * j);
    m = m > v ? m : v;
  }
  float out = init;
  for (int64_t i = 0; i < kLanes; ++i) out = std::max(out, m[i]);
  return out;
}

struct Dims {
  int64_t batch, length, q_heads, kv_heads, dim, padded;
  int64_t group() const { return q_heads / kv_heads; }
};

// Rows [T, D] of head h in batch row b of a [B, T, H, D] tensor (D = 16 DV), copied into /
// out of a padded [T64, D] buffer (padding rows zero). D is a constant so each row's copy
// is a few vector moves rather than a call.
template <int DV>
void Gather(const float* x, int64_t heads, const Dims& d, int64_t b, int64_t h, float* rows) {
  constexpr int64_t D = 16 * DV;
  for (int64_t t = 0; t < d.length; ++t) {
    std::memcpy(rows + t * D, x + ((b * d.length + t) * heads + h) * D, sizeof(float) * D);
  }
  std::fill(rows + d.length * D, rows + d.padded * D, 0.0f);
}

template <int DV>
void Scatter(const float* rows, int64_t heads, const Dims& d, int64_t b, int64_t h, float* x) {
  constexpr int64_t D = 16 * DV;
  for (int64_t t = 0; t < d.length; ++t) {
    std::memcpy(x + ((b * d.length + t) * heads + h) * D, rows + t * D, sizeof(float) * D);
  }
}

// [T64, D] -> [T64 / 64, D, 64]: each tile of 64 rows transposed into its own contiguous
// block. (One [D, T64] transpose has a row stride of T64 floats, 4 KB at T = 1,024: the D
// rows a tile product reads then share a few L1 sets and evict each other.)
void TransposeTiles(const float* rows, int64_t length, int64_t dim, float* cols) {
  for (int64_t t = 0; t < length; ++t) {
    float* block = cols + (t / kTile) * dim * kTile + t % kTile;
    for (int64_t c = 0; c < dim; ++c) block[c * kTile] = rows[t * dim + c];
  }
}

// TileScores' register block: kScoreRows query rows x kScoreVecs vectors of keys (with
// AVX-512 all 64 keys: 16 accumulators and 4 key vectors; else 16 keys: 8 and 2).
constexpr int kScoreRows = 4;
constexpr int kScoreVecs = kLanes == 16 ? 4 : 2;

// The hull [*begin, *end) of rows r .. r + n - 1's ranges [begin[i], end[i]) (empty: begin = end).
inline void Hull(const int32_t* begin, const int32_t* end, int64_t r, int n, int32_t* lo, int32_t* hi) {
  *lo = kTile;
  *hi = 0;
  for (int i = 0; i < n; ++i) {
    if (begin[r + i] < end[r + i]) {
      *lo = std::min(*lo, begin[r + i]);
      *hi = std::max(*hi, end[r + i]);
    }
  }
}

// s[64, 64] = a[64, D] . bt (bt: one [D, 64] block of `TransposeTiles`), a register block
// at a time, for the entries of row r in columns [begin[r], end[r]) (`TileView`'s key
// ranges); register blocks with none of them are set to 0 instead. Every score sums over d
// in order, whatever the blocking.
template <int DV>
void TileScores(const float* a, const float* bt, const int32_t* begin, const int32_t* end, float* s) {
  constexpr int64_t D = 16 * DV;
  constexpr int64_t W = kScoreVecs * kLanes;  // keys per register block
  for (int64_t r = 0; r < kTile; r += kScoreRows) {
    int32_t lo, hi;
    Hull(begin, end, r, kScoreRows, &lo, &hi);
    for (int64_t c0 = 0; c0 < kTile; c0 += W) {
      Vec acc[kScoreRows][kScoreVecs] = {};
      if (c0 < hi && lo < c0 + W) {
        for (int64_t d = 0; d < D; ++d) {
          const float* row = bt + d * kTile + c0;
          Vec keys[kScoreVecs];
          for (int j = 0; j < kScoreVecs; ++j) keys[j] = LoadOnce(row + kLanes * j);
          for (int rr = 0; rr < kScoreRows; ++rr) {
            const Vec x = Splat(a[(r + rr) * D + d]);
            for (int j = 0; j < kScoreVecs; ++j) acc[rr][j] += x * keys[j];
          }
        }
      }
      for (int rr = 0; rr < kScoreRows; ++rr) {
        for (int j = 0; j < kScoreVecs; ++j) Store(s + (r + rr) * kTile + c0 + kLanes * j, acc[rr][j]);
      }
    }
  }
}

// TileApply's register block: kApplyRows<DV> output rows x kApplyVecs<DV> vectors of a
// row. With AVX-512 a whole row (DV vectors) and at most 16 accumulators; else 4 rows x 2
// vectors (8 accumulators; D = 16 DV is always 2 DV vectors of 8).
template <int DV>
constexpr int kApplyVecs = kLanes == 16 ? DV : 2;
template <int DV>
constexpr int kApplyRows = kLanes == 16 ? (DV <= 2 ? 8 : (DV <= 4 ? 4 : 2)) : 4;

// out[64, D] += p[64, 64] . b[64, D] (transposed = false), or out[64, D] += p^T . b
// (transposed = true, p read column-wise), a register block at a time, where output row r
// sums only over c in [begin[r], end[r]) (`TileView`'s ranges: p is 0 outside them). Every
// output sums over the keys in order, whatever the blocking.
template <int DV, bool kTransposed>
void TileApply(const float* p, const float* b, const int32_t* begin, const int32_t* end, float* out) {
  constexpr int64_t D = 16 * DV;
  constexpr int R = kApplyRows<DV>, V = kApplyVecs<DV>;
  for (int64_t r = 0; r < kTile; r += R) {
    int32_t lo, hi;
    Hull(begin, end, r, R, &lo, &hi);
    if (lo >= hi) continue;
    for (int64_t e0 = 0; e0 < D; e0 += V * kLanes) {
      Vec acc[R][V];
      for (int rr = 0; rr < R; ++rr) {
        for (int j = 0; j < V; ++j) acc[rr][j] = Load(out + (r + rr) * D + e0 + kLanes * j);
      }
      for (int64_t c = lo; c < hi; ++c) {
        Vec row[V];
        for (int j = 0; j < V; ++j) row[j] = LoadOnce(b + c * D + e0 + kLanes * j);
        for (int rr = 0; rr < R; ++rr) {
          const Vec w = Splat(kTransposed ? p[c * kTile + r + rr] : p[(r + rr) * kTile + c]);
          for (int j = 0; j < V; ++j) acc[rr][j] += w * row[j];
        }
      }
      for (int rr = 0; rr < R; ++rr) {
        for (int j = 0; j < V; ++j) Store(out + (r + rr) * D + e0 + kLanes * j, acc[rr][j]);
      }
    }
  }
}

// One row's segment layout in tiles of 64 (positions past the row's end are segment 0).
struct RowTiles {
  std::vector<int32_t> segments;  // [T64]
  std::vector<int32_t> uniform;   // per tile: its segment if all 64 positions share one real segment, else -1
  std::vector<int64_t> first_key_tile;  // per query tile: the first key tile any of its queries sees
  std::vector<int64_t> query_end;  // per key tile: one past the last query that sees any of its keys (0: none)
  // per position of a real segment: its segment's first position and one past its last
  std::vector<int64_t> segment_begin, segment_end;
  bool contiguous = true;  // every real segment is one run of positions (packed rows, padding at the ends)

  RowTiles(const int32_t* row, int64_t length, int64_t padded)
      : segments(padded, 0), uniform(padded / kTile, -1), first_key_tile(padded / kTile, padded / kTile),
        query_end(padded / kTile, 0), segment_begin(padded, 0), segment_end(padded, 0) {
    std::copy(row, row + length, segments.begin());
    std::unordered_map<int32_t, std::pair<int64_t, int64_t>> span;  // segment -> [first, last] position
    size_t runs = 0;
    for (int64_t t = 0; t < padded; ++t) {
      if (segments[t] == 0) continue;
      runs += t == 0 || segments[t - 1] != segments[t];
      auto [it, fresh] = span.try_emplace(segments[t], t, t);
      if (!fresh) it->second.second = t;
    }
    contiguous = runs == span.size();
    for (int64_t tile = 0; tile < padded / kTile; ++tile) {
      const int32_t first = segments[tile * kTile];
      bool same = first != 0;
      for (int64_t t = tile * kTile; t < (tile + 1) * kTile; ++t) {
        same &= segments[t] == first;
        if (segments[t] == 0) continue;
        const auto& [begin, end] = span.at(segments[t]);
        segment_begin[t] = begin;
        segment_end[t] = end + 1;
        first_key_tile[tile] = std::min(first_key_tile[tile], begin / kTile);
        query_end[tile] = std::max(query_end[tile], end + 1);
      }
      uniform[tile] = same ? first : -1;
    }
  }
};

// Where the visible entries of the tile at query rows q0.. and keys k0.. can be: query
// q0 + r sees at most keys k0 + [keys_begin[r], keys_end[r]), and key k0 + c is seen by at
// most queries q0 + [queries_begin[c], queries_end[c]) (begin = end: none). A query sees
// keys from its segment's first position to itself, so the ranges are contiguous and
// everything outside them is masked; the tile products skip it. (Exact for contiguous
// segments, a bound otherwise; `Mask` decides each entry.)
struct TileView {
  int32_t keys_begin[kTile], keys_end[kTile], queries_begin[kTile], queries_end[kTile];

  TileView(const RowTiles& row, int64_t q0, int64_t k0) {
    for (int64_t i = 0; i < kTile; ++i) {
      const int64_t query = q0 + i, key = k0 + i;
      keys_begin[i] = keys_end[i] = queries_begin[i] = queries_end[i] = 0;
      if (row.segments[query] != 0) {
        const int64_t begin = std::max(row.segment_begin[query], k0), end = std::min(query + 1, k0 + kTile);
        if (begin < end) keys_begin[i] = begin - k0, keys_end[i] = end - k0;
      }
      if (row.segments[key] != 0) {
        const int64_t begin = std::max(key, q0), end = std::min(row.segment_end[key], q0 + kTile);
        if (begin < end) queries_begin[i] = begin - q0, queries_end[i] = end - q0;
      }
    }
  }
};

// Masks the scores of the tile at query rows q0.. and keys k0..: causal, and a query sees
// only keys of its own real segment. Tiles below the diagonal whose queries and keys all lie
// in one segment need none of it. Where the row's segments are contiguous, `view`'s ranges
// are exact and the entries outside them are the masked ones; otherwise each entry is checked.
void Mask(float* s, int64_t q0, int64_t k0, const RowTiles& row, const TileView& view) {
  const int32_t keys = row.uniform[k0 / kTile];
  if (k0 < q0 && keys > 0 && keys == row.uniform[q0 / kTile]) return;
  const int32_t* seg = row.segments.data();
  for (int64_t r = 0; r < kTile; ++r) {
    float* sr = s + r * kTile;
    if (row.contiguous) {
      std::fill(sr, sr + view.keys_begin[r], kMasked);
      std::fill(sr + view.keys_end[r], sr + kTile, kMasked);
      continue;
    }
    const int32_t query = seg[q0 + r];
    for (int64_t c = 0; c < kTile; ++c) {
      if (query == 0 || k0 + c > q0 + r || seg[k0 + c] != query) sr[c] = kMasked;
    }
  }
}

// Whether vector j of a tile row (columns kLanes j ..) holds any column of [begin, end).
inline bool Overlaps(int64_t j, int32_t begin, int32_t end) { return kLanes * j < end && begin < kLanes * (j + 1); }

// One tile row's softmax weights in place: row[c] = exp(row[c] - shift) on the vectors that
// overlap the row's visible keys [begin, end), exactly 0 on the others and at masked
// entries. shift is the row's running max in the forward (every difference <= 0) and its
// log-sum-exp in the backward, where rounding can leave a score a hair above it: there
// (kClamp) the difference is capped at 0. (The cap in the forward too cost it 1-5%.)
template <bool kClamp>
__attribute__((always_inline)) inline void ExpTileRow(float* row, int32_t begin, int32_t end, float shift) {
  for (int64_t j = 0; j < kTileVecs; ++j) {
    float* at = row + kLanes * j;
    if (!Overlaps(j, begin, end)) {
      Store(at, Vec{});
      continue;
    }
    const Vec x = Load(at);
    Vec shifted = x - Splat(shift);
    if constexpr (kClamp) shifted = Vec{} < shifted ? Vec{} : shifted;  // std::min(shifted, 0)
    Store(at, x <= Splat(kMasked) ? Vec{} : ExpNonPositive(shifted));
  }
}

struct Buffers {
  const float *q, *k, *v, *out, *lse, *d_out;
  const int32_t* segments;
  float *out_w, *lse_w, *dq, *dk, *dv;
};

// Row b's end: one past its last real token (0 if it has none). Queries from there on are
// padding and see nothing, so they are skipped.
int64_t RowEnd(const Dims& d, const int32_t* segments, int64_t b) {
  for (int64_t t = d.length; t > 0; --t) {
    if (segments[b * d.length + t - 1]) return t;
  }
  return 0;
}

// A unit's keys and values copied out of the [B, T, Hkv, D] inputs into padded rows, the
// keys also transposed (and the values, for the backward's dO V^T), with the row's segments.
template <int DV>
struct UnitKeys {
  RowTiles row;
  std::vector<float> k, kt, v, vt;

  UnitKeys(const Dims& d, const Buffers& io, int64_t b, int64_t kh, bool transposed_values)
      : row(io.segments + b * d.length, d.length, d.padded), k(d.padded * d.dim), kt(d.dim * d.padded), v(d.padded * d.dim) {
    Gather<DV>(io.k, d.kv_heads, d, b, kh, k.data());
    TransposeTiles(k.data(), d.padded, d.dim, kt.data());
    Gather<DV>(io.v, d.kv_heads, d, b, kh, v.data());
    if (transposed_values) {
      vt.resize(d.dim * d.padded);
      TransposeTiles(v.data(), d.padded, d.dim, vt.data());
    }
  }
};

// end: the row's `RowEnd`; queries from there on are padding and get output 0.
template <int DV>
void ForwardUnit(const Dims& d, const Buffers& io, int64_t b, int64_t kh, int64_t end) {
  constexpr int64_t D = 16 * DV;
  const int64_t T = end, T64 = d.padded;
  const UnitKeys<DV> keys(d, io, b, kh, /*transposed_values=*/false);
  const std::vector<float>&kt = keys.kt, &v = keys.v;
  std::vector<float> q(T64 * D), o(T64 * D), s(kTile * kTile), m(kTile), l(kTile);
  for (int64_t g = 0; g < d.group(); ++g) {
    const int64_t h = kh * d.group() + g;
    Gather<DV>(io.q, d.q_heads, d, b, h, q.data());
    std::fill(o.begin(), o.end(), 0.0f);
    for (int64_t q0 = 0; q0 < T; q0 += kTile) {
      std::fill(m.begin(), m.end(), kMasked);
      std::fill(l.begin(), l.end(), 0.0f);
      float* oq = o.data() + q0 * D;
      for (int64_t k0 = keys.row.first_key_tile[q0 / kTile] * kTile; k0 <= q0; k0 += kTile) {
        const TileView view(keys.row, q0, k0);
        TileScores<DV>(q.data() + q0 * D, kt.data() + k0 * D, view.keys_begin, view.keys_end, s.data());
        Mask(s.data(), q0, k0, keys.row, view);
        for (int64_t r = 0; r < kTile; ++r) {
          float* sr = s.data() + r * kTile;
          if (view.keys_begin[r] == view.keys_end[r]) {  // sees no key here: its m, l and output stay
            std::fill(sr, sr + kTile, 0.0f);
            continue;
          }
          const float peak = RowMax(sr, m[r]);
          ExpTileRow</*kClamp=*/false>(sr, view.keys_begin[r], view.keys_end[r], peak);
          float total = 0.0f;
#pragma omp simd reduction(+ : total)
          for (int64_t c = 0; c < kTile; ++c) total += sr[c];
          const float correction = ExpNonPositive(m[r] - peak);
          l[r] = l[r] * correction + total;
          m[r] = peak;
          float* orow = oq + r * D;
          for (int64_t e = 0; e < D; ++e) orow[e] *= correction;
        }
        TileApply<DV, false>(s.data(), v.data() + k0 * D, view.keys_begin, view.keys_end, oq);
      }
      for (int64_t r = 0; r < kTile && q0 + r < T; ++r) {
        const bool seen = l[r] > 0.0f;
        const float inverse = seen ? 1.0f / l[r] : 0.0f;
        for (int64_t e = 0; e < D; ++e) oq[r * D + e] *= inverse;
        io.lse_w[(b * d.q_heads + h) * d.length + q0 + r] = seen ? m[r] + std::log(l[r]) : kMasked;
      }
    }
    std::fill(io.lse_w + (b * d.q_heads + h) * d.length + T, io.lse_w + (b * d.q_heads + h + 1) * d.length, kMasked);
    Scatter<DV>(o.data(), d.q_heads, d, b, h, io.out_w);
  }
}

// end: the row's `RowEnd`; queries from there on are padding and get no gradient.
template <int DV>
void BackwardUnit(const Dims& d, const Buffers& io, int64_t b, int64_t kh, int64_t end) {
  constexpr int64_t D = 16 * DV;
  const int64_t T = end, T64 = d.padded;
  const UnitKeys<DV> keys(d, io, b, kh, /*transposed_values=*/true);
  const std::vector<float>&k = keys.k, &kt = keys.kt, &vt = keys.vt;
  std::vector<float> q(T64 * D), o(T64 * D), dout(T64 * D), dq(T64 * D);
  std::vector<float> dk(T64 * D, 0.0f), dv(T64 * D, 0.0f), delta(T64), lse(T64), p(kTile * kTile), dp(kTile * kTile);
  for (int64_t g = 0; g < d.group(); ++g) {
    const int64_t h = kh * d.group() + g;
    Gather<DV>(io.q, d.q_heads, d, b, h, q.data());
    Gather<DV>(io.out, d.q_heads, d, b, h, o.data());
    Gather<DV>(io.d_out, d.q_heads, d, b, h, dout.data());
    std::copy(io.lse + (b * d.q_heads + h) * d.length, io.lse + (b * d.q_heads + h) * d.length + T, lse.begin());
    for (int64_t t = 0; t < T64; ++t) {
      float acc = 0.0f;
      for (int64_t e = 0; e < D; ++e) acc += dout[t * D + e] * o[t * D + e];
      delta[t] = acc;
    }
    std::fill(dq.begin(), dq.end(), 0.0f);
    for (int64_t k0 = 0; k0 < T; k0 += kTile) {
      const int64_t q_end = std::min(T, keys.row.query_end[k0 / kTile]);
      for (int64_t q0 = k0; q0 < q_end; q0 += kTile) {
        if (keys.row.first_key_tile[q0 / kTile] > k0 / kTile) continue;  // its queries' segments start later
        // P = exp(S - lse), masked entries exactly 0.
        const TileView view(keys.row, q0, k0);
        TileScores<DV>(q.data() + q0 * D, kt.data() + k0 * D, view.keys_begin, view.keys_end, p.data());
        Mask(p.data(), q0, k0, keys.row, view);
        for (int64_t r = 0; r < kTile; ++r)  // padding rows read lse 0 and are masked
          ExpTileRow</*kClamp=*/true>(p.data() + r * kTile, view.keys_begin[r], view.keys_end[r], lse[q0 + r]);
        TileApply<DV, true>(p.data(), dout.data() + q0 * D, view.queries_begin, view.queries_end,
                            dv.data() + k0 * D);  // dV += P^T dO
        TileScores<DV>(dout.data() + q0 * D, vt.data() + k0 * D, view.keys_begin, view.keys_end,
                       dp.data());  // dP = dO V^T
        for (int64_t r = 0; r < kTile; ++r) {
          float* pr = p.data() + r * kTile;
          const float* dpr = dp.data() + r * kTile;
          const float dr = delta[q0 + r];
#pragma omp simd
          for (int64_t c = 0; c < kTile; ++c) pr[c] = pr[c] * (dpr[c] - dr);  // dS, in place of P
        }
        TileApply<DV, false>(p.data(), k.data() + k0 * D, view.keys_begin, view.keys_end,
                             dq.data() + q0 * D);  // dQ += dS K
        TileApply<DV, true>(p.data(), q.data() + q0 * D, view.queries_begin, view.queries_end,
                            dk.data() + k0 * D);  // dK += dS^T Q
      }
    }
    Scatter<DV>(dq.data(), d.q_heads, d, b, h, io.dq);
  }
  Scatter<DV>(dk.data(), d.kv_heads, d, b, kh, io.dk);
  Scatter<DV>(dv.data(), d.kv_heads, d, b, kh, io.dv);
}

// Runs Unit<DV>(d, io, b, kh, end of row b) over every (b, kh) for the DV of d.dim, the rows
// with the most work (the latest end) first, so a long row is not left to one thread at the end.
template <typename Forward>
ffi::Error RunUnits(ffi::ThreadPool& pool, const Dims& d, const Buffers& io, Forward) {
  std::vector<int64_t> ends(d.batch), order(d.batch * d.kv_heads);
  for (int64_t b = 0; b < d.batch; ++b) ends[b] = RowEnd(d, io.segments, b);
  for (int64_t unit = 0; unit < d.batch * d.kv_heads; ++unit) order[unit] = unit;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return ends[x / d.kv_heads] > ends[y / d.kv_heads]; });
  auto run = [&](auto unit_fn) {
    sgs_native::ParallelFor(pool, d.batch * d.kv_heads, [&d, io, unit_fn, order, ends](int64_t unit) {
      const int64_t b = order[unit] / d.kv_heads;
      unit_fn(d, io, b, order[unit] % d.kv_heads, ends[b]);
    });
    return ffi::Error::Success();
  };
  switch (d.dim / 16) {
    case 1: return run(Forward::template Unit<1>);
    case 2: return run(Forward::template Unit<2>);
    case 3: return run(Forward::template Unit<3>);
    case 4: return run(Forward::template Unit<4>);
    case 5: return run(Forward::template Unit<5>);
    case 6: return run(Forward::template Unit<6>);
    case 7: return run(Forward::template Unit<7>);
    case 8: return run(Forward::template Unit<8>);
    default: return ffi::Error::InvalidArgument("flash attention: head dim must be a multiple of 16, at most 128");
  }
}

struct ForwardKind {
  template <int DV>
  static void Unit(const Dims& d, const Buffers& io, int64_t b, int64_t kh, int64_t end) { ForwardUnit<DV>(d, io, b, kh, end); }
};
struct BackwardKind {
  template <int DV>
  static void Unit(const Dims& d, const Buffers& io, int64_t b, int64_t kh, int64_t end) { BackwardUnit<DV>(d, io, b, kh, end); }
};

ffi::Error DimsOf(ffi::Buffer<ffi::F32>& q, ffi::Buffer<ffi::F32>& k, ffi::Buffer<ffi::S32>& segments, Dims* d) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  auto vd = segments.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 2 || kd[0] != qd[0] || kd[1] != qd[1] || kd[3] != qd[3] ||
      qd[2] % kd[2] != 0 || vd[0] != qd[0] || vd[1] != qd[1] || qd[3] % 16 != 0 || qd[3] > 128) {
    return ffi::Error::InvalidArgument(
        "flash attention: expected q [B, T, Hq, D], k/v [B, T, Hkv, D], segments [B, T], D a multiple of 16 up to 128");
  }
  *d = Dims{qd[0], qd[1], qd[2], kd[2], qd[3], (qd[1] + kTile - 1) / kTile * kTile};
  return ffi::Error::Success();
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                       ffi::Buffer<ffi::S32> segments, ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse) {
  Dims d;
  if (auto error = DimsOf(q, k, segments, &d); error.failure()) return error;
  Buffers io{q.typed_data(), k.typed_data(), v.typed_data(), nullptr, nullptr, nullptr, segments.typed_data(),
             out->typed_data(), lse->typed_data(), nullptr, nullptr, nullptr};
  return RunUnits(pool, d, io, ForwardKind{});
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                        ffi::Buffer<ffi::S32> segments, ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> lse,
                        ffi::Buffer<ffi::F32> d_out, ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                        ffi::ResultBuffer<ffi::F32> dv) {
  Dims d;
  if (auto error = DimsOf(q, k, segments, &d); error.failure()) return error;
  Buffers io{q.typed_data(), k.typed_data(), v.typed_data(), out.typed_data(), lse.typed_data(), d_out.typed_data(),
             segments.typed_data(), nullptr, nullptr, dq->typed_data(), dk->typed_data(), dv->typed_data()};
  return RunUnits(pool, d, io, BackwardKind{});
}

// The operands both calls start with: the thread pool, q (scaled), k, v, segments.
auto BindInputs() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::S32>>();
}

using F32 = ffi::Buffer<ffi::F32>;

}  // namespace

// -> out, lse
XLA_FFI_DEFINE_HANDLER_SYMBOL(SgsFlashAttentionForward, ForwardImpl, BindInputs().Ret<F32>().Ret<F32>());

// (out, lse, d_out) -> dq, dk, dv
XLA_FFI_DEFINE_HANDLER_SYMBOL(SgsFlashAttentionBackward, BackwardImpl,
                              BindInputs().Arg<F32>().Arg<F32>().Arg<F32>().Ret<F32>().Ret<F32>().Ret<F32>());
