// enable_check_numerics in native code: a boxed fallback kernel that runs
// every ATen op, looks at its floating-point outputs and can raise.
//
// A RecordFunction callback (the recorder's mechanism) cannot raise: the
// dispatcher catches what it throws. A kernel can. The checker registers a
// fallback for one dispatch key that no real tensor carries, a mode key at
// the top of the dispatch order, and includes that key in the thread-local
// dispatch key set of each thread it checks: every op called there then
// comes here first. The fallback runs the op below its key (the autograd
// layer, the backend), counts its CPU float outputs with the recorder's
// vectorised count kernel, and returns. The autograd engine carries the
// thread-local key set into the threads that run backward, so backward ops
// come here too; a DataLoader worker forked from a checked thread inherits it.
//
// Ops with a CompositeImplicitAutograd kernel are looked through: their
// decomposition comes here op by op, as it reaches a Python dispatch mode.
// Other ops run with the key excluded, so the ops inside their kernels do not.
//
// Python is called, with the GIL and with the key excluded (nanscope's own
// tensor work is not the program's), only for what is rare: an output that
// holds Inf/NaN, an output on an accelerator, GradScaler's two ops, an op
// seen for the first time, a stack seen for the first time, and, while Inf/NaN
// written earlier have not been read yet or storages still hold them, the ops
// that may read or overwrite them. The Python side (check_numerics.py) keeps
// the lineages and decides; an exception it raises is thrown from here as a
// torch python_error, which every Python binding turns back into the same
// exception, on the thread that called the op or, from the autograd engine's
// threads, where backward() was called.
//
// The link from a backward op to its forward op (for the forward line that an
// error names) is kept here: the forward op's stack and module.
#include <torch/extension.h>

#include <ATen/SequenceNumber.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "checker.h"
#include "counts.h"
#include "ivalues.h"
#include "op_keys.h"
#include "stacks.h"

namespace py = pybind11;

namespace nanscope {
namespace {

constexpr auto kKey = c10::DispatchKey::TESTING_ONLY_GenericMode;
constexpr size_t kLinksMax = 1 << 20;
// What the Python side asks to see besides Inf/NaN (check_watch).
constexpr int kWatchAll = 1;      // every op: device checks are queued, in order
constexpr int kWatchReads = 2;    // ops reading a storage whose Inf/NaN wait to be read
constexpr int kWatchInplace = 4;  // in-place ops writing into a storage that holds Inf/NaN

struct CheckOp {
  int index = -1;              // the Python side's op index
  size_t nargs = 0, nrets = 0;  // its schema's, read off the stack for every call
  bool composite = false;      // looked through: its decomposition comes here
  bool pass = true;            // run it, look at nothing (views, allocations, skipped)
  bool special = false;        // Python sees every call (GradScaler's ops)
  bool inplace = false;
  std::vector<int> written;  // argument positions it writes into
};

struct Link {
  int32_t op, stack, module;
};

struct Checker {
  std::atomic<bool> active{false};
  std::atomic<int> watch{0};
  std::mutex watch_mu;  // the storages (their data addresses) watched
  std::unordered_set<const void*> unread, held;
  py::object host;  // check_numerics.NativeHost: describe, new_stack, op

  std::mutex ops_mu;
  // By the op's registration (op_keys.h); emptied, with a new generation, when an op
  // leaves the dispatcher (forget_ops), as its address may then name another op.
  std::unordered_map<const void*, CheckOp*> ops;
  // Never emptied: a kernel on another thread may still hold an entry when
  // checking starts again (a new session gets new entries, and a new generation).
  std::deque<CheckOp> op_store;
  std::atomic<uint64_t> generation{0};

  std::mutex links_mu;
  std::unordered_map<int64_t, Link> links;

