// Large blocks kept mapped for reuse: loaded with LD_PRELOAD (parallel/host_memory.py,
// SGS_HOST_MALLOC=keep), it takes over the malloc family for blocks over 32 MiB and leaves
// every smaller one to glibc.
//
// Why: XLA:CPU allocates each program call's temporaries as one block (100 MB and more for a
// training step) and frees it when the call ends. glibc maps a block that large afresh and
// unmaps it on free, so every call faults its scratch in again, 4 KiB at a time, each page
// zeroed by the kernel. Here a freed large block stays mapped and the next request of a
// similar size (the block at most twice the request) gets it back, already faulted in.
// Blocks up to 32 MiB stay glibc's: its mmap threshold adapts up to that size (after a
// mapped block is freed, blocks that large come from the heap, already faulted in), and
// taking them over instead faulted in every block of a growing tensor afresh (PyTorch's
// generate ran 0.65x as fast). Over 32 MiB glibc always maps afresh; that is what this
// library keeps.
//
// Idle blocks are kept up to a quarter of physical memory (the largest unmapped first
// beyond that). Thread-safe (one mutex, taken only on large requests and on frees of
// page-aligned pointers) and fork-safe (the mutex is held across fork).
#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

extern "C" {
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {

constexpr size_t kLargeBlock = (size_t{32} << 20) + 1;  // over glibc's largest mmap threshold
constexpr size_t kPage = 4096;
constexpr int kSlots = 64;

struct Block {
  void* start;
  size_t bytes;  // mapped length, whole pages
  bool in_use;
};

Block blocks[kSlots];
size_t idle_bytes = 0;
size_t idle_cap = 0;  // set on load
// Counters for tests and diagnostics (sgs_large_blocks_stats).
size_t reused = 0, mapped = 0, unmapped = 0;
pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;

bool page_aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & (kPage - 1)) == 0; }

int find(const void* p) {
  for (int i = 0; i < kSlots; ++i)
    if (blocks[i].start == p) return i;
  return -1;
}

void unmap(int i) {  // mutex held; blocks[i] idle
  munmap(blocks[i].start, blocks[i].bytes);
  idle_bytes -= blocks[i].bytes;
  blocks[i] = Block{nullptr, 0, false};
  ++unmapped;
}

int largest_idle() {
  int best = -1;
  for (int i = 0; i < kSlots; ++i)
    if (blocks[i].start && !blocks[i].in_use && (best < 0 || blocks[i].bytes > blocks[best].bytes)) best = i;
  return best;
}

// A large block of at least n bytes (page-aligned), or nullptr to fall back to glibc;
// *was_kept (if given) says whether it was kept from before (else freshly mapped: zeroed).
void* take(size_t n, bool* was_kept = nullptr) {
  const size_t bytes = (n + kPage - 1) & ~(kPage - 1);
  pthread_mutex_lock(&mutex);
  int best = -1;
  for (int i = 0; i < kSlots; ++i) {
    const Block& b = blocks[i];
    if (b.start && !b.in_use && b.bytes >= bytes && b.bytes / 2 <= bytes && (best < 0 || b.bytes < blocks[best].bytes)) best = i;
  }
  if (best >= 0) {
    blocks[best].in_use = true;
    idle_bytes -= blocks[best].bytes;
    ++reused;
    if (was_kept) *was_kept = true;
    void* p = blocks[best].start;
    pthread_mutex_unlock(&mutex);
    return p;
  }
  if (was_kept) *was_kept = false;
  int slot = find(nullptr);
  if (slot < 0 && (slot = largest_idle()) >= 0) unmap(slot);
  if (slot >= 0) blocks[slot] = Block{reinterpret_cast<void*>(1), 0, true};  // reserved while mapping
  pthread_mutex_unlock(&mutex);
  if (slot < 0) return nullptr;  // every slot in use: glibc serves it
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  pthread_mutex_lock(&mutex);
  if (p == MAP_FAILED) {
    blocks[slot] = Block{nullptr, 0, false};
    p = nullptr;
  } else {
    blocks[slot] = Block{p, bytes, true};
    ++mapped;
  }
  pthread_mutex_unlock(&mutex);
  return p;
}

// True if p is one of ours (now idle, or unmapped beyond the cap); false: glibc's.
bool give_back(void* p) {
  if (p == nullptr || !page_aligned(p)) return false;
  pthread_mutex_lock(&mutex);
  const int i = find(p);
  if (i >= 0) {
    blocks[i].in_use = false;
    idle_bytes += blocks[i].bytes;
    while (idle_bytes > idle_cap) unmap(largest_idle());
  }
  pthread_mutex_unlock(&mutex);
  return i >= 0;
}

size_t block_bytes(const void* p) {  // 0 if not ours
  if (p == nullptr || !page_aligned(p)) return 0;
  pthread_mutex_lock(&mutex);
  const int i = find(p);
  const size_t bytes = i >= 0 ? blocks[i].bytes : 0;
  pthread_mutex_unlock(&mutex);
  return bytes;
}

__attribute__((constructor)) void on_load() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  idle_cap = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) / 4 : size_t{1} << 30;
  pthread_atfork([] { pthread_mutex_lock(&mutex); }, [] { pthread_mutex_unlock(&mutex); },
                 [] { pthread_mutex_unlock(&mutex); });
}

}  // namespace

extern "C" {

void* malloc(size_t n) noexcept {
  if (n >= kLargeBlock)
    if (void* p = take(n)) return p;
  return __libc_malloc(n);
}

void free(void* p) noexcept {
  if (!give_back(p)) __libc_free(p);
}

void* calloc(size_t count, size_t size) noexcept {
  if (size != 0 && count > SIZE_MAX / size) {
    errno = ENOMEM;
    return nullptr;
  }
  const size_t n = count * size;
  bool was_kept = false;
  if (n >= kLargeBlock)
    if (void* p = take(n, &was_kept)) return was_kept ? std::memset(p, 0, n) : p;  // a kept block holds old data
  return __libc_calloc(count, size);
}

void* realloc(void* p, size_t n) noexcept {
  const size_t old = block_bytes(p);
  if (old == 0) return __libc_realloc(p, n);
  void* q = malloc(n);
  if (q == nullptr) return nullptr;
  std::memcpy(q, p, old < n ? old : n);
  free(p);
  return q;
}

void* memalign(size_t alignment, size_t n) noexcept {
  if (n >= kLargeBlock && alignment <= kPage)
    if (void* p = take(n)) return p;
  return __libc_memalign(alignment, n);
}

void* aligned_alloc(size_t alignment, size_t n) noexcept { return memalign(alignment, n); }

int posix_memalign(void** out, size_t alignment, size_t n) noexcept {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = memalign(alignment, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

// glibc's would read a chunk header our blocks do not have.
size_t malloc_usable_size(void* p) noexcept {
  if (const size_t bytes = block_bytes(p)) return bytes;
  using Fn = size_t (*)(void*);
  static Fn glibc = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "malloc_usable_size"));
  return glibc != nullptr ? glibc(p) : 0;
}

// Counters since load: {blocks reused, mapped, unmapped, idle bytes}.
void sgs_large_blocks_stats(size_t out[4]) {
  pthread_mutex_lock(&mutex);
  out[0] = reused;
  out[1] = mapped;
  out[2] = unmapped;
  out[3] = idle_bytes;
  pthread_mutex_unlock(&mutex);
}

}  // extern "C"
