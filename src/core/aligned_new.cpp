// Every C++ heap allocation in caviar's programs starts on a 64-byte boundary.
//
// Why: Eigen picks, at run time, how much of a vectorised loop runs in scalar code before its
// first aligned packet, from the address of the data (reductions such as sum() and dot(), and
// the coefficient-based products it uses for small matrices, e.g. 3 x 10 times 10 x 6). The
// scalar and packet paths round differently (a tree of partial sums, fused multiply-adds), so on
// memory whose alignment is left to the allocator -- a std::vector's buffer is only 16-byte
// aligned, and where within a 64-byte line it starts changes with every earlier allocation, even
// with the lengths of strings holding wall-clock times -- the same data gave different last bits
// from run to run. Eigen's own matrices are already aligned to EIGEN_MAX_ALIGN_BYTES (64 with
// AVX-512); making every operator new do the same means any std::vector, std::string or
// container buffer that reaches Eigen is aligned too, and a view into it starts at an offset
// fixed by the problem's sizes. docs/reproducibility.md states the rule; the adversarial test
// tests/determinism/test_heap_layout.py enforces it.
//
// Every plain form of new and delete is replaced, as a set: new, new[] and their nothrow forms
// allocate with posix_memalign, and every plain delete frees with free. Replacing only some would
// pair one runtime's allocation with another's release (AddressSanitizer, which brings its own
// operator new, reports that as alloc-dealloc-mismatch). The over-aligned (align_val_t) forms are
// left to the runtime, which pairs them with its own deletes.
#include <cstdlib>
#include <new>

namespace {
constexpr std::size_t kHeapAlign = 64;
}

void* operator new(std::size_t size) {
  if (size == 0) size = 1;
  for (;;) {
    void* p = nullptr;
    if (posix_memalign(&p, kHeapAlign, size) == 0) return p;
    std::new_handler handler = std::get_new_handler();
    if (!handler) throw std::bad_alloc();
    handler();
  }
}

void* operator new[](std::size_t size) {
  return ::operator new(size);
}

void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(size);
  } catch (...) {
    return nullptr;
  }
}

void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return ::operator new(size, std::nothrow);
}

void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