  StackTable stacks;
};

Checker* C = nullptr;  // made once, lives for the process (kernels may run at exit)

thread_local int tl_paused = 0;  // > 0 while nanscope's own Python code runs ops
// > 0 while suspension.py's SUSPENDED is: a compiled graph runs (checked as a
// whole, compiled/checks.py), torch.compile traces, or the thread is nanscope's.
thread_local int tl_suspended = 0;
thread_local int tl_module = 0;
thread_local int64_t tl_last_seq = -1;
// The run context's phase, with module frames on (check_set_optimizer): optimizer
// calls running, and after backward() returned its sequence number (-1 otherwise)
// and the modules running then.
thread_local int tl_optimizer = 0;
thread_local int64_t tl_between = -1;
thread_local ModulesAtBackward tl_at_backward;

struct Paused {
  Paused() { ++tl_paused; }
  ~Paused() { --tl_paused; }
};

// Each thread's last ops, without the table's lock.
struct CacheSlot {
  const void* key = nullptr;
  const CheckOp* op = nullptr;
  uint64_t generation = 0;
};
thread_local CacheSlot tl_cache[64];

const CheckOp* lookup(const c10::OperatorHandle& op) {
  const void* key = registration_of(op);
  CacheSlot& slot = tl_cache[(reinterpret_cast<uintptr_t>(key) >> 4) & 63];
  const uint64_t generation = C->generation.load(std::memory_order_acquire);
  if (slot.key == key && slot.generation == generation) return slot.op;
  slot.op = nullptr;
  {
    std::lock_guard<std::mutex> g(C->ops_mu);
    auto it = C->ops.find(key);
    if (it != C->ops.end()) {
      slot = {key, it->second, generation};
      return it->second;
    }
  }
  const c10::OperatorName& name = op.operator_name();
  CheckOp f;
  f.composite = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  const auto& args = op.schema().arguments();
  f.nargs = args.size();
  f.nrets = op.schema().returns().size();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* alias = args[i].alias_info();
    if (alias != nullptr && alias->isWrite()) f.written.push_back(static_cast<int>(i));
  }
  f.inplace = !f.written.empty();
  if (!f.composite) {
    Paused paused;
    py::gil_scoped_acquire gil;
    try {
      py::tuple d = C->host.attr("describe")(name.name, name.overload_name);
      f.index = d[0].cast<int>();
      f.pass = d[1].cast<bool>();
      f.special = d[2].cast<bool>();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("nanscope: describing an op for check_numerics");
    }
  }
  std::lock_guard<std::mutex> g(C->ops_mu);
  C->op_store.push_back(std::move(f));
  CheckOp* p = &C->op_store.back();
  C->ops[key] = p;
  slot = {key, p, generation};
  return p;
}

// New stacks are interned by the Python side, which finds their user frame.
const StackTable::Intern intern_stack = [](py::list frames) {
  Paused paused;
  return C->host.attr("new_stack")(frames).cast<int>();
};
// New modules called (module frames on): the Python side names their path.
const StackTable::InternModules intern_modules = [](py::list called) {
  Paused paused;
  return C->host.attr("module_index")(called).cast<int>();
};
const StackTable::Failed interning_failed = [](py::error_already_set& e) {
  e.discard_as_unraisable("nanscope: interning a stack for check_numerics");
};

// The running Python stack's id and, with module frames on, its module.
Place capture_place() {
  return C->stacks.place(intern_stack, module_frames_on() ? &intern_modules : nullptr, interning_failed);
}

// With module frames on: an op inside modules other than those running when
// backward() returned begins a forward pass (the hooks say so otherwise), which
// the run context is told of (it ends an update made by hand).
void forward_began_here() {
  if (tl_between < 0 || tl_optimizer > 0 || !module_frames_on() || torch::autograd::get_current_node()) {
    return;
  }
  if (!tl_at_backward.left_by(modules_here_hash())) return;
  Paused paused;
  py::gil_scoped_acquire gil;
  try {
    C->host.attr("forward_began")();
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("nanscope: a forward pass began (check_numerics)");
  }
}

using Args = c10::SmallVector<c10::IValue, 8>;

bool is_float(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: return true;
    default: return false;
  }
}

enum class Look { kFinite, kBad, kElsewhere, kNone };

// Whether a float output holds Inf/NaN, where its values can be read here.
Look look(const at::Tensor& t) {
  if (!is_float(t) || t.numel() == 0) return Look::kNone;
  const auto* impl = t.unsafeGetTensorImpl();
  // Fake, functional and batched tensors (compilation, functorch) hold no
  // values; a tensor subclass's values are its inner tensors'.
  if (t.is_meta() || impl->is_python_dispatch() || !t.has_storage() ||
      impl->key_set().has(c10::DispatchKey::Functionalize)) {
    return Look::kNone;
  }
  if (!t.is_cpu()) return Look::kElsewhere;
  if (t.layout() != at::kStrided) return Look::kNone;
  int bad = -1;
  try {
    bad = any_nonfinite(t);
  } catch (const c10::Error&) {
    return Look::kNone;
  }
  return bad < 0 ? Look::kNone : bad > 0 ? Look::kBad : Look::kFinite;
}

