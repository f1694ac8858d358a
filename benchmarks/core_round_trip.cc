// How far apart the process's first two CPUs are: the round trip of one cache line
// between two threads, each pinned to one of them (built on first use by
// `timing.core_round_trip_ns`, through sgs_jax.native_build).
//
// On a virtual machine the hypervisor can place two vCPUs on cores that share a
// last-level cache or on cores that do not (another AMD CCX or die), and move them while
// the guest runs. A line handed between threads costs several times more in the second
// case, and so does every operation whose output one thread writes and the other reads
// next (docs/training_benchmark.md, "The two speeds are the host's core placement").

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace {

bool Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// The first two CPUs this process may run on; false when it may run on fewer.
bool FirstTwoCpus(int* first, int* second) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
  int found = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && found < 2; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) (found++ == 0 ? *first : *second) = cpu;
  }
  return found == 2;
}

}  // namespace

// Nanoseconds per round trip (this thread sets the line, the other clears it), the least
// over `batches` batches of `iterations` round trips (a thread of another process spinning
// on either CPU slows a batch, not the placement). The calling thread's affinity is
// restored afterwards. Returns -1 when the process may run on fewer than two CPUs or a
// thread cannot be pinned.
extern "C" double sgs_core_round_trip_ns(int iterations, int batches) {
  int first = 0, second = 0;
  if (iterations <= 0 || batches <= 0 || !FirstTwoCpus(&first, &second)) return -1;
  cpu_set_t saved;
  if (pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) != 0) return -1;
  alignas(64) std::atomic<int> line{0};
  std::atomic<bool> pinned{true};
  double best = -1;
  if (Pin(first)) {
    std::thread other([&] {
      if (!Pin(second)) pinned = false;
      for (long i = 0, total = long(iterations) * batches; i < total; ++i) {
        while (line.load(std::memory_order_acquire) != 1) {
        }
        line.store(0, std::memory_order_release);
      }
    });
    for (int batch = 0; batch < batches; ++batch) {
      auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) {
        line.store(1, std::memory_order_release);
        while (line.load(std::memory_order_acquire) != 0) {
        }
      }
      double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / iterations;
      best = batch == 0 ? ns : std::min(best, ns);
    }
    other.join();
  }
  pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  return pinned ? best : -1;
}
