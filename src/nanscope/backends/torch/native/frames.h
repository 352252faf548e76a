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

// What tells the calling thread's stack apart, cheaper than its frames: a hash of
// each frame's code object and instruction address (the innermost kMaxStackFrames),
// the number of frames hashed and the innermost pair. Two calls with equal signatures were made from the same frames
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