// A forward op that autograd recorded: its stack and module, for the backward
// ops its node will run (autograd numbers the node it makes with the sequence
// number before this op's).
void remember_forward(const CheckOp& op, const Args& args) {
  const int64_t cur = static_cast<int64_t>(at::sequence_number::peek());
  if (cur == tl_last_seq) return;
  tl_last_seq = cur;
  Tensors ins;
  for (const auto& a : args) tensors_of(a, ins);
  bool grad = false;
  for (const auto& t : ins) grad = grad || t.requires_grad();
  if (!grad) return;
  const Place place = capture_place();
  Link link{op.index, place.stack, module_frames_on() ? place.module : tl_module};
  std::lock_guard<std::mutex> g(C->links_mu);
  if (C->links.size() > kLinksMax) C->links.clear();
  C->links[cur - 1] = link;
}

py::object wrap(const at::Tensor& t) {
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
}

// The Python side looks at the op: follows lineages, and may raise.
void to_python(const CheckOp& op, const Args& args, const Tensors& outs,
               const c10::SmallVector<int, 4>& bad, bool elsewhere) {
  Paused paused;
  c10::impl::ExcludeDispatchKeyGuard off(kKey);
  py::gil_scoped_acquire gil;
  try {
    py::list pargs;
    for (const auto& a : args) pargs.append(torch::jit::toPyObject(a));
    Tensors ins;
    for (const auto& a : args) tensors_of(a, ins);
    py::list pouts;
    for (const auto& t : outs) {
      // An output that is an argument (written in place) is that argument's
      // own object: the Python side tells parameters by it. A new output gets
      // an object sharing its storage: giving the op's own tensor a Python
      // object now would break code about to give it one of its own.
      bool argument = false;
      for (const auto& x : ins) argument = argument || x.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
      pouts.append(argument ? wrap(t) : wrap(t.variable_data()));
    }
    py::object pbad = py::none();
    if (!elsewhere) {
      py::list l;
      for (int i : bad) l.append(i);
      pbad = l;
    }
    C->host.attr("op")(op.index, pargs, pouts, pbad);
  } catch (py::error_already_set& e) {
    // Thrown on as the same Python exception (NonFiniteError), to whoever called the op.
    e.restore();
    python_error err;
    err.persist();
    throw err;
  }
}

const void* storage_of(const at::Tensor& t) {
  if (!t.has_storage()) return nullptr;
  try {
    return t.storage().data();
  } catch (const c10::Error&) {
    return nullptr;
  }
}

// Whether the Python side must see this op although it wrote no Inf/NaN: it
// reads Inf/NaN not read yet, or overwrites a storage holding Inf/NaN.
bool watched(const CheckOp& op, const Args& args, const Tensors& outs) {
  const int watch = C->watch.load(std::memory_order_relaxed);
  if (watch == 0) return false;
  if (watch & kWatchAll) return true;
  std::lock_guard<std::mutex> g(C->watch_mu);
  if ((watch & kWatchReads) != 0) {
    Tensors ins;
    for (const auto& a : args) tensors_of(a, ins);
    for (const auto& t : ins) {
      const void* p = storage_of(t);
      if (p != nullptr && C->unread.count(p) != 0) return true;
    }
  }
  if ((watch & kWatchInplace) != 0 && op.inplace) {
    for (const auto& t : outs) {
      const void* p = storage_of(t);
      if (p != nullptr && C->held.count(p) != 0) return true;
    }
  }
  return false;
}

