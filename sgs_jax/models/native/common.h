// Shared by the native XLA:CPU kernels: the vectorisable exponential and the work split
// over XLA's intra-op thread pool.
#ifndef SGS_JAX_NATIVE_COMMON_H_
#define SGS_JAX_NATIVE_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace sgs_native {

// x - n ln 2, with ln 2 in two parts (Cody-Waite) so the result keeps float precision.
// T: float, or a vector of floats (flash_attention.cc).
template <typename T>
inline T MinusNLn2(T x, T n) {
  return (x - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
}

// e^r for |r| <= ln 2 / 2 by its Taylor series to degree 7 (T as above).
template <typename T>
inline T ExpTaylor7(T r) {
  T poly = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
  poly = poly * r + 1.0f / 120.0f;
  poly = poly * r + 1.0f / 24.0f;
  poly = poly * r + 1.0f / 6.0f;
  poly = poly * r + 0.5f;
  poly = poly * r + 1.0f;
  return poly * r + 1.0f;
}

// e^x for x <= 0 (softmax weights) in a form the compiler vectorises: x = n ln 2 + r with
// |r| <= ln 2 / 2 (`MinusNLn2`), e^r by `ExpTaylor7`, times 2^n through the exponent bits:
// within 1e-7 relative of std::exp on [-87, 0]. Below -87 it returns e^-87 (about
// 1.6e-38); callers that need an exact 0 for masked entries select it.
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float poly = ExpTaylor7(MinusNLn2(x, n));
  int32_t bits;
  std::memcpy(&bits, &poly, sizeof(bits));
  bits += static_cast<int32_t>(n) * (1 << 23);
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Runs fn(unit) for unit in [0, units): units are claimed from a shared counter by the
// calling thread and by tasks scheduled on XLA's pool, and this returns once every claimed
// unit is finished. XLA may run a task late, on the caller's thread, or not in parallel: a
// task that starts after all units are claimed returns at once (it keeps the shared state
// alive, never the call's buffers), so nothing waits on a task that has not started.
template <typename Fn>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t units, Fn fn) {
  struct Shared {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> finished{0};
    int64_t units;
    Fn fn;
    Shared(int64_t u, Fn f) : units(u), fn(std::move(f)) {}
    void Run() {
      for (int64_t unit = next.fetch_add(1); unit < units; unit = next.fetch_add(1)) {
        fn(unit);
        finished.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto shared = std::make_shared<Shared>(units, std::move(fn));
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), units) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([shared] { shared->Run(); });
  shared->Run();
  while (shared->finished.load(std::memory_order_acquire) < units) std::this_thread::yield();
}

}  // namespace sgs_native

#endif  // SGS_JAX_NATIVE_COMMON_H_
