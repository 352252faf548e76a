#pragma once
// An open-addressed hash map from 64-bit keys, for the recorder's per-op tables keyed
// by addresses and hashes (tensor ids by TensorImpl address, recorded outputs by
// layout). Tables keyed by numbers that grow by one are recent_table.h's.
//
// Those tables are written for every output of every op. A node-based map costs a
// division (its prime bucket count), a node allocation and two or three cache misses
// each time; here a lookup is one multiply and, mostly, one cache line. Entries are
// never erased one by one: when the table is half full, `put` rebuilds it with the
// entries its `keep` accepts (the dead tensors' are dropped then), sized for four
// times the survivors. Rebuilds are amortised (a table of n slots is rebuilt after
// at least n/4 insertions), and a table that keeps only what is alive stays small,
// in cache.
#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <utility>
#include <vector>

namespace nanscope {

template <typename V>
class FlatMap {
 public:
  explicit FlatMap(std::pmr::memory_resource* mem, size_t min_slots = 1024)
      : min_(min_slots), slots_(mem), kept_(mem) {
    reset(min_);
  }

  size_t size() const { return used_; }

  // The value at `key`, or nullptr.
  V* find(uint64_t key) {
    Slot& s = slots_[probe(key)];
    return s.key == key ? &s.value : nullptr;
  }

  // The value at `key`, value-initialised if the key is new (`*fresh` says so). A
  // table half full is first rebuilt with the entries `keep(key, value)` accepts
  // (`keep` may release what an entry it refuses holds).
  template <typename Keep>
  V& put(uint64_t key, bool* fresh, Keep&& keep) {
    size_t i = probe(key);
    if (slots_[i].key == key) {
      *fresh = false;
      return slots_[i].value;
    }
    if ((used_ + 1) * 2 > slots_.size()) {
      rebuild(keep);
      i = probe(key);
    }
    *fresh = true;
    ++used_;
    slots_[i].key = key;
    slots_[i].value = V{};
    return slots_[i].value;
  }

  // Drops every entry, `drop(key, value)` called on each first.
  template <typename Drop>
  void clear(Drop&& drop) {
    for (Slot& s : slots_) {
      if (s.key != kEmpty) drop(s.key, s.value);
    }
    reset(min_);
  }

  // Keys are never 0 (the empty slot's mark): callers map a hash of 0 elsewhere.
  static constexpr uint64_t kEmpty = 0;

 private:
  struct Slot {
    uint64_t key = kEmpty;
    V value{};
  };

  size_t probe(uint64_t key) const {
    size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    return i;
  }

  void reset(size_t n) {
    if (n * 4 < slots_.capacity()) {  // shrunk well below its peak: the memory goes back
      std::pmr::vector<Slot>(slots_.get_allocator()).swap(slots_);
    }
    slots_.assign(n, Slot{});
    mask_ = n - 1;
    shift_ = 64;
    for (size_t m = n; m > 1; m >>= 1) --shift_;
    used_ = 0;
  }

  // The survivors wait in `kept_` (kept between rebuilds, as `slots_` keeps its
  // capacity): a table that stays the same size allocates nothing.
  template <typename Keep>
  void rebuild(Keep& keep) {
    kept_.clear();
    for (Slot& s : slots_) {
      if (s.key != kEmpty && keep(s.key, s.value)) kept_.push_back(std::move(s));
    }
    size_t n = min_;
    while (n < kept_.size() * 4) n *= 2;
    reset(n);
    for (Slot& s : kept_) {
      Slot& to = slots_[probe(s.key)];
      to = std::move(s);
      ++used_;
    }
    kept_.clear();
    if (kept_.capacity() > n) std::pmr::vector<Slot>(kept_.get_allocator()).swap(kept_);
  }

  size_t min_;
  std::pmr::vector<Slot> slots_;
  std::pmr::vector<Slot> kept_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t used_ = 0;
};

// A FlatMap for values of a cache line or more (the recorded layouts): its slots hold
// the key and the index of the value in a dense array, in the order they were put. A
// put then touches a slot of 16 bytes at random and the array's end, not a random slot
// of the value's size: the table the probes run over is a fifth of the size, in cache
// longer. A rebuild moves the values kept to the front of a second array.
template <typename V>
class DenseMap {
 public:
  explicit DenseMap(std::pmr::memory_resource* mem) : index_(mem), values_(mem), moved_(mem) {}

  size_t size() const { return index_.size(); }

  V* find(uint64_t key) {
    uint32_t* i = index_.find(key);
    return i == nullptr ? nullptr : &values_[*i];
  }

  // As FlatMap::put: `keep(key, value)` decides which entries a rebuild keeps.
  template <typename Keep>
  V& put(uint64_t key, bool* fresh, Keep&& keep) {
    bool rebuilt = false;
    auto keep_moved = [&](uint64_t k, uint32_t& i) {
      if (!rebuilt) {
        rebuilt = true;
        moved_.clear();
      }
      if (!keep(k, values_[i])) return false;
      moved_.push_back(std::move(values_[i]));
      i = static_cast<uint32_t>(moved_.size() - 1);
      return true;
    };
    uint32_t& i = index_.put(key, fresh, keep_moved);
    if (rebuilt) {
      values_.swap(moved_);
      moved_.clear();
    }
    if (*fresh) {
      i = static_cast<uint32_t>(values_.size());
      values_.emplace_back();
    }
    return values_[i];
  }

  template <typename Drop>
  void clear(Drop&& drop) {
    index_.clear([&](uint64_t k, uint32_t& i) { drop(k, values_[i]); });
    values_.clear();
    moved_.clear();
    if (values_.capacity() > kKeepCapacity) std::pmr::vector<V>(values_.get_allocator()).swap(values_);
    if (moved_.capacity() > kKeepCapacity) std::pmr::vector<V>(moved_.get_allocator()).swap(moved_);
  }

 private:
  static constexpr size_t kKeepCapacity = 4096;  // values kept allocated across a clear
  FlatMap<uint32_t> index_;
  std::pmr::vector<V> values_;
  std::pmr::vector<V> moved_;  // a rebuild's survivors; its memory kept between rebuilds
};

}  // namespace nanscope
