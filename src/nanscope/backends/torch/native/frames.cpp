// The calling thread's Python frames, read without taking the GIL.
//
// An op's callback runs on the thread that called the op, in C++, after the
// Python binding released the GIL. That thread's frame chain cannot change
// until the op returns (frames belong to their thread), and each frame holds
// its code object, so reading the chain needs no lock. Taking the GIL
// instead would make every op wait for whichever thread holds it (nanscope's
// own writer thread among them) for up to the switch interval.
//
// The frame layout is CPython 3.11's; other versions take the GIL and use
// the public frame API.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>  // 3.10: PyFrameObject's fields
#endif

#include "frames.h"

#include <atomic>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define NANSCOPE_LOCKFREE_FRAMES 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

namespace nanscope {

namespace {
std::atomic<PyObject*> g_module_code{nullptr};
int g_module_code_users = 0;  // the recorder and the checker may follow frames at once (GIL)
}  // namespace

bool set_module_code(PyObject* code) {
#ifdef NANSCOPE_LOCKFREE_FRAMES
  if (code == nullptr) {
    if (g_module_code_users > 0 && --g_module_code_users == 0) {
      g_module_code.store(nullptr, std::memory_order_release);
    }
    return true;
  }
  ++g_module_code_users;
  Py_INCREF(code);
  // The old one is not let go: a thread may be comparing against it (a code
  // object of the process's lifetime, nn.Module's __call__).
  g_module_code.store(code, std::memory_order_release);
  return true;
#else
  (void)code;
  return false;
#endif
}

bool module_frames_on() { return g_module_code.load(std::memory_order_relaxed) != nullptr; }

#ifdef NANSCOPE_LOCKFREE_FRAMES
namespace {
// The module a frame of nn.Module's __call__ was called on (its `self`), or nullptr.
inline PyObject* module_of(_PyInterpreterFrame* f, const PyObject* code) {
  if (reinterpret_cast<const PyObject*>(f->f_code) != code || _PyFrame_IsIncomplete(f)) return nullptr;
  return f->localsplus[0];
}
}  // namespace
#endif

int walk_modules(PyObject** out, int limit) {
  int n = 0;
#ifdef NANSCOPE_LOCKFREE_FRAMES
  const PyObject* code = g_module_code.load(std::memory_order_acquire);
  if (code == nullptr || !Py_IsInitialized()) return 0;
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr || ts->cframe == nullptr) return 0;
  int depth = 0;
  for (_PyInterpreterFrame* f = ts->cframe->current_frame;
       f != nullptr && n < limit && depth < kMaxStackFrames + kMaxModuleWalk; f = f->previous, ++depth) {
    if (PyObject* m = module_of(f, code)) out[n++] = m;
  }
#else
  (void)out;
  (void)limit;
#endif
  return n;
}

uint64_t modules_here_hash() {
  PyObject* mods[kMaxModules];
  return hash_modules(mods, walk_modules(mods, kMaxModules));
}

int walk_frames(RawFrame* out, int limit) {
  if (!Py_IsInitialized()) return 0;
  int n = 0;
#ifdef NANSCOPE_LOCKFREE_FRAMES
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr || ts->cframe == nullptr) return 0;
  _PyInterpreterFrame* f = ts->cframe->current_frame;
  while (f != nullptr && n < limit) {
    if (!_PyFrame_IsIncomplete(f)) {
      out[n].code = reinterpret_cast<PyObject*>(f->f_code);
      out[n].lasti = _PyInterpreterFrame_LASTI(f);
      ++n;
    }
    f = f->previous;
  }
#else
  PyGILState_STATE st = PyGILState_Ensure();
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  while (f != nullptr && n < limit) {
    PyCodeObject* code = PyFrame_GetCode(f);
    out[n].code = reinterpret_cast<PyObject*>(code);
#if PY_VERSION_HEX >= 0x030B0000
    out[n].lasti = PyFrame_GetLasti(f) / 2;  // bytes
#else
    out[n].lasti = f->f_lasti;  // 3.10: code units
#endif
    Py_DECREF(code);  // alive while its frame is
    ++n;
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  PyGILState_Release(st);
#endif
  return n;
}

namespace {

inline uint64_t fold(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL; }

// Every bit of the folded hash moved into the low bits too (a multiply carries only
// upwards): the threads' caches index by low bits.
inline uint64_t finish(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

}  // namespace

StackSignature stack_signature() {
  StackSignature sig;
  uint64_t h = 1469598103934665603ULL;
#ifdef NANSCOPE_LOCKFREE_FRAMES
  if (!Py_IsInitialized()) return sig;
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr || ts->cframe == nullptr) return sig;
  _PyInterpreterFrame* f = ts->cframe->current_frame;
  if (f != nullptr) {
    sig.top_code = f->f_code;
    sig.top_instr = reinterpret_cast<uintptr_t>(f->prev_instr);
  }
  // Every frame, started or not: the instruction's address names the code object's
  // instruction (each code object holds its own instructions), and the frames that
  // walk_frames leaves out are left out of the stack it interns, not of this hash.
  const PyObject* code = g_module_code.load(std::memory_order_acquire);
  int n = 0;
  for (; f != nullptr && n < kMaxStackFrames; f = f->previous, ++n) {
    // The frame's two words mixed apart from the hash, then one fold: the chain
    // from frame to frame is one multiply, not two (every op walks every frame).
    h = fold(h, reinterpret_cast<uintptr_t>(f->f_code) * 0x9E3779B97F4A7C15ULL ^
                    reinterpret_cast<uintptr_t>(f->prev_instr));
    if (PyObject* m = module_of(f, code)) h = fold(h, reinterpret_cast<uintptr_t>(m));
  }
  sig.n = n;
  // Past the frames kept, the modules called still tell places apart.
  if (code != nullptr) {
    for (int k = 0; f != nullptr && k < kMaxModuleWalk; f = f->previous, ++k) {
      if (PyObject* m = module_of(f, code)) h = fold(h, reinterpret_cast<uintptr_t>(m));
    }
  }
#else
  RawFrame buf[kMaxStackFrames];
  const int n = walk_frames(buf, kMaxStackFrames);
  for (int i = 0; i < n; ++i) {
    h = fold(h, reinterpret_cast<uintptr_t>(buf[i].code));
    h = fold(h, static_cast<uint64_t>(buf[i].lasti));
  }
  sig.n = n;
  if (n > 0) {
    sig.top_code = buf[0].code;
    sig.top_instr = static_cast<uintptr_t>(buf[0].lasti);
  }
#endif
  sig.hash = finish(h);
  return sig;
}

int line_of(PyObject* code, int lasti) {
  return PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(code), lasti * 2);
}

}  // namespace nanscope
