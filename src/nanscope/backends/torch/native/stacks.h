#pragma once
// Python stacks by id, for the recorder and the checker: the running stack is
// found without the GIL by its frames' (code object, instruction) pairs; a
// stack seen for the first time is handed to the Python side to intern.
#include <torch/extension.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "frames.h"
#include "pool.h"

namespace nanscope {

// Where an op runs: its stack's id and, with module frames on (frames.h's
// set_module_code), the module path's index (0: outside every module) and a
// hash of the modules called (0: none).
struct Place {
  int stack = -1;
  int module = 0;
  uint64_t modules = 0;
};

class StackTable {
 public:
  // (code, line) pairs, innermost first -> the stack's id; called with the GIL.
  using Intern = std::function<int(pybind11::list)>;
  // The modules called, outermost first -> the module path's index; with the GIL.
  using InternModules = std::function<int(pybind11::list)>;
  // What to do with a Python error the interning raised (with the GIL).
  using Failed = std::function<void(pybind11::error_already_set&)>;

  static constexpr int kMaxFrames = kMaxStackFrames;

  // The id of the calling thread's Python stack (its innermost kMaxFrames
  // frames). A new stack's code objects are held from then on, so that their
  // addresses keep naming them. -1 when interning failed (not kept: tried again).
  int capture(const Intern& intern, const Failed& failed) { return place(intern, nullptr, failed).stack; }

  // The stack's id and, given `modules`, the modules' (see Place). A module
  // path's index is kept by its modules' addresses until forget_modules().
  Place place(const Intern& intern, const InternModules* modules, const Failed& failed);

  // The calling thread's modules' hash and path index (0, 0 outside every module).
  Place modules_here(const InternModules& modules, const Failed& failed);

  // The calling thread's module path index (0 outside every module, or with module
  // frames off); a Python error naming the modules is raised. With the GIL.
  int module_here(const InternModules& modules);

  // Forgets the modules' path indices (a module died: its address may name
  // another); with or without the GIL.
  void forget_modules();

  // Forgets every stack and lets go of their code objects; with the GIL.
  void clear();

  // The table's mutex, for a test that holds it across a fork (the recorder's hold_locks).
  std::mutex& mutex() { return mu_; }

 private:
  struct Entry {
    pvec<RawFrame> frames{pool()};
    int id;
  };
  int find_locked(uint64_t hash, const RawFrame* frames, int n) const;
  int stack_id(const Intern& intern, const Failed& failed);

  struct Chain {
    pvec<PyObject*> modules{pool()};  // innermost first; not held (see forget_modules)
    int index;
  };

  std::mutex mu_;
  std::atomic<uint64_t> generation_{1};  // moved by clear(): threads' recent stacks are stale
  std::pmr::unordered_multimap<uint64_t, Entry> stacks_{pool()};
  std::vector<PyObject*> held_;
  std::pmr::unordered_multimap<uint64_t, Chain> chains_{pool()};
};

}  // namespace nanscope
