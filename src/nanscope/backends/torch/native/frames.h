#pragma once
#include <Python.h>

#include <cstdint>

namespace nanscope {

struct RawFrame {
  PyObject* code;  // borrowed: the frame holds it while the walk's caller runs
  int lasti;       // instruction index (code units)
};

// The most frames a stack keeps (its innermost ones).
constexpr int kMaxStackFrames = 128;

// Innermost first; at most `limit` frames. Needs no GIL on CPython 3.11.
int walk_frames(RawFrame* out, int limit);

// Module paths from frames instead of forward hooks: the code object of
// nn.Module's __call__ (_wrapped_call_impl), whose first local is the module
// called. Set with the GIL; each set is undone by a set of nullptr (the
// recorder and the checker each set it). False where frames cannot be read
// without the GIL (Python other than 3.11): hooks then.
bool set_module_code(PyObject* code);
bool module_frames_on();

// The most modules a place keeps (its innermost ones), and how far past
// kMaxStackFrames the walk still looks for them.
constexpr int kMaxModules = 256;
constexpr int kMaxModuleWalk = 4096;

// The modules whose __call__ is running on the calling thread, innermost first,
// at most `limit` (borrowed: their frames hold them). Needs no GIL on 3.11.
int walk_modules(PyObject** out, int limit);

// What names a list of modules (walk_modules'): never 0, which means none.
inline uint64_t hash_modules(PyObject* const* mods, int n) {
  if (n == 0) return 0;
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < n; ++i) h = (h ^ reinterpret_cast<uintptr_t>(mods[i])) * 1099511628211ULL;
  return h == 0 ? 1 : h;
}

// hash_modules of the calling thread's modules.
uint64_t modules_here_hash();

// With module frames on, where hooks would see a module entered: the modules running
// when backward() returned on a thread (its recorder's or checker's copy). An op inside
// other modules since began a forward pass.
struct ModulesAtBackward {
  uint64_t modules = 0;
  // The thread's phase moves from `was` to `between` (>= 0: backward() returned, with
  // that sequence number; -1 otherwise): noted as it leaves -1. With the GIL.
  void note(int64_t was, int64_t between) {
    if (between >= 0 && was < 0) modules = modules_here_hash();
  }
  // Whether an op inside `here` (hash_modules) is inside other modules.
  bool left_by(uint64_t here) const { return here != 0 && here != modules; }
};

// What tells the calling thread's stack apart, cheaper than its frames: a hash of
// each frame's code object and instruction address (the innermost kMaxStackFrames)
// and of the modules called (see set_module_code), the number of frames hashed and
// the innermost pair. Two calls with equal signatures were made from the same frames
// (up to a 64-bit hash's chance), so that stacks seen before are found without
// walk_frames. On CPython 3.11 it reads no code object (walk_frames reads each to
// leave out frames that have not started) and needs no GIL.
struct StackSignature {
  uint64_t hash = 0;
  int n = 0;
  const void* top_code = nullptr;
  uintptr_t top_instr = 0;
  bool operator==(const StackSignature& o) const {
    return hash == o.hash && n == o.n && top_code == o.top_code && top_instr == o.top_instr;
  }
};
StackSignature stack_signature();

// The line of an instruction; call with the GIL held.
int line_of(PyObject* code, int lasti);

}  // namespace nanscope
