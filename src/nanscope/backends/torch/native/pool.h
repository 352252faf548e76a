#pragma once
// Memory for the recorder's own small objects, kept out of the heap that
// holds the program's tensors.
//
// Tensors below glibc's mmap threshold come from the training thread's heap.
// Small objects of ours allocated between them (map nodes, buffered events,
// kept for milliseconds to minutes) pin the heap's top and split its free
// space, so freed activations cannot be given back or reused for the next
// step's larger ones: the heap grows step after step (a Transformer step
// measured +100 MiB per step in use by nothing). A pool fed by mmap keeps
// them apart, as CPython's own small-object allocator does for Python objects.
#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <memory_resource>
#include <new>
#include <vector>

namespace nanscope {

class MmapResource final : public std::pmr::memory_resource {
  void* do_allocate(std::size_t bytes, std::size_t) override {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t) override { munmap(p, bytes); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }
};

// The process-wide pool (never destroyed: callbacks may run during exit). A forked
// child gets a new one (renew_pool): another thread of the parent may have held the
// old one's lock at the fork, and nothing in the child would ever release it.
inline std::pmr::memory_resource* make_pool() {
  auto* upstream = new MmapResource();
  std::pmr::pool_options options;
  options.largest_required_pool_block = 4096;
  return new std::pmr::synchronized_pool_resource(options, upstream);
}

inline std::atomic<std::pmr::memory_resource*>& pool_slot() {
  static std::atomic<std::pmr::memory_resource*> slot{make_pool()};
  return slot;
}

inline std::pmr::memory_resource* pool() { return pool_slot().load(std::memory_order_acquire); }

// In a forked child, before anything is allocated: what came from the old pool is left
// there (the child never frees it).
inline void renew_pool() { pool_slot().store(make_pool(), std::memory_order_release); }

template <typename T>
using pvec = std::pmr::vector<T>;

// Allocated from the pool: a base for small objects made per op.
struct Pooled {
  static void* operator new(std::size_t size) { return pool()->allocate(size, alignof(std::max_align_t)); }
  static void operator delete(void* p, std::size_t size) {
    pool()->deallocate(p, size, alignof(std::max_align_t));
  }
};

}  // namespace nanscope
