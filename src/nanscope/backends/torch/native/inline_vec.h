#pragma once
// A small vector of plain values (ids, device indices, summary rows) with room
// for N of them inline, for the recorder's Event: an event is built on the op's
// thread and moved once into the buffer, for every op. c10::SmallVector's move
// goes through its generic out-of-line assignment (several branches and calls
// a vector); here a move copies the inline values (a small array whole), or takes
// the heap block.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace nanscope {

template <typename T, uint32_t N>
class InlineVec {
  static_assert(std::is_trivially_copyable_v<T>, "plain values only");

 public:
  InlineVec() = default;
  InlineVec(const InlineVec&) = delete;
  InlineVec& operator=(const InlineVec&) = delete;
  InlineVec(InlineVec&& o) noexcept { take(o); }
  InlineVec& operator=(InlineVec&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  ~InlineVec() { release(); }

  T* data() { return cap_ > N ? heap_ : inline_; }
  const T* data() const { return cap_ > N ? heap_ : inline_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }

  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  void push_back(T v) {
    if (size_ == cap_) grow(2 * static_cast<size_t>(cap_));
    data()[size_++] = v;
  }
  void assign(size_t n, T v) {
    size_ = 0;
    reserve(n);
    T* p = data();
    for (size_t i = 0; i < n; ++i) p[i] = v;
    size_ = static_cast<uint32_t>(n);
  }
  void clear() { size_ = 0; }

 private:
  void take(InlineVec& o) {
    size_ = o.size_;
    cap_ = o.cap_;
    if (o.cap_ > N) {
      heap_ = o.heap_;
      o.cap_ = N;
    } else if constexpr (sizeof(inline_) <= 64) {
      // A cache line or less: copied whole, in a few fixed moves (no call, no loop).
      std::memcpy(inline_, o.inline_, sizeof(inline_));
    } else if (size_ > 0) {
      std::memcpy(inline_, o.inline_, size_ * sizeof(T));
    }
    o.size_ = 0;
  }
  void release() {
    if (cap_ > N) std::free(heap_);
    cap_ = N;
    size_ = 0;
  }
  void grow(size_t n) {
    T* p = static_cast<T*>(std::malloc(n * sizeof(T)));
    if (p == nullptr) throw std::bad_alloc();
    if (size_ > 0) std::memcpy(p, data(), size_ * sizeof(T));
    if (cap_ > N) std::free(heap_);
    heap_ = p;
    cap_ = static_cast<uint32_t>(n);
  }

  uint32_t size_ = 0;
  uint32_t cap_ = N;
  union {
    T inline_[N];
    T* heap_;
  };
};

}  // namespace nanscope
