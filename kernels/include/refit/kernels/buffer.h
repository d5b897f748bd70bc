// Scratch vectors without zero-fill.
//
// std::vector<T>::resize value-initializes (zeroes) every new element: one extra write pass over
// scratch that is always overwritten before it is read (positions, encode buffers). With this
// allocator resize default-initializes instead, which for trivial types leaves the bytes as they
// are; everything else (growth, copies, data()) is std::vector's.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace refit::kernels {

template <typename T>
class DefaultInitAllocator : public std::allocator<T> {
 public:
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() noexcept = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>& /*other*/) noexcept {}  // NOLINT

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

// A vector of trivially copyable scratch whose resize does not zero the new elements.
template <typename T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

// Positions of changed elements, as DiffPositionsAndDigest writes them.
using PositionList = UninitVector<uint64_t>;
// Bits of changed elements packed in position order (elem_size bytes each).
using ValueList = UninitVector<uint8_t>;

}  // namespace refit::kernels
