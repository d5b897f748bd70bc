// Scratch vectors without zero-fill, large ones backed by transparent huge pages.
//
// std::vector<T>::resize value-initializes (zeroes) every new element: one extra write pass over
// scratch that is always overwritten before it is read (positions, encode buffers). With this
// allocator resize default-initializes instead, which for trivial types leaves the bytes as they
// are; everything else (growth, copies, data()) is std::vector's.
//
// A buffer of kHugeBufferBytes or more is mapped on its own, 2 MiB aligned, and advised for
// transparent huge pages: a fresh buffer then costs one page fault per 2 MiB instead of one per
// 4 KiB. Refit's buffers are mostly fresh (a process per version, a payload per bucket), and
// where page faults are dear (a guest under shadow paging: ~10 us a 4 KiB page) the faults, not
// the copies, were the cost of a large buffer (docs/benchmarks.md, "Huge pages").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace refit::kernels {

// Buffers at least this large are mapped on their own and advised for huge pages.
inline constexpr size_t kHugeBufferBytes = size_t{2} << 20;

// `bytes` (>= kHugeBufferBytes) of fresh, uninitialized memory, 2 MiB aligned, advised for
// transparent huge pages (where the kernel offers them). Throws std::bad_alloc when out of memory.
void* AllocateHugeBuffer(size_t bytes);
// Releases what AllocateHugeBuffer(bytes) returned.
void FreeHugeBuffer(void* p, size_t bytes) noexcept;
// Advises the whole 2 MiB pages inside [p, p + bytes) of memory allocated elsewhere (a
// std::vector's reserved capacity) for transparent huge pages, before it is first written.
void AdviseHugePages(void* p, size_t bytes) noexcept;
// Maps the whole pages inside [p, p + bytes) writable now (MADV_POPULATE_WRITE, Linux 5.14),
// without touching their contents: threads populating their own parts of a large buffer fault it
// in in parallel, where a first write from one thread would fault it page by page. False where the
// kernel refuses (the pages then fault when first written, as before).
bool PopulateForWrite(void* p, size_t bytes) noexcept;

// Anonymous memory mapped on its own (page aligned, uninitialized) that grows without copying:
// GrowMappedBuffer moves its pages to a larger mapping (mremap) instead of copying them into
// fresh ones, so a buffer appended to at an unknown pace (a redo log's staged entries) faults in
// each page once, where doubling a heap buffer writes its whole content again into fresh pages on
// every growth. Both throw std::bad_alloc when out of memory.
void* MapGrowableBuffer(size_t bytes);
// Keeps the first `old_bytes` of p's content; p is no longer valid (the result may differ).
void* GrowMappedBuffer(void* p, size_t old_bytes, size_t new_bytes);
void UnmapGrowableBuffer(void* p, size_t bytes) noexcept;

// Buffers that come and go at a steady pace (a transport's message bodies: a bucket each) are
// kept for reuse when freed, up to kReusedBufferCacheBytes in the process: the kernel zeroes
// every fresh page on its first touch, and on a full sync that zeroing cost more than the
// copies into the buffers (docs/benchmarks.md, "Full sync over ucx"). A kept buffer holds the
// bytes of its last use: callers must overwrite what they read (no zeroing either way).
inline constexpr size_t kReusedBufferCacheBytes = size_t{256} << 20;
// `bytes` (>= kHugeBufferBytes) of uninitialized memory: a kept buffer of at least that size
// (and at most a quarter more) when there is one, else AllocateHugeBuffer's.
void* AllocateReusedBuffer(size_t bytes);
// Releases what AllocateReusedBuffer(bytes) returned: kept while the cache has room, else unmapped.
void ReleaseReusedBuffer(void* p, size_t bytes) noexcept;
// Bytes the cache holds now (for tests).
size_t ReusedBufferCacheBytes() noexcept;

// Grows v's capacity to at least n elements; capacity it allocates is advised for huge pages.
template <typename Vector>
void ReserveWithHugePages(Vector& v, size_t n) {
  if (v.capacity() >= n) return;
  v.reserve(n);
  AdviseHugePages(v.data(), v.capacity() * sizeof(typename Vector::value_type));
}

// Resizes scratch whose contents are about to be overwritten: a growth allocates and copies
// nothing (std::vector would copy the old bytes one at a time into the new storage, since a custom
// allocator's construct is called per element).
template <typename Vector>
void ResizeDiscarding(Vector& v, size_t n) {
  if (v.capacity() < n) v.clear();
  v.resize(n);
}

// std::allocator whose construct default-initializes, and whose buffers of kHugeBufferBytes or
// more are AllocateHugeBuffer's (kReuse: AllocateReusedBuffer's, kept for reuse when freed).
template <typename T, bool kReuse>
class ScratchAllocator : public std::allocator<T> {
 public:
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = ScratchAllocator<U, kReuse>;
  };
  ScratchAllocator() noexcept = default;
  template <typename U>
  ScratchAllocator(const ScratchAllocator<U, kReuse>& /*other*/) noexcept {}  // NOLINT

  T* allocate(size_t n) {
    if (n < kHugeBufferBytes / sizeof(T)) return std::allocator<T>::allocate(n);
    if constexpr (kReuse) return static_cast<T*>(AllocateReusedBuffer(n * sizeof(T)));
    return static_cast<T*>(AllocateHugeBuffer(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n < kHugeBufferBytes / sizeof(T)) return std::allocator<T>::deallocate(p, n);
    if constexpr (kReuse) return ReleaseReusedBuffer(p, n * sizeof(T));
    FreeHugeBuffer(p, n * sizeof(T));
  }

  // resize(n) / vector(n): default-initialize (no zeroing for trivial types).
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using DefaultInitAllocator = ScratchAllocator<T, false>;
template <typename T>
using ReusingAllocator = ScratchAllocator<T, true>;

// A vector of trivially copyable scratch whose resize does not zero the new elements.
template <typename T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;
// An UninitVector whose large buffers are reused (message bodies, payloads).
template <typename T>
using ReusedVector = std::vector<T, ReusingAllocator<T>>;

// Positions of changed elements, as DiffPositionsAndDigest writes them.
using PositionList = UninitVector<uint64_t>;
// Bits of changed elements packed in position order (elem_size bytes each).
using ValueList = UninitVector<uint8_t>;

}  // namespace refit::kernels
