// Huge-page-backed buffers (buffer.h).
#include "refit/kernels/buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace refit::kernels {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUpToHugePage(size_t bytes) { return (bytes + kHugePage - 1) & ~(kHugePage - 1); }

}  // namespace

void* AllocateHugeBuffer(size_t bytes) {
  const size_t size = RoundUpToHugePage(bytes);
  // Over-map by one huge page and trim both ends: the kernel aligns a mapping to 4 KiB only.
  void* raw =
      ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t tail = aligned + size;
  const uintptr_t end = start + size + kHugePage;
  if (end > tail) ::munmap(reinterpret_cast<void*>(tail), end - tail);
#ifdef MADV_HUGEPAGE
  // Advice only: a kernel without transparent huge pages leaves 4 KiB pages, which still work.
  ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<void*>(aligned);
}

void FreeHugeBuffer(void* p, size_t bytes) noexcept {
  if (p != nullptr) ::munmap(p, RoundUpToHugePage(bytes));
}

void* MapGrowableBuffer(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

void* GrowMappedBuffer(void* p, size_t old_bytes, size_t new_bytes) {
  void* grown = ::mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE);
  if (grown == MAP_FAILED) throw std::bad_alloc();
  return grown;
}

void UnmapGrowableBuffer(void* p, size_t bytes) noexcept {
  if (p != nullptr) ::munmap(p, bytes);
}

namespace {

// Kept buffers and the mapped size of every reused buffer in use (a kept buffer larger than a
// request is handed out whole, and the allocator frees by the size it asked for).
struct ReuseCache {
  std::mutex mu;
  std::vector<std::pair<void*, size_t>> kept;
  size_t kept_bytes = 0;
  std::unordered_map<void*, size_t> in_use;
};

ReuseCache& Cache() {
  static ReuseCache* cache = new ReuseCache();  // never destroyed: buffers may outlive statics
  return *cache;
}

}  // namespace

void* AllocateReusedBuffer(size_t bytes) {
  const size_t size = RoundUpToHugePage(bytes);
  ReuseCache& c = Cache();
  {
    std::lock_guard<std::mutex> lk(c.mu);
    auto best = c.kept.end();
    for (auto it = c.kept.begin(); it != c.kept.end(); ++it) {
      if (it->second >= size && it->second <= size + size / 4 &&
          (best == c.kept.end() || it->second < best->second)) {
        best = it;
      }
    }
    if (best != c.kept.end()) {
      const auto [p, mapped] = *best;
      c.kept.erase(best);
      c.kept_bytes -= mapped;
      c.in_use[p] = mapped;
      return p;
    }
  }
  void* p = AllocateHugeBuffer(size);
  try {
    std::lock_guard<std::mutex> lk(c.mu);
    c.in_use[p] = size;
  } catch (...) {
    FreeHugeBuffer(p, size);
    throw;
  }
  return p;
}

void ReleaseReusedBuffer(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  ReuseCache& c = Cache();
  size_t mapped = RoundUpToHugePage(bytes);
  {
    std::lock_guard<std::mutex> lk(c.mu);
    auto it = c.in_use.find(p);
    if (it != c.in_use.end()) {
      mapped = it->second;
      c.in_use.erase(it);
    }
    if (c.kept_bytes + mapped <= kReusedBufferCacheBytes) {
      try {
        c.kept.emplace_back(p, mapped);
        c.kept_bytes += mapped;
        return;
      } catch (...) {  // no room for the entry: unmapped below
      }
    }
  }
  FreeHugeBuffer(p, mapped);
}

size_t ReusedBufferCacheBytes() noexcept {
  ReuseCache& c = Cache();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.kept_bytes;
}

void AdviseHugePages(void* p, size_t bytes) noexcept {
#ifdef MADV_HUGEPAGE
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  const uintptr_t end = (start + bytes) & ~(uintptr_t{kHugePage} - 1);
  if (end > first) ::madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

bool PopulateForWrite(void* p, size_t bytes) noexcept {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older headers lack it
#endif
  static const auto kPage = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (start + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (start + bytes) & ~(kPage - 1);
  if (end <= first) return true;
  return ::madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE) == 0;
}

}  // namespace refit::kernels
