#pragma once
#include <Python.h>

namespace nanscope {

struct RawFrame {
  PyObject* code;  // borrowed: the frame holds it while the walk's caller runs
  int lasti;       // instruction index (code units)
};

// Innermost first; at most `limit` frames. Needs no GIL on CPython 3.11.
int walk_frames(RawFrame* out, int limit);

// The line of an instruction; call with the GIL held.
int line_of(PyObject* code, int lasti);

}  // namespace nanscope
