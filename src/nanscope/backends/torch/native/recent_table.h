#pragma once
// A table of the latest entries under keys that grow by about one per entry: autograd
// sequence numbers (the recorder's forward links) and tensor ids (its never-written
// outputs). Direct-mapped: an entry's slot is its key modulo the table's length, and it
// is forgotten when a key that many later takes the slot.
//
// Such keys scattered by a hash (flat_map.h) land on a random cache line of a table of
// several MB for every op; here consecutive keys take neighbouring slots, so a forward
// pass writes a run of cache lines and its backward pass reads the same run back.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace nanscope {

template <typename V>
class RecentTable {
 public:
  // `slots`: a power of two, the number of latest keys kept at least.
  explicit RecentTable(size_t slots) : mask_(slots - 1) {}

  // The value at `key`, or nullptr (the key never put, or its slot since taken).
  const V* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    const Slot& s = slots_[key & mask_];
    return s.key == key ? &s.value : nullptr;
  }

  // The slot of `key`, taken from what it held: the caller sets the value (left as the
  // slot's last one, not reset, so that a wide value is written once). Keys are never 0
  // (the empty slot's mark). The memory is taken at the first put.
  V& put(uint64_t key) {
    if (slots_.empty()) slots_.assign(mask_ + 1, Slot{});
    Slot& s = slots_[key & mask_];
    s.key = key;
    return s.value;
  }

  // Forgets every entry; the memory goes back until the next put.
  void clear() { std::vector<Slot>().swap(slots_); }

 private:
  struct Slot {
    uint64_t key = 0;
    V value{};
  };
  uint64_t mask_;  // the length less one
  std::vector<Slot> slots_;
};

}  // namespace nanscope
