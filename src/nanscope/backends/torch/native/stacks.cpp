// The stack table (see stacks.h).
#include "stacks.h"

#include <algorithm>

namespace py = pybind11;

namespace nanscope {

int StackTable::find_locked(uint64_t hash, const RawFrame* frames, int n) const {
  auto range = stacks_.equal_range(hash);
  for (auto it = range.first; it != range.second; ++it) {
    const auto& f = it->second.frames;
    if (static_cast<int>(f.size()) == n &&
        std::equal(f.begin(), f.end(), frames, [](const RawFrame& a, const RawFrame& b) {
          return a.code == b.code && a.lasti == b.lasti;
        })) {
      return it->second.id;
    }
  }
  return -2;
}

namespace {

// Each thread's last stacks, direct-mapped by their signature's hash: a stack seen
// before on this thread is found without walking its frames or taking the table's
// lock. An entry names its table and the table's generation (moved by clear()).
struct Recent {
  const StackTable* table = nullptr;
  uint64_t generation = 0;
  StackSignature sig;
  Place place;
};
constexpr size_t kRecent = 512;
thread_local std::array<Recent, kRecent> tl_recent{};

}  // namespace

Place StackTable::place(const Intern& intern, const InternModules* modules, const Failed& failed) {
  const StackSignature sig = stack_signature();
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  Recent& recent = tl_recent[(sig.hash >> 17) & (kRecent - 1)];
  if (recent.table == this && recent.generation == generation && recent.sig == sig) {
    return recent.place;
  }
  Place p;
  p.stack = stack_id(intern, failed);
  if (p.stack < 0) return p;  // not kept: tried again
  if (modules != nullptr) {
    const Place m = modules_here(*modules, failed);
    if (m.module < 0) return p;  // the modules could not be named: tried again
    p.module = m.module;
    p.modules = m.modules;
  }
  recent = Recent{this, generation, sig, p};
  return p;
}

int StackTable::stack_id(const Intern& intern, const Failed& failed) {
  // Not seen lately on this thread: its frames, keyed by their own hash in the table
  // that all threads share.
  RawFrame buf[kMaxFrames];
  const int n = walk_frames(buf, kMaxFrames);
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < n; ++i) {
    h = (h ^ reinterpret_cast<uintptr_t>(buf[i].code)) * 1099511628211ULL;
    h = (h ^ static_cast<uint64_t>(buf[i].lasti)) * 1099511628211ULL;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    const int id = find_locked(h, buf, n);
    if (id != -2) return id;
  }
  py::gil_scoped_acquire gil;
  int id = -1;
  try {
    py::list frames;
    for (int i = 0; i < n; ++i) {
      frames.append(py::make_tuple(py::reinterpret_borrow<py::object>(buf[i].code),
                                   line_of(buf[i].code, buf[i].lasti)));
    }
    id = intern(frames);
  } catch (py::error_already_set& e) {
    failed(e);
    return -1;
  }
  std::lock_guard<std::mutex> g(mu_);
  const int known = find_locked(h, buf, n);  // another thread interned it meanwhile
  if (known != -2) return known;
  Entry entry;
  entry.frames.assign(buf, buf + n);
  entry.id = id;
  for (int i = 0; i < n; ++i) {
    Py_INCREF(buf[i].code);
    held_.push_back(buf[i].code);
  }
  stacks_.emplace(h, std::move(entry));
  return id;
}

Place StackTable::modules_here(const InternModules& intern, const Failed& failed) {
  PyObject* mods[kMaxModules];
  const int n = walk_modules(mods, kMaxModules);
  Place p;
  if (n == 0) return p;
  const uint64_t h = hash_modules(mods, n);
  p.modules = h;
  auto known_locked = [&]() {
    auto range = chains_.equal_range(h);
    for (auto it = range.first; it != range.second; ++it) {
      const auto& c = it->second.modules;
      if (static_cast<int>(c.size()) == n && std::equal(c.begin(), c.end(), mods)) return it->second.index;
    }
    return -1;
  };
  {
    std::lock_guard<std::mutex> g(mu_);
    p.module = known_locked();
    if (p.module >= 0) return p;
  }
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  py::gil_scoped_acquire gil;
  int index = -1;
  try {
    py::list outermost_first;
    for (int i = n - 1; i >= 0; --i) outermost_first.append(py::reinterpret_borrow<py::object>(mods[i]));
    index = intern(outermost_first);
  } catch (py::error_already_set& e) {
    failed(e);
    p.module = -1;
    return p;
  }
  p.module = index;
  std::lock_guard<std::mutex> g(mu_);
  // Not kept if a module died meanwhile (its address may be in this chain).
  if (known_locked() < 0 && generation_.load(std::memory_order_acquire) == generation) {
    Chain chain;
    chain.modules.assign(mods, mods + n);
    chain.index = index;
    chains_.emplace(h, std::move(chain));
  }
  return p;
}

int StackTable::module_here(const InternModules& modules) {
  if (!module_frames_on()) return 0;
  static const Failed raise = [](py::error_already_set&) { throw; };
  return std::max(0, modules_here(modules, raise).module);
}

void StackTable::forget_modules() {
  std::lock_guard<std::mutex> g(mu_);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  chains_.clear();
}

void StackTable::clear() {
  std::lock_guard<std::mutex> g(mu_);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  for (PyObject* code : held_) Py_DECREF(code);
  held_.clear();
  stacks_.clear();
  chains_.clear();
}

}  // namespace nanscope