void check_kernel(const c10::OperatorHandle& handle, c10::DispatchKeySet ks,
                  torch::jit::Stack* stack) {
  const auto below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey);
  if (C == nullptr || !C->active.load(std::memory_order_relaxed) || tl_paused > 0 ||
      tl_suspended > 0) {
    c10::impl::ExcludeDispatchKeyGuard off(kKey);
    handle.redispatchBoxed(below, stack);
    return;
  }
  const CheckOp& op = *lookup(handle);
  if (op.composite) {
    handle.redispatchBoxed(below, stack);  // its decomposition comes back here
    return;
  }
  if (op.pass) {
    c10::impl::ExcludeDispatchKeyGuard off(kKey);
    handle.redispatchBoxed(below, stack);
    return;
  }
  const size_t nargs = op.nargs;
  Args args(stack->end() - static_cast<ptrdiff_t>(nargs), stack->end());
  {
    c10::impl::ExcludeDispatchKeyGuard off(kKey);
    handle.redispatchBoxed(below, stack);
  }
  const size_t nrets = op.nrets;
  Tensors outs;
  for (auto it = stack->end() - static_cast<ptrdiff_t>(nrets); it != stack->end(); ++it) {
    tensors_of(*it, outs);
  }
  // What it wrote and does not return: _foreach_add_, _fused_adamw_ and co. return
  // nothing; a batch norm does not return its running statistics.
  const size_t returned = outs.size();
  for (int i : op.written) {
    if (static_cast<size_t>(i) >= args.size()) continue;
    Tensors written;
    tensors_of(args[static_cast<size_t>(i)], written);
    for (const at::Tensor& t : written) {
      bool found = false;
      for (size_t j = 0; j < returned && !found; ++j) {
        found = outs[j].unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
      }
      if (!found) outs.push_back(t);
    }
  }
  c10::SmallVector<int, 4> bad;
  bool elsewhere = false;
  for (size_t i = 0; i < outs.size(); ++i) {
    switch (look(outs[i])) {
      case Look::kBad: bad.push_back(static_cast<int>(i)); break;
      case Look::kElsewhere: elsewhere = true; break;
      default: break;
    }
  }
  if (tl_between >= 0) forward_began_here();
  if (torch::autograd::get_current_node() == nullptr && c10::GradMode::is_enabled()) {
    remember_forward(op, args);
  }
  if (bad.empty() && !elsewhere && !op.special && !watched(op, args, outs)) return;
  to_python(op, args, outs, bad, elsewhere);
}

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericMode, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&check_kernel>());
}

// An op left the dispatcher: its registration's address may then be another op's.
void forget_ops() {
  if (C == nullptr) return;
  std::lock_guard<std::mutex> g(C->ops_mu);
  C->ops.clear();
  C->generation.fetch_add(1, std::memory_order_release);
}

void start(py::object host) {
  if (C == nullptr) {
    C = new Checker();
    forget_ops_when_removed(&forget_ops);
  }
  C->active = false;
  {
    std::lock_guard<std::mutex> g(C->ops_mu);
    C->ops.clear();
    C->generation.fetch_add(1, std::memory_order_release);
  }
  {
    std::lock_guard<std::mutex> g(C->links_mu);
    C->links.clear();
  }
  C->stacks.clear();
  C->host = std::move(host);
  {
    std::lock_guard<std::mutex> g(C->watch_mu);
    C->watch = 0;
    C->unread.clear();
    C->held.clear();
  }
  tl_last_seq = -1;
  C->active = true;
  c10::impl::tls_set_dispatch_key_included(kKey, true);
}

void stop() {
  c10::impl::tls_set_dispatch_key_included(kKey, false);
  if (C == nullptr) return;
  C->active = false;
}

py::object link(int64_t seq) {
  if (C == nullptr) return py::none();
  std::lock_guard<std::mutex> g(C->links_mu);
  auto it = C->links.find(seq);
  if (it == C->links.end()) return py::none();
  return py::make_tuple(it->second.op, it->second.stack, it->second.module);
}

}  // namespace

void add_checker(py::module_& m) {
  m.def("check_start", &start);
  m.def("check_stop", &stop);
  m.def("check_thread", [](bool on) { c10::impl::tls_set_dispatch_key_included(kKey, on); });
  // What Python must see besides Inf/NaN: every op (``all``), or the ops that read the
  // storages in ``unread`` or write in place into those in ``held`` (data addresses).
  m.def("check_watch", [](bool all, const std::vector<uintptr_t>& unread,
                          const std::vector<uintptr_t>& held) {
    if (C == nullptr) return;
    std::lock_guard<std::mutex> g(C->watch_mu);
    C->unread.clear();
    C->held.clear();
    for (uintptr_t p : unread) C->unread.insert(reinterpret_cast<const void*>(p));
    for (uintptr_t p : held) C->held.insert(reinterpret_cast<const void*>(p));
    C->watch = (all ? kWatchAll : 0) | (unread.empty() ? 0 : kWatchReads) |
               (held.empty() ? 0 : kWatchInplace);
  });
  m.def("check_pause", [](int delta) { tl_paused += delta; });
  m.def("check_suspend", [](int depth) { tl_suspended = depth; });
  m.def("check_set_module", [](int module) { tl_module = module; });
  m.def("check_set_optimizer", [](int n, int64_t between) {
    tl_optimizer = n;
    tl_at_backward.note(tl_between, between);
    tl_between = between;
  });
  m.def("check_forget_modules", []() {
    if (C != nullptr) C->stacks.forget_modules();
  });
  // The calling thread's module path index (with module frames on).
  m.def("check_current_module", []() { return C == nullptr ? 0 : C->stacks.module_here(intern_modules); });
  m.def("check_link", &link);
}

}  // namespace nanscope
