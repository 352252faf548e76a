// nanscope's native PyTorch recorder: every ATen op as an event, without
// Python on the common path.
//
// Ops reach it two ways (see record_kernel): on the threads nanscope knows, a
// kernel for a dispatch key of its own, which only the ops a TorchDispatchMode
// would see reach; on threads that were running before recording began, a
// global RecordFunction callback (the mechanism PyTorch's profiler uses), which
// sees every dispatcher call. Both record the same ops: ops with a
// CompositeImplicitAutograd kernel are looked through (their decomposition is
// recorded), and ops called inside a recorded op's kernel are not recorded. For
// each recorded op it keeps tensor ids, devices, summaries of CPU float outputs
// (counted in one vectorised pass, see counts.cpp), the Python stack (read without
// the GIL, see frames.cpp), module path, phase, step and the link from a backward
// op to the forward op whose autograd node ran it. Events (event.h) wait in a
// buffer until nanscope's drain thread takes them: most as encoded records (see
// encoder.cpp), the rest as Python objects for the writer.
//
// Python is called, with the GIL, only for what is rare or framework-heavy:
// an op seen for the first time, a stack seen for the first time, outputs on
// an accelerator (summarised with device ops, never synchronised), FULL_TENSOR
// values of unusual tensors (complex, sparse, on a device), a collective to
// wait for, and the inputs of an op that produced Inf/NaN. FULL_TENSOR copies
// of CPU tensors are made here (see copy_values) and encoded in encoder.cpp.
//
// This file holds the recording: the kernel and the callback, the tables it keeps
// (ops, tensor ids, stacks, links, summaries) and the buffer, with the extension's
// Python interface. The count kernel and the record encoder, which are not
// about recording, have their own files.
#include <torch/extension.h>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/node.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <pybind11/numpy.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <array>
#include <thread>
#include <vector>

#include "checker.h"
#include "counts.h"
#include "encoder.h"
#include "event.h"
#include "flat_map.h"
#include "frames.h"
#include "ivalues.h"
#include "op_keys.h"
#include "pool.h"
#include "recent_table.h"
#include "stacks.h"

namespace py = pybind11;

namespace nanscope {
namespace {

constexpr size_t kValuesMax = 8192;  // FULL_TENSOR's values table: entries before it starts over
constexpr size_t kCacheSlots = 8192;  // the summary cache: the latest output ids' rows
constexpr size_t kCapacity = 262144;  // buffered events before an op waits for the drain
// FULL_TENSOR values' bytes held (buffered, or taken and not yet freed) before
// an op waits for the drain, as for a full buffer.
constexpr int64_t kValueBytesMax = int64_t(512) << 20;
// Of those, at most this many in the ring of shed events (see push).
constexpr int64_t kRingBytesMax = int64_t(128) << 20;

struct Link {
  int64_t serial = 0;
  int32_t stack = -1;
  int32_t module = 0;
};
constexpr size_t kLinksWindow = size_t(1) << 17;  // 3 MB of slots of 24 bytes
constexpr size_t kBlankWindow = size_t(1) << 14;   // 256 KB of slots of 16 bytes

// The FlatMap policy for tables whose entries hold nothing to release.
constexpr auto forget = [](uint64_t, auto&) {};

// An output's memory layout, to know it again in a tensor object that autograd
// makes behind the dispatcher's back (a saved output, unpacked for backward).
// No weak reference to the storage: one keeps the storage's memory allocated.
// While the output itself is alive its storage is compared; once it is gone
// (a saved output outlives the tensor object it was saved from), the storage
// and data addresses and the layout must match, within the same step. The output
// is known alive by the id table: its TensorImpl still holds this id there (the
// table's weak reference keeps the address from naming another tensor meanwhile).
struct ViewEntry {
  int64_t id = 0;
  c10::TensorImpl* owner = nullptr;
  const void* storage = nullptr;
  const void* data = nullptr;
  int64_t offset = 0;
  int64_t step = 0;
  int8_t dtype = 0;
  // The layout (sizes and strides) as a second hash, seeded apart from the table's key:
  // together 128 bits, so that two layouts of one storage and offset are never taken
  // for each other (copies of the sizes and strides cost more than the hash).
  uint64_t layout = 0;
};


// FULL_TENSOR: where the values of a recorded tensor are, while its storage has
// not been written since (the version counter, shared by a base and its views,
// has not moved): a view of it then points at them instead of copying them.
// The root is a contiguous output whose bytes an event holds.
struct ValueEntry {
  int64_t version;
  const void* storage;
  int8_t dtype;
  int64_t root_serial;   // the event holding the values
  int32_t root_slot;     // its output
  int64_t root_offset;   // the root's storage offset (elements)
  int64_t root_numel;
};

// A summary row taken of an output, with the output's version then: a same-element view
// of the output made before its next write has the same row (from_cache).
struct CachedRow {
  int64_t version = -1;
  std::array<double, kWidestRow> values{};
};

// A part of recording that runs for few ops, out of line and cold (see "the rare parts
// of recording an op" below).
#define NANSCOPE_COLD __attribute__((cold, noinline))

struct Ctx : at::ObserverContext, Pooled {
  using Pooled::operator new;
  using Pooled::operator delete;
  bool record = false;
  uint64_t session = 0;  // the session it started in: an op may end in a later one
  const OpFlags* op = nullptr;
  Tensors ins;
  Tensors written;  // the arguments it writes into (OpFlags::written)
  c10::SmallVector<double, 2> values;
  // A torch.distributed operation's arguments (its process group among them),
  // copied at the start: by the end, the stack that held them holds its outputs.
  std::vector<c10::IValue> args;
  // Its input tensors' summaries taken before it ran (owned): whether this rank
  // sent Inf/NaN into it. An in-place collective has overwritten them by the end.
  PyObject* before = nullptr;
  ~Ctx() {
    if (before != nullptr) release_before(before);
  }
  NANSCOPE_COLD static void release_before(PyObject*& p) {
    py::gil_scoped_acquire gil;
    Py_CLEAR(p);
  }
};

struct State {
  std::atomic<bool> active{false};
  // Callbacks running now, on any thread. stop() waits for them to leave, and
  // the tables and the Python host are reset only while none runs: an op that
  // began before stop() may still be inside record().
  std::atomic<int64_t> inflight{0};
  std::atomic<uint64_t> session{0};  // one per start()
  std::atomic<int64_t> dropped{0};   // events let go when the buffer stayed full
  std::atomic<int64_t> dropped_nonfinite{0};  // of them, events that held Inf/NaN
  int mode = kFull;
  int width = 11;
  at::CallbackHandle handle = 0;
  py::object host;  // the Python side: describe, new_stack, summaries, input_summaries, wait

  std::array<int, 64> dtype_enum{};
  std::array<bool, 64> dtype_ok{};
  std::array<bool, 64> dtype_float{};

  // Keyed by addresses the dispatcher keeps for as long as the op is registered
  // (its schema's name, its registration: op_keys.h); a listener empties the map
  // when any op is removed, as an address may then name another op.
  std::mutex ops_mu;
  std::unordered_map<const char*, const OpFlags*> ops;
  std::deque<OpFlags> op_store;
  std::vector<const OpFlags*> op_by_index;  // by the Python side's op index

  // The tables below are each used under their own mutex. The node maps' nodes come
  // from a pool of that mutex's own (no lock of the pool's: the shared pool's lock is
  // taken on every allocation and contended by the drain thread's frees); the flat
  // tables (flat_map.h) allocate from the shared pool only when they are rebuilt.
  // Tensor ids by TensorImpl address; each entry holds a weak reference to its
  // TensorImpl (see "tensor ids").
  std::mutex ids_mu;
  FlatMap<int64_t> ids{pool()};
  int64_t next_id = 0;
  DenseMap<ViewEntry> by_view{pool()};

  StackTable stacks;

  // By autograd sequence number + 1 (keys are never 0): the latest kLinksWindow nodes'.
  std::mutex links_mu;
  RecentTable<Link> links{kLinksWindow};

  std::mutex cache_mu;
  std::pmr::unsynchronized_pool_resource cache_pool{pool()};
  // The summary rows of the latest kCacheSlots output ids, with the versions they were taken at.
  RecentTable<CachedRow> cache{kCacheSlots};
  // The ids of outputs whose memory was never written, the latest kBlankWindow of them.
  RecentTable<uint8_t> blank{kBlankWindow};
  std::pmr::unordered_map<int64_t, ValueEntry> values{&cache_pool};  // FULL_TENSOR, by tensor id

  std::mutex dev_mu;
  std::vector<std::string> devices{"cpu"};
  std::unordered_map<int64_t, int32_t> dev_index;

  std::mutex ev_mu;
  std::condition_variable ev_cv, space_cv;
  pvec<Event> events{pool()};
  pvec<Event> taken{pool()};  // drained from `events`, handed to Python a slice at a time
  size_t taken_pos = 0;
  size_t wake_at = 4096;
  size_t capacity = kCapacity;
  bool stopping = false;
  // Shedding keeps the windows of the anchor rule (docs/FORMAT.md): the `window` events
  // after an event with Inf/NaN are kept like it (`keep_after` of them still to come),
  // and the last `window` events shed wait in `ring` (under ev_mu), in order after every
  // buffered event, until an event with Inf/NaN takes them back or newer ones push them out.
  size_t window = 100;
  size_t keep_after = 0;
  std::deque<Event> ring;
  int64_t ring_bytes = 0;  // FULL_TENSOR values held in the ring (at most kRingBytesMax)
  // FULL_TENSOR: the values one event's record holds at most (set_shedding).
  std::atomic<int64_t> value_cap{int64_t(1) << 30};

  Encoder encoder;  // the drain thread's (see encode_batch)
  // Held while `taken` and the encoder are used (by encode_batch, drain, start),
  // always taken without the GIL: encode_batch holds it while it runs without the GIL.
  std::mutex drain_mu;

  std::atomic<int64_t> serial{0};
  std::atomic<int64_t> step{0};
  std::atomic<bool> warned{false};
};

// The recorder's state lives for the process once made (callbacks may still be
// running when a session ends) and is reset by the next start().
State* S = nullptr;

// Parts of the recording left out, for bench/overhead_breakdown.py's per-op cost ladder
// only (set_bench_cut): each bit is one part. 0 otherwise: one load and branch per part.
enum Cut : int { kCutAll = 1, kCutStack = 2, kCutCounts = 4, kCutPush = 8 };
std::atomic<int> g_cut{0};

// The dispatch key of the threads that record by kernel (see record_kernel).
constexpr auto kRecordKey = c10::DispatchKey::TESTING_ONLY_GenericWrapper;

// Each thread's cache of the ops table (two-way, by the name's address): an op
// seen before costs no lock. `g_ops_gen` moves whenever the table is emptied (a new
// session, an op deregistered); a thread's cache is emptied when it sees it move.
std::atomic<uint64_t> g_ops_gen{1};
struct OpSlot {
  const char* key = nullptr;
  const OpFlags* flags = nullptr;
};
constexpr size_t kOpSlots = 512;

// The recorder's per-thread state, in one thread_local: in a shared library each
// thread_local is found by a call (__tls_get_addr), and an op reads several.
struct Local {
  int depth = 0;       // recorded-op calls open on this thread
  int inflight = 0;    // this thread's callbacks counted in S->inflight
  int busy = 0;        // > 0 while nanscope itself runs ops
  int suspended = 0;   // > 0 inside a compiled graph call (compiled.py)
  bool excluded = false;
  int module = 0;
  int optimizer = 0;   // optimizer.step() or GradScaler calls running
  // After backward() returned: the autograd sequence number then, until the step
  // ends or a forward pass begins (-1 otherwise); see context.py's RunContext.
  int64_t between = -1;
  ModulesAtBackward at_backward;  // with module frames on
  int64_t last_seq = -1;
  uint64_t ops_gen = 0;
  std::array<OpSlot, kOpSlots> ops{};
};
thread_local Local tl;

struct Busy {
  Busy() { ++tl.busy; }
  ~Busy() { --tl.busy; }
};

// A callback at work: counted, so that a session is not torn down under it.
// The count goes up before the callback reads `active` (both sequentially
// consistent), so stop() either sees the callback or the callback sees that
// recording stopped.
struct InFlight {
  InFlight() {
    S->inflight.fetch_add(1);
    ++tl.inflight;
  }
  ~InFlight() {
    --tl.inflight;
    S->inflight.fetch_sub(1);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
};

// Until no callback runs on another thread, for at most `seconds`, without
// the GIL (a callback may be waiting for it); false on timeout.
bool wait_quiet(double seconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  auto quiet = [] { return S->inflight.load() <= tl.inflight; };
  if (quiet()) return true;
  py::gil_scoped_release nogil;
  while (!quiet()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// `drain_mu`, taken without the GIL (its holder may be waiting for the GIL).
std::unique_lock<std::mutex> lock_drain() {
  py::gil_scoped_release nogil;
  return std::unique_lock<std::mutex>(S->drain_mu);
}

void warn(const char* what) {
  if (!S->warned.exchange(true)) {
    std::fprintf(stderr, "nanscope: could not record an op (%s); recording goes on\n", what);
  }
}

// -- errors from the Python side ------------------------------------------------------------

PyObject* g_pending = nullptr;  // an exception to raise again in the main thread (GIL)
unsigned long g_main_thread = 0;  // Python's main thread (set by start())

int raise_pending(void*) {
  PyObject* exc = g_pending;
  g_pending = nullptr;
  if (exc == nullptr) return 0;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
  return -1;
}

// An error raised by the Python side of a callback (with the GIL). The
// dispatcher ignores what a callback throws, so an error is reported and
// recording goes on; but KeyboardInterrupt (Ctrl+C) and SystemExit (a signal
// handler calling sys.exit that ran inside the callback) belong to the
// program: they are raised again in its main thread, as soon as it runs
// Python again, instead of being lost.
void swallow(py::error_already_set& e, const char* where) {
  if (!e.matches(PyExc_Exception) && PyThread_get_thread_ident() == g_main_thread) {
    if (g_pending == nullptr) {
      g_pending = e.value().inc_ref().ptr();
      // Raised where the program is, not inside nanscope's frames.
      PyException_SetTraceback(g_pending, Py_None);
      if (Py_AddPendingCall(raise_pending, nullptr) != 0) {
        Py_CLEAR(g_pending);
        PyErr_SetInterrupt();
      }
    }
    return;
  }
  warn(e.what());
  e.discard_as_unraisable(where);
}

// Runs a part of recording an op: an error there is the recorder's, not the program's.
// It is reported (swallow: Ctrl+C and SystemExit go on to the main thread) and the op
// goes unrecorded; false then. The dispatcher would ignore what a callback throws, and a
// kernel must not throw its own errors into the program.
template <typename Part>
bool guarded(Part&& part) {
  try {
    part();
    return true;
  } catch (py::error_already_set& e) {
    py::gil_scoped_acquire gil;
    swallow(e, "nanscope: recording an op");
  } catch (const std::exception& e) {
    warn(e.what());
  } catch (...) {
    warn("unknown error");
  }
  return false;
}

// -- ops ------------------------------------------------------------------------------------

const OpFlags kNotOp = [] {
  OpFlags f;
  f.not_op = true;
  return f;
}();

// The first (even) slot of the key's pair: a key is looked for in both of its pair's
// slots, and a new one evicts the pair's older op only. (An odd home slot would make
// two ops of a pair evict each other in turn, each going to the table's lock.)
inline size_t op_slot(const char* key) {
  uint64_t h = reinterpret_cast<uintptr_t>(key) * 0x9E3779B97F4A7C15ULL;
  return static_cast<size_t>(h >> 55) & (kOpSlots - 2);
}

// The other slot of a slot's pair (slots 2k and 2k + 1).
inline size_t op_pair(const OpSlot& slot) { return static_cast<size_t>(&slot - tl.ops.data()) ^ 1; }

const OpFlags* lookup_locked_path(const char* key, const c10::OperatorName& name,
                                  const std::optional<c10::OperatorHandle>& handle);

// lookup()'s op not in the thread's cache: from the ops table, or described now.
template <typename Resolve>
NANSCOPE_COLD const OpFlags* lookup_missed(const char* key, OpSlot& slot, Resolve& resolve) {
  const OpFlags* p = nullptr;
  {
    std::lock_guard<std::mutex> g(S->ops_mu);
    auto it = S->ops.find(key);
    if (it != S->ops.end()) p = it->second;
  }
  if (p == nullptr) {
    std::optional<c10::OperatorName> name;
    std::optional<c10::OperatorHandle> handle;
    resolve(name, handle);
    p = name ? lookup_locked_path(key, *name, handle) : &kNotOp;
  }
  // Not a named range (its name's address is per call, not an op's). The slot's
  // op moves to its pair's slot (two ways: two ops of one slot do not take
  // turns at the table's lock).
  if (p != &kNotOp) {
    tl.ops[op_pair(slot)] = slot;
    slot = OpSlot{key, p};
  }
  return p;
}

// The op's flags, by an address that names it: its schema's name (what
// RecordFunction::name() gives) or its registration (entry_key, the dispatch key's
// kernel); `resolve` is called only the first time, for the op's name and handle
// (none: a named range, not an op).
template <typename Resolve>
const OpFlags* lookup(const char* key, Resolve&& resolve) {
  const uint64_t gen = g_ops_gen.load(std::memory_order_acquire);
  if (tl.ops_gen != gen) {
    tl.ops.fill(OpSlot{});
    tl.ops_gen = gen;
  }
  OpSlot& slot = tl.ops[op_slot(key)];
  if (slot.key == key) return slot.flags;
  const OpSlot& pair = tl.ops[op_pair(slot)];
  if (pair.key == key) return pair.flags;
  return lookup_missed(key, slot, resolve);
}

const OpFlags* lookup(const at::RecordFunction& fn) {
  return lookup(fn.name(), [&](std::optional<c10::OperatorName>& name,
                               std::optional<c10::OperatorHandle>& handle) {
    name = fn.operator_name();
    if (name) handle = c10::Dispatcher::singleton().findOp(*name);
  });
}

// The kernel's key: the op's registration (op_keys.h). RecordFunction's key, the
// schema's name, is read from the op's entry: a cache line the dispatcher did not
// touch, missed at every op. lookup_locked_path files an op under both.
const char* entry_key(const c10::OperatorHandle& op) {
  return static_cast<const char*>(registration_of(op));
}

const OpFlags* lookup(const c10::OperatorHandle& op) {
  return lookup(entry_key(op), [&](std::optional<c10::OperatorName>& name,
                                                std::optional<c10::OperatorHandle>& handle) {
    name = op.operator_name();
    handle = op;
  });
}

const OpFlags* lookup_locked_path(const char* key, const c10::OperatorName& name,
                                  const std::optional<c10::OperatorHandle>& handle) {
  // An op described already under its other key (a thread that records by RecordFunction
  // met it first, or one that records by the kernel): the same flags under this one too.
  const char* keys[2] = {nullptr, nullptr};
  if (handle.has_value()) {
    keys[0] = handle->schema().name().c_str();
    keys[1] = entry_key(*handle);
    std::lock_guard<std::mutex> g(S->ops_mu);
    for (const char* k : keys) {
      auto it = S->ops.find(k);
      if (it != S->ops.end()) {
        S->ops.emplace(key, it->second);
        return it->second;
      }
    }
  }
  OpFlags f;
  if (handle.has_value()) {
    f.sized = true;
    f.nargs = static_cast<uint32_t>(handle->schema().arguments().size());
    f.nrets = static_cast<uint32_t>(handle->schema().returns().size());
  }
  f.composite = handle.has_value() &&
      handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  if (!f.composite) {
    Busy busy;
    py::gil_scoped_acquire gil;
    try {
      py::tuple d = S->host.attr("describe")(name.name, name.overload_name);
      f.index = d[0].cast<int>();
      f.skip = d[1].cast<bool>();
      f.same_elements = d[2].cast<bool>();
      f.record_values = d[3].cast<bool>();
      f.collective = d[4].cast<bool>();
      f.uninitialised = d[5].cast<bool>();
      f.view = d[6].cast<bool>();
      f.value_args = d[7].cast<std::vector<int>>();
      f.name = d[8].cast<std::string>();
      f.written = d[9].cast<std::vector<int>>();
    } catch (py::error_already_set& e) {
      swallow(e, "nanscope: describing an op");
      f.skip = true;
    }
  }
  std::lock_guard<std::mutex> g(S->ops_mu);
  auto it = S->ops.find(key);
  if (it != S->ops.end()) return it->second;
  S->op_store.push_back(std::move(f));
  const OpFlags* p = &S->op_store.back();
  S->ops.emplace(key, p);
  for (const char* k : keys) {
    if (k != nullptr) S->ops.emplace(k, p);
  }
  if (p->index >= 0) {  // under ops_mu, which encode() takes to read it
    if (S->op_by_index.size() <= static_cast<size_t>(p->index)) S->op_by_index.resize(p->index + 1);
    S->op_by_index[static_cast<size_t>(p->index)] = p;
  }
  return p;
}

// -- tensor ids -----------------------------------------------------------------------------

// The id table holds a weak reference to each TensorImpl it names: its memory is not
// reused while the entry exists, so an address never names two tensors. A dead
// tensor's entry is dropped when the table is next rebuilt (see flat_map.h).
uint64_t impl_key(const c10::TensorImpl* impl) { return reinterpret_cast<uintptr_t>(impl); }
c10::TensorImpl* impl_of(uint64_t key) { return reinterpret_cast<c10::TensorImpl*>(key); }

bool alive(c10::TensorImpl* impl) { return c10::raw::weak_intrusive_ptr::use_count(impl) > 0; }

// Keeps a live tensor's id; lets a dead one's TensorImpl go.
bool keep_id(uint64_t key, int64_t&) {
  if (alive(impl_of(key))) return true;
  c10::raw::weak_intrusive_ptr::decref(impl_of(key));
  return false;
}

void drop_id(uint64_t key, int64_t&) { c10::raw::weak_intrusive_ptr::decref(impl_of(key)); }

// `impl`'s entry set to `id`; a new entry takes its weak reference.
void put_id_locked(c10::TensorImpl* impl, int64_t id) {
  bool fresh = false;
  S->ids.put(impl_key(impl), &fresh, keep_id) = id;
  if (fresh) c10::raw::weak_intrusive_ptr::incref(impl);
}

// Whether the recorded output `e` is still the live tensor it was.
bool owner_alive(const ViewEntry& e) {
  const int64_t* id = S->ids.find(impl_key(e.owner));
  return id != nullptr && *id == e.id && alive(e.owner);
}

bool has_view_key(const at::Tensor& t) {
  return t.layout() == at::kStrided && t.has_storage() && !t.is_meta();
}

// The by_view table's key for a layout (storage, offset, dtype, sizes and strides;
// never the empty slot's 0) and its second hash (another seed, other multipliers),
// together 128 bits: taken in one pass over the sizes and strides, for every output.
struct ViewKeys {
  uint64_t key;
  uint64_t layout;
};

ViewKeys view_keys(const at::Tensor& t) {
  uint64_t h = reinterpret_cast<uintptr_t>(t.storage().unsafeGetStorageImpl());
  uint64_t l = 0x84222325cbf29ce4ULL;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
  mix(static_cast<uint64_t>(t.storage_offset()));
  mix(static_cast<uint64_t>(t.scalar_type()));
  for (int64_t d : t.sizes()) {
    mix(static_cast<uint64_t>(d));
    l = (l ^ static_cast<uint64_t>(d)) * 0x100000001b3ULL + 0x7f4a7c15ULL;
  }
  for (int64_t d : t.strides()) {
    mix(static_cast<uint64_t>(d) + 0x9e3779b9ULL);
    l = (l ^ static_cast<uint64_t>(d)) * 0x9E3779B97F4A7C15ULL + 1;
  }
  return {h == FlatMap<uint32_t>::kEmpty ? 1 : h, l ^ static_cast<uint64_t>(t.dim())};
}

void remember_view_locked(const at::Tensor& t, int64_t id) {
  if (!has_view_key(t)) return;
  // A step's outputs are kept: past this many, they start over (at most about 80 MB).
  if (S->by_view.size() > (1u << 18)) S->by_view.clear(forget);
  const int64_t step = S->step.load(std::memory_order_relaxed);
  // Kept while the output lives, and until its step ends.
  auto keep = [step](uint64_t, ViewEntry& e) { return e.step >= step || owner_alive(e); };
  bool fresh = false;
  const ViewKeys k = view_keys(t);
  S->by_view.put(k.key, &fresh, keep) =
      ViewEntry{id,
                t.unsafeGetTensorImpl(),
                t.storage().unsafeGetStorageImpl(),
                t.storage().data(),
                t.storage_offset(),
                step,
                static_cast<int8_t>(t.scalar_type()),
                k.layout};
}

// The id of a recorded output that `t` is an exact alias of (same live storage,
// offset, dtype, sizes and strides), or 0.
int64_t id_by_view_locked(const at::Tensor& t) {
  if (!has_view_key(t)) return 0;
  const ViewKeys k = view_keys(t);
  const ViewEntry* e = S->by_view.find(k.key);
  if (e == nullptr) return 0;
  const void* storage = t.storage().unsafeGetStorageImpl();
  if (e->storage != storage || e->data != t.storage().data()) return 0;
  // A strong reference while its storage is read: another thread may be letting it go.
  c10::intrusive_ptr<c10::TensorImpl> owner;
  if (owner_alive(*e)) {
    owner = c10::intrusive_ptr<c10::TensorImpl>::reclaim(c10::raw::weak_intrusive_ptr::lock(e->owner));
  }
  if (owner ? owner->storage().unsafeGetStorageImpl() != storage
            : e->step != S->step.load(std::memory_order_relaxed)) {
    return 0;
  }
  if (e->offset != t.storage_offset() || e->dtype != static_cast<int8_t>(t.scalar_type()) ||
      e->layout != k.layout) {
    return 0;
  }
  return e->id;
}

int64_t new_id_locked(const at::Tensor& t) {
  int64_t id = ++S->next_id;
  remember_view_locked(t, id);
  put_id_locked(t.unsafeGetTensorImpl(), id);
  return id;
}

int64_t get_id_locked(const at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const int64_t* known = S->ids.find(impl_key(impl));
  if (known != nullptr && alive(impl)) return *known;
  int64_t id = id_by_view_locked(t);
  if (id != 0) {
    put_id_locked(impl, id);
    return id;
  }
  return new_id_locked(t);
}

// -- stacks ---------------------------------------------------------------------------------

// A new stack: the Python side interns its frames (and snapshots new files).
const StackTable::Intern intern_stack = [](py::list frames) {
  Busy busy;
  return S->host.attr("new_stack")(frames).cast<int>();
};
// New modules called: the Python side names their path.
const StackTable::InternModules intern_modules = [](py::list called) {
  Busy busy;
  return S->host.attr("module_index")(called).cast<int>();
};
const StackTable::Failed interning_failed = [](py::error_already_set& e) {
  swallow(e, "nanscope: interning a stack");
};

// Where the calling thread runs: its stack and, with module frames on, its module.
Place capture_place() {
  return S->stacks.place(intern_stack, module_frames_on() ? &intern_modules : nullptr, interning_failed);
}

// -- summaries ------------------------------------------------------------------------------

// FULL_HEALTH's slots (tfdbg2's layout): the tensor's id (-1: not kept), its
// device (-1), dtype, rank and size, then the counts of -inf, +inf, NaN,
// negative, zero and positive finite values.
void full_head(double* row, int dtype, const at::Tensor& t) {
  row[0] = -1;
  row[1] = -1;
  row[2] = dtype;
  row[3] = static_cast<double>(t.dim());
  row[4] = static_cast<double>(t.numel());
}

void full_counts(double* row, int64_t n, const Counts& c, const Special& s) {
  row[5] = static_cast<double>(s.ninf);
  row[6] = static_cast<double>(s.pinf);
  row[7] = static_cast<double>(s.nan);
  row[8] = static_cast<double>(c.neg - s.ninf);
  row[9] = static_cast<double>(c.zero);
  row[10] = static_cast<double>(n - c.neg - c.zero - s.nan - s.pinf);
}

// The tensor whose memory holds `t`'s values: `t` itself, or for vmap's batched
// wrapper (no memory of its own) the tensor it holds, the whole batch, through every
// level, kept in `holder`. (torch.func.grad's wrapper is left alone: its header needs a
// library that PyTorch does not ship.)
const at::Tensor& with_memory(const at::Tensor& t, at::Tensor& holder) {
  if (t.has_storage()) return t;
  const at::Tensor* at_level = &t;
  while (!at_level->has_storage()) {
    auto* batched = at::functorch::maybeGetBatchedImpl(*at_level);
    if (batched == nullptr) break;
    at::Tensor inner = batched->value();  // a copy: holder may own the batched wrapper
    holder = std::move(inner);
    at_level = &holder;
  }
  return *at_level;
}

// The summary row of a CPU tensor; false when the mode skips it.
bool summarize(const at::Tensor& t, double* row) {
  int st = static_cast<int>(t.scalar_type());
  int mode = S->mode;
  if (mode == kShape) {
    if (st >= 64 || S->dtype_enum[st] < 0) return false;
    row[0] = -1;
    row[1] = S->dtype_enum[st];
    row[2] = static_cast<double>(t.dim());
    row[3] = static_cast<double>(t.numel());
    auto sizes = t.sizes();
    int64_t k = std::min<int64_t>(6, static_cast<int64_t>(sizes.size()));
    int64_t first = static_cast<int64_t>(sizes.size()) - k;
    for (int64_t i = 0; i < 6; ++i) row[4 + i] = i < k ? static_cast<double>(sizes[first + i]) : 0.0;
    return true;
  }
  if (st >= 64 || !S->dtype_float[st]) return false;
  Counts c;
  Special s;
  bool special = mode != kCurt;
  const bool ranges = mode == kFull && S->width >= kFullRecorded;
  if (!count_tensor(t, &c, &s, special, ranges)) return false;
  int64_t n = t.numel();
  switch (mode) {
    case kCurt:
      row[0] = -1;
      row[1] = c.bad > 0 ? 1.0 : 0.0;
      return true;
    case kConcise:
      row[0] = -1;
      row[1] = static_cast<double>(n);
      row[2] = static_cast<double>(s.ninf);
      row[3] = static_cast<double>(s.pinf);
      row[4] = static_cast<double>(s.nan);
      return true;
    default:
      full_head(row, S->dtype_enum[st], t);
      full_counts(row, n, c, s);
      if (ranges) {
        row[11] = c.hi;  // the ranges: the encoder writes them to output_ranges
        row[12] = c.lo;
      }
      if (S->width == kFullStatistics) {
        // The statistics (nanscope.format.statistics): the encoder writes them to
        // output_statistics; NaN where this layout is not walked.
        Statistics st;
        if (tensor_statistics(t, &st)) {
          row[13] = st.mean, row[14] = st.std, row[15] = st.l2, row[16] = st.hash;
        } else {
          row[13] = row[14] = row[15] = row[16] = std::nan("");
        }
      }
      return true;
  }
}

bool nonfinite(const double* row) {
  switch (S->mode) {
    case kFull: return row[5] + row[6] + row[7] > 0;
    case kConcise: return row[2] + row[3] + row[4] > 0;
    case kCurt: return row[1] != 0;
    default: return false;
  }
}

int64_t version_of(const at::Tensor& t) {
  if (t.is_inference()) return -1;
  return static_cast<int64_t>(t._version());
}

void remember(int64_t tid, const at::Tensor& t, const double* row) {
  int64_t v = version_of(t);
  if (v < 0) return;
  std::lock_guard<std::mutex> g(S->cache_mu);
  CachedRow& e = S->cache.put(static_cast<uint64_t>(tid));
  e.version = v;
  std::copy(row, row + S->width, e.values.begin());
}

// A same-element view of a tensor summarised since its last write: its summary.
bool from_cache(int64_t source_id, const at::Tensor& source, const at::Tensor& t, double* row) {
  int64_t v = version_of(source);
  if (v < 0) return false;
  std::lock_guard<std::mutex> g(S->cache_mu);
  const CachedRow* e = S->cache.find(static_cast<uint64_t>(source_id));
  if (e == nullptr || e->version != v) return false;
  std::copy(e->values.begin(), e->values.begin() + S->width, row);
  if (S->mode == kFull) row[3] = static_cast<double>(t.dim());
  return true;
}

// -- recording ------------------------------------------------------------------------------

int32_t device_index(const at::Tensor& t) {
  if (t.is_cpu()) return 0;
  c10::Device d = t.device();
  int64_t key = (static_cast<int64_t>(d.type()) << 16) | (static_cast<int64_t>(d.index()) + 1);
  std::lock_guard<std::mutex> g(S->dev_mu);
  auto it = S->dev_index.find(key);
  if (it != S->dev_index.end()) return it->second;
  int32_t idx = static_cast<int32_t>(S->devices.size());
  S->devices.push_back(d.str());
  S->dev_index[key] = idx;
  return idx;
}

// Python objects for tensors, as new tensors sharing their storage: giving
// the op's own tensor a Python object now would break code that is about to
// give it one of its own (nn.Parameter, tensor subclasses).
py::list py_tensors(const Tensors& ts) {
  py::list l;
  for (const auto& t : ts) {
    // A vmap wrapper has no data to share: the batch it wraps stands for it.
    at::Tensor holder;
    l.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(with_memory(t, holder).variable_data())));
  }
  return l;
}

// How long an op waits for room in a full buffer before its event is let go.
constexpr auto kFullWait = std::chrono::milliseconds(200);

// An event's Python objects let go; the caller holds the GIL.
void clear_python(Event& ev) {
  Py_CLEAR(ev.parts);
  Py_CLEAR(ev.inputs);
  Py_CLEAR(ev.collective);
}

// The same from a thread that may not hold the GIL (taken only if there is something to let go).
NANSCOPE_COLD void release_python(Event& ev) {
  if (ev.parts == nullptr && ev.inputs == nullptr && ev.collective == nullptr) return;
  py::gil_scoped_acquire gil;
  clear_python(ev);
}

// Drops an event that will not be buffered, with the Python objects it owns.
void drop(Event& ev, bool nonfinite = false) {
  S->dropped.fetch_add(1);
  if (nonfinite) S->dropped_nonfinite.fetch_add(1);
  release_python(ev);
}

// Whether the FULL_TENSOR values held by other events than one holding `own` bytes are
// past `bound` (push's test of a full buffer, and shed_when_full's).
bool others_values_past(int64_t own, int64_t bound) {
  return g_value_bytes.load(std::memory_order_relaxed) - own > bound;
}

// push()'s full buffer: waits a while for the drain (never while holding the GIL),
// then sheds `ev` (into the ring, or for good) if there is still no room. Returns
// whether `ev` was shed; otherwise push() buffers it.
NANSCOPE_COLD bool shed_when_full(std::unique_lock<std::mutex>& lk, Event& ev, bool bad, bool keep) {
  const size_t limit = keep ? 2 * S->capacity : S->capacity;
  // Others' values: one tensor larger than the bound still goes, once the rest is written.
  const int64_t own = ev.values ? ev.values->nbytes : 0;
  auto heavy = [own] { return others_values_past(own, kValueBytesMax); };
  // An event of a window after an Inf/NaN (not one itself) may use a second bound's worth.
  auto too_heavy = [own, bad] { return !bad && others_values_past(own, 2 * kValueBytesMax); };
  S->ev_cv.notify_all();
  if (!PyGILState_Check()) {
    // The drain frees taken values when it next refills: values count until then.
    S->space_cv.wait_for(lk, kFullWait, [&] {
      return (S->events.size() < S->capacity && !(ev.values && heavy())) || S->stopping;
    });
  }
  if ((S->events.size() >= limit || (ev.values && heavy() && (!keep || too_heavy()))) &&
      !S->stopping) {
    if (keep || S->window == 0) {  // past twice the capacity even so
      lk.unlock();
      drop(ev, bad);
      return true;
    }
    // Shed, for now: the window before the next event with Inf/NaN may want it.
    S->ring_bytes += own;
    S->ring.push_back(std::move(ev));
    std::vector<Event> out;
    while (!S->ring.empty() && (S->ring.size() > S->window || S->ring_bytes > kRingBytesMax)) {
      Event& old = S->ring.front();
      S->ring_bytes -= old.values ? old.values->nbytes : 0;
      out.push_back(std::move(old));
      S->ring.pop_front();
    }
    lk.unlock();
    for (Event& old : out) drop(old);
    return true;
  }
  return false;
}

// Buffers an event for the drain thread. Memory stays bounded and the
// program never waits long: past the capacity an op waits up to kFullWait
// for the drain thread (not at all while holding the GIL, which the drain
// thread needs), then its event is shed and counted. An event with
// Inf/NaN (`bad`) may use a second capacity's worth of room, so the origin
// survives a slow drain, and so may the `window` events after it; the last
// `window` events shed (at most kRingBytesMax of values) wait in the ring,
// which the next event with Inf/NaN takes back (the window before it) and the
// next event buffered otherwise takes too (in order: the ring's events came first).
// FULL_TENSOR values count too: past kValueBytesMax bytes the buffer is full
// (for the events of a window after an Inf/NaN, past twice that).
// Returns whether the event was buffered.
bool push(Event&& ev, bool bad) {
  std::unique_lock<std::mutex> lk(S->ev_mu);
  const bool keep = bad || S->keep_after > 0;
  if (bad) {
    S->keep_after = S->window;
  } else if (S->keep_after > 0) {
    --S->keep_after;
  }
  const bool full = S->events.size() >= S->capacity ||
                    (ev.values && others_values_past(ev.values->nbytes, kValueBytesMax));
  if (full && !S->stopping && shed_when_full(lk, ev, bad, keep)) return false;
  // The ring's events came before this one: they go first (an event with Inf/NaN
  // takes them as its window; any other, now that there is room again).
  while (!S->ring.empty()) {
    S->events.push_back(std::move(S->ring.front()));
    S->ring.pop_front();
  }
  S->ring_bytes = 0;
  S->events.push_back(std::move(ev));
  if (S->events.size() >= S->wake_at) S->ev_cv.notify_all();
  return true;
}

// -- FULL_TENSOR values ---------------------------------------------------------------------

// The DataType a CPU tensor's values are written as, and their element size
// there; 0 for a dtype left to the Python side (complex, float8, unsigned
// beyond uint8, quantized). bfloat16 is widened to float32, as the Python
// side writes it (numpy has no bfloat16).
int value_dtype(at::ScalarType st, int64_t* itemsize) {
  switch (st) {
    case at::kFloat: *itemsize = 4; return 1;      // DT_FLOAT
    case at::kDouble: *itemsize = 8; return 2;     // DT_DOUBLE
    case at::kInt: *itemsize = 4; return 3;        // DT_INT32
    case at::kByte: *itemsize = 1; return 4;       // DT_UINT8
    case at::kShort: *itemsize = 2; return 5;      // DT_INT16
    case at::kChar: *itemsize = 1; return 6;       // DT_INT8
    case at::kLong: *itemsize = 8; return 9;       // DT_INT64
    case at::kBool: *itemsize = 1; return 10;      // DT_BOOL
    case at::kBFloat16: *itemsize = 4; return 1;   // widened to DT_FLOAT
    case at::kHalf: *itemsize = 2; return 19;      // DT_HALF
    default: return 0;
  }
}

struct Widen {  // bfloat16 bits to float32: the value is exact
  float operator()(uint16_t b) const {
    uint32_t w = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &w, sizeof f);
    return f;
  }
};
struct Same {
  template <typename T>
  T operator()(T v) const { return v; }
};

// The elements of a strided layout in C order (the last dimension fastest),
// read in place: no op is dispatched (the program's own dispatch modes would
// see it) and nothing but `out` is written.
template <typename Src, typename Dst, typename Conv>
void gather(const Src* base, c10::IntArrayRef sizes, c10::IntArrayRef strides, Dst* out, Conv conv) {
  const int64_t rank = static_cast<int64_t>(sizes.size());
  if (rank == 0) {
    *out = conv(*base);
    return;
  }
  const int64_t inner = sizes[rank - 1], step = strides[rank - 1];
  int64_t outer = 1;
  for (int64_t d = 0; d + 1 < rank; ++d) outer *= sizes[d];
  c10::SmallVector<int64_t, 8> at(static_cast<size_t>(rank), 0);
  const Src* p = base;
  for (int64_t o = 0; o < outer; ++o) {
    if (step == 1 && std::is_same_v<Conv, Same>) {
      std::memcpy(out, p, sizeof(Src) * static_cast<size_t>(inner));
    } else {
      for (int64_t i = 0; i < inner; ++i) out[i] = conv(p[i * step]);
    }
    out += inner;
    for (int64_t d = rank - 2; d >= 0; --d) {  // the odometer over the outer dimensions
      if (++at[d] < sizes[d]) {
        p += strides[d];
        break;
      }
      p -= strides[d] * (sizes[d] - 1);
      at[d] = 0;
    }
  }
}

// Copies a CPU tensor's values, C order, into `out` (numel elements of its value dtype).
void copy_out(const at::Tensor& t, char* out) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const char* src = static_cast<const char*>(t.const_data_ptr());
  const bool dense = t.is_contiguous();
  if (t.scalar_type() == at::kBFloat16) {
    const auto* p = reinterpret_cast<const uint16_t*>(src);
    auto* q = reinterpret_cast<float*>(out);
    if (dense) {
      Widen w;
      for (int64_t i = 0; i < n; ++i) q[i] = w(p[i]);
    } else {
      gather(p, t.sizes(), t.strides(), q, Widen{});
    }
    return;
  }
  const int64_t size = static_cast<int64_t>(t.element_size());
  if (dense) {
    std::memcpy(out, src, static_cast<size_t>(n * size));
    return;
  }
  switch (size) {
    case 1: gather(reinterpret_cast<const uint8_t*>(src), t.sizes(), t.strides(), reinterpret_cast<uint8_t*>(out), Same{}); break;
    case 2: gather(reinterpret_cast<const uint16_t*>(src), t.sizes(), t.strides(), reinterpret_cast<uint16_t*>(out), Same{}); break;
    case 4: gather(reinterpret_cast<const uint32_t*>(src), t.sizes(), t.strides(), reinterpret_cast<uint32_t*>(out), Same{}); break;
    default: gather(reinterpret_cast<const uint64_t*>(src), t.sizes(), t.strides(), reinterpret_cast<uint64_t*>(out), Same{}); break;
  }
}

// Whether this recorder copies `t`'s values itself (else the Python side does).
bool copyable(const at::Tensor& t) {
  int64_t size = 0;
  if (!t.is_cpu() || t.layout() != at::kStrided || t.is_neg() || t.is_conj() ||
      value_dtype(t.scalar_type(), &size) == 0 || !t.has_storage()) {
    return false;
  }
  for (int64_t s : t.strides()) {
    if (s < 0) return false;
  }
  return t.numel() == 0 || t.const_data_ptr() != nullptr;
}

// A FULL_HEALTH-layout row of a value's counts, for the index and the range
// history (what nanscope.format.health.of_array and headroom.of_value say of
// the values as written): ranges NaN for a view (its values are counted once,
// under the op that made them) and for a type without them.
void value_row(const at::Tensor& t, int dtype, bool view, double* row) {
  const int64_t n = t.numel();
  std::fill(row, row + kFullRecorded, 0.0);
  full_head(row, dtype, t);
  row[11] = row[12] = std::nan("");
  Counts c;
  Special s;
  if (!count_tensor(t, &c, &s, true, !view)) {
    return;  // not a float type: no Inf/NaN, no sign counts in the index
  }
  full_counts(row, n, c, s);
  if (!view) {
    row[11] = c.hi;
    row[12] = c.lo;
  }
}

// A value to remember once its event is buffered (see ValueEntry).
struct Pending {
  int64_t id;
  ValueEntry entry;
};

// The values of a FULL_TENSOR op's outputs, copied here; false (nothing
// kept) when some output needs the Python side. An output of a view op whose
// input's values were recorded and not written since gets a reference to
// them instead of a copy. `pending`: what to remember once the event is
// buffered (a view's reference must never name an event that is not).
bool copy_values(const OpFlags& op, const Ctx& c, const Tensors& outs, Event& ev,
                 c10::SmallVector<Pending, 4>& pending) {
  if (op.collective) return false;  // its tag makes the Python side write it
  const size_t n = outs.size();
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = outs[i];
    int st = static_cast<int>(t.scalar_type());
    if (st >= 64 || !S->dtype_ok[st] || t.is_meta()) continue;
    if (!copyable(t)) return false;
  }
  auto vals = std::make_unique<Values>();
  vals->outs.resize(n);
  ev.sums.assign(n * kFullRecorded, 0.0);
  const bool may_view = op.view && !c.ins.empty() && !ev.in_ids.empty();
  int64_t base_version = may_view ? version_of(c.ins[0]) : -1;
  ValueEntry base{};
  bool have_base = false;
  if (base_version >= 0) {
    std::lock_guard<std::mutex> g(S->cache_mu);
    auto it = S->values.find(ev.in_ids[0]);
    if (it != S->values.end() && it->second.version == base_version) {
      base = it->second;
      have_base = true;
    }
  }
  int64_t total = 0;
  int64_t budget = S->value_cap.load(std::memory_order_relaxed);  // values one record holds
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& t = outs[i];
    int st = static_cast<int>(t.scalar_type());
    if (st >= 64 || !S->dtype_ok[st] || t.is_meta()) continue;
    TensorValue& v = vals->outs[i];
    int64_t item = 0;
    v.dtype = value_dtype(t.scalar_type(), &item);
    v.rank = static_cast<int32_t>(t.dim());
    v.dims_at = static_cast<int64_t>(vals->dims.size());
    for (int64_t d : t.sizes()) vals->dims.push_back(d);
    const int64_t numel = t.numel();
    if (have_base && numel > 0 && base.storage == t.storage().unsafeGetStorageImpl() &&
        base.dtype == static_cast<int8_t>(t.scalar_type())) {
      // Every element the view reads lies in the root's values (strides are >= 0).
      int64_t first = t.storage_offset() - base.root_offset, last = first;
      for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
      // A broadcast may hold more elements than its base: up to what a reader
      // fills (nanscope.format.tensors.MAX_FILL_ELEMENTS).
      if (first >= 0 && last < base.root_numel &&
          numel <= std::max<int64_t>(base.root_numel, int64_t(1) << 20)) {
        v.kind = TensorValue::kView;
        v.of_serial = base.root_serial;
        v.of_slot = base.root_slot;
        v.offset = first;
        for (int64_t d : t.strides()) vals->dims.push_back(d);
        value_row(t, v.dtype, true, ev.sums.data() + i * kFullRecorded);
        ev.has[i] = 1;
        int64_t version = version_of(t);
        if (version >= 0) pending.push_back({ev.out_ids[i], ValueEntry{version, base.storage, base.dtype, base.root_serial, base.root_slot, base.root_offset, base.root_numel}});
        continue;
      }
    }
    if (numel * item > budget) {
      // Past the record's bound: not copied; its shape, C-order strides and counts
      // (taken from the tensor itself) are written instead (see encoder.cpp).
      v.kind = TensorValue::kOmitted;
      int64_t stride = 1;
      std::vector<int64_t> strides(static_cast<size_t>(t.dim()));
      for (int64_t d = t.dim() - 1; d >= 0; --d) {
        strides[static_cast<size_t>(d)] = stride;
        stride *= t.size(d);
      }
      for (int64_t s : strides) vals->dims.push_back(s);
      value_row(t, v.dtype, false, ev.sums.data() + i * kFullRecorded);
      ev.has[i] = 1;
      continue;
    }
    budget -= numel * item;
    v.kind = TensorValue::kBytes;
    v.begin = total;
    v.nbytes = numel * item;
    total += v.nbytes;
  }
  if (!vals->allocate(total)) {  // out of memory: the Python side may still manage
    ev.has.assign(n, 0);
    ev.sums.clear();
    pending.clear();
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    TensorValue& v = vals->outs[i];
    if (v.kind != TensorValue::kBytes) continue;
    const at::Tensor& t = outs[i];
    copy_out(t, vals->bytes + v.begin);
    value_row(t, v.dtype, false, ev.sums.data() + i * kFullRecorded);
    ev.has[i] = 1;
    int64_t version = version_of(t);
    if (version >= 0 && t.is_contiguous() && t.numel() > 0) {
      pending.push_back({ev.out_ids[i],
                         ValueEntry{version, t.storage().unsafeGetStorageImpl(),
                                    static_cast<int8_t>(t.scalar_type()), -1,
                                    static_cast<int32_t>(i), t.storage_offset(), t.numel()}});
    }
  }
  ev.values = std::move(vals);
  return true;
}

// Remembers the values of a buffered event (see copy_values).
void remember_values(const c10::SmallVector<Pending, 4>& pending, int64_t serial) {
  if (pending.empty()) return;
  std::lock_guard<std::mutex> g(S->cache_mu);
  if (S->values.size() > kValuesMax) S->values.clear();
  for (const Pending& p : pending) {
    ValueEntry e = p.entry;
    if (e.root_serial < 0) e.root_serial = serial;
    S->values.insert_or_assign(p.id, e);
  }
}

// -- the rare parts of recording an op ------------------------------------------------------
//
// A tiny op's recording is bound by instruction fetch: the program's own code (Python's,
// PyTorch's) evicts the recorder's from the instruction cache between two ops, so each
// cache line of code an op runs through is fetched again. The parts below run for few
// ops; out of line and cold, they are laid out away from the common path (GCC puts
// what calls a cold function in the function's cold part), which then spans fewer lines.
// (push's full buffer is one such part too: shed_when_full.)

// A torch.distributed operation (few per step): the Python side numbers it in its
// group's order, and waits for a collective whose outputs it summarises.
NANSCOPE_COLD PyObject* collective_tag(const OpFlags& op, const Ctx& c,
                                       c10::ArrayRef<c10::IValue> returned_values, bool values) {
  py::gil_scoped_acquire gil;
  const auto& fin = c.args;
  const auto& fout = returned_values;
  py::tuple in(fin.size()), out(fout.size());
  for (size_t i = 0; i < fin.size(); ++i) in[i] = torch::jit::toPyObject(fin[i]);
  for (size_t i = 0; i < fout.size(); ++i) out[i] = torch::jit::toPyObject(fout[i]);
  py::object t = S->host.attr("collective")(op.index, in, out, values);
  return t.is_none() ? nullptr : t.release().ptr();
}

// Outputs the C++ half does not summarise (off the CPU, not strided, FULL_TENSOR's
// left to Python): Python's summaries, as the event's `parts`.
NANSCOPE_COLD void summaries_in_python(Event& ev, const Tensors& outs, const std::vector<size_t>& in_python) {
  py::gil_scoped_acquire gil;
  py::list which;
  for (size_t i : in_python) which.append(i);
  py::object parts = S->host.attr("summaries")(py_tensors(outs), which);
  for (size_t i : in_python) ev.has[i] = 2;
  ev.parts = parts.release().ptr();
}

// The rare case worth the cost: what went into an op that made Inf/NaN.
NANSCOPE_COLD void inputs_of_nonfinite(Event& ev, const OpFlags& op, const Ctx& c, const Tensors& outs) {
  py::gil_scoped_acquire gil;
  py::list vals;
  for (double v : c.values) vals.append(v);
  py::list mutated;  // an input that is also an output holds the result now
  for (const auto& t : c.ins) {
    bool same = false;
    for (const auto& o : outs) same = same || o.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
    mutated.append(same);
  }
  py::object ins = S->host.attr("input_summaries")(op.index, py_tensors(c.ins), mutated, vals);
  ev.inputs = ins.release().ptr();
  ev.extra_inputs = static_cast<int32_t>(c.values.size());
  for (size_t i = 0; i < c.values.size(); ++i) ev.in_ids.push_back(0);
}

NANSCOPE_COLD void forward_began() {
  py::gil_scoped_acquire gil;
  S->host.attr("forward_began")();
}

void record(c10::ArrayRef<c10::IValue> returned_values, Ctx& c) {
  Busy busy;
  const OpFlags& op = *c.op;
  Tensors outs;
  for (const c10::IValue& v : returned_values) tensors_of(v, outs);
  // What it wrote and does not return (_foreach_mul_ and _fused_adamw_ return nothing):
  // outputs too, new versions of those tensors.
  const size_t returned = outs.size();
  for (const at::Tensor& t : c.written) {
    bool found = false;
    for (size_t j = 0; j < returned && !found; ++j) {
      found = outs[j].unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
    }
    if (!found) outs.push_back(t);
  }
  const int mode = S->mode;
  const bool values = mode != kNoTensor && op.record_values;

  PyObject* tag = op.collective ? collective_tag(op, c, returned_values, values && mode != kShape) : nullptr;

  Event ev;
  ev.collective = tag;
  ev.op = op.index;
  ev.flags = &op;
  ev.wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    std::lock_guard<std::mutex> g(S->ids_mu);
    ev.in_ids.reserve(c.ins.size());
    for (const auto& t : c.ins) ev.in_ids.push_back(get_id_locked(t));
    ev.out_ids.reserve(outs.size());
    for (const auto& t : outs) ev.out_ids.push_back(new_id_locked(t));
  }
  ev.out_dev.reserve(outs.size());
  for (const auto& t : outs) ev.out_dev.push_back(device_index(t));
  ev.has.assign(outs.size(), 0);

  bool blank = false;
  if (op.uninitialised || op.view) {
    std::lock_guard<std::mutex> g(S->cache_mu);
    blank = op.uninitialised ||
            (!ev.in_ids.empty() && S->blank.find(static_cast<uint64_t>(ev.in_ids[0])) != nullptr);
    if (blank) {
      for (int64_t id : ev.out_ids) S->blank.put(static_cast<uint64_t>(id)) = 1;
    }
  }

  bool bad = false;
  c10::SmallVector<Pending, 4> pending;  // FULL_TENSOR values to remember once buffered
  if (values && !blank && mode == kFullTensor && copy_values(op, c, outs, ev, pending)) {
    // Copied here; the encoder writes them.
  } else if (values && !blank) {
    const int w = S->width;
    ev.sums.assign(outs.size() * w, 0.0);
    std::vector<size_t> in_python;
    for (size_t i = 0; i < outs.size(); ++i) {
      // Under vmap an output is a wrapper without memory of its own: its values are
      // those of the tensor it wraps, the whole batch's.
      at::Tensor holder;
      const at::Tensor& t = with_memory(outs[i], holder);
      int st = static_cast<int>(t.scalar_type());
      if (st >= 64 || !S->dtype_ok[st]) continue;
      if (!t.has_storage() && t.is_cpu() && t.layout() == at::kStrided) continue;  // another wrapper
      if (mode == kFullTensor || !t.is_cpu() || t.layout() != at::kStrided) {
        if (!t.is_meta()) in_python.push_back(i);
        continue;
      }
      double* row = ev.sums.data() + i * w;
      bool got = false;
      if (op.same_elements && !c.ins.empty() && mode != kShape) {
        got = from_cache(ev.in_ids[0], c.ins[0], t, row);
      }
      if (!got && !(g_cut.load(std::memory_order_relaxed) & kCutCounts)) {
        got = summarize(t, row);
        if (got && mode != kShape) remember(ev.out_ids[i], t, row);
      }
      if (got) {
        ev.has[i] = 1;
        bad = bad || nonfinite(row);
        // A view's values are its input's: their ranges belong to the op that made them.
        if (op.view && w >= kFullRecorded) row[kFullSlots] = row[kFullSlots + 1] = std::nan("");
      }
    }
    if (!in_python.empty()) summaries_in_python(ev, outs, in_python);
  }
  if (c.before != nullptr) {
    ev.inputs = c.before;  // a distributed operation's inputs, as they were sent
    c.before = nullptr;
  } else if (bad) {
    inputs_of_nonfinite(ev, op, c, outs);
  }

  auto node = torch::autograd::get_current_node();
  const Place place = (g_cut.load(std::memory_order_relaxed) & kCutStack) ? Place{} : capture_place();
  if (tl.between >= 0 && !tl.optimizer && !node &&
      (static_cast<int64_t>(at::sequence_number::peek()) != tl.between ||
       tl.at_backward.left_by(place.modules))) {
    // The first op that autograd recorded since backward() returned, or the first
    // inside a module called since (with module frames on; the hooks say so
    // otherwise): a forward pass began. Python ends the update phase (and the
    // step, for updates made by hand) and sets tl.between and the step through
    // the mirror.
    forward_began();
  }
  ev.phase = (tl.optimizer || tl.between >= 0) ? kPhaseOptimizer
                                               : (node ? kPhaseBackward : kPhaseForward);
  if (node) {
    std::lock_guard<std::mutex> g(S->links_mu);
    if (const Link* link = S->links.find(node->sequence_nr() + 1)) {
      ev.fwd_serial = link->serial;
      ev.fwd_stack = link->stack;
      ev.fwd_module = link->module;
      ev.module = link->module;
    }
  } else {
    ev.module = module_frames_on() ? place.module : tl.module;
  }
  ev.stack = place.stack;
  ev.step = S->step.load(std::memory_order_relaxed);
  ev.serial = ++S->serial;
  if (!node && ev.phase != kPhaseOptimizer) {
    int64_t cur = static_cast<int64_t>(at::sequence_number::peek());
    if (cur != tl.last_seq) {
      tl.last_seq = cur;
      bool grad = false;
      if (c10::GradMode::is_enabled()) {
        for (const auto& t : c.ins) grad = grad || t.requires_grad();
      }
      if (grad) {
        ev.link_target = true;
        // The links of the last kLinksWindow autograd nodes are kept (a backward op
        // looks up its node's; the sequence numbers are the thread's own).
        std::lock_guard<std::mutex> g(S->links_mu);
        S->links.put(static_cast<uint64_t>(cur)) = Link{ev.serial, ev.stack, ev.module};
      }
    }
  }
  // bench/overhead_breakdown.py's cut of the push: the event is let go here.
  if (g_cut.load(std::memory_order_relaxed) & kCutPush) return release_python(ev);
  const int64_t serial = ev.serial;
  if (push(std::move(ev), bad)) remember_values(pending, serial);
}

// A wrapped number's value, read from memory: an op (item()) here would pass
// through any Python dispatch mode the user has on.
bool wrapped_value(const at::Tensor& t, double* out) {
  if (!t.is_cpu() || t.numel() != 1 || t.const_data_ptr() == nullptr) return false;
  switch (t.scalar_type()) {
    case at::kDouble: *out = *t.const_data_ptr<double>(); return true;
    case at::kFloat: *out = *t.const_data_ptr<float>(); return true;
    case at::kLong: *out = static_cast<double>(*t.const_data_ptr<int64_t>()); return true;
    case at::kInt: *out = static_cast<double>(*t.const_data_ptr<int32_t>()); return true;
    default: return false;  // bool and complex numbers: not values that explain Inf/NaN
  }
}

std::unique_ptr<at::ObserverContext> start_op(const at::RecordFunction& fn);
void begin_op(const OpFlags* op, c10::ArrayRef<c10::IValue> inputs, Ctx& c);

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (tl.busy || tl.excluded || S == nullptr || !S->active.load(std::memory_order_relaxed) ||
      c10::impl::tls_is_dispatch_key_included(kRecordKey)) {  // recorded by record_kernel
    return nullptr;
  }
  InFlight counted;
  if (!S->active.load() || (g_cut.load(std::memory_order_relaxed) & kCutAll)) return nullptr;
  std::unique_ptr<at::ObserverContext> c;
  guarded([&] { c = start_op(fn); });
  return c;
}

std::unique_ptr<at::ObserverContext> start_op(const at::RecordFunction& fn) {
  const OpFlags* op = lookup(fn);
  if (op->not_op || op->composite) return nullptr;
  // Called inside an op that is recorded or left out (its kernel's own ops): never
  // recorded, and needs no context (nothing to undo at its end).
  if (tl.depth > 0) return nullptr;
  auto c = std::make_unique<Ctx>();
  ++tl.depth;
  if (tl.suspended > 0 || op->skip || !S->active.load()) return c;
  begin_op(op, c10::ArrayRef<c10::IValue>(fn.inputs().data(), fn.inputs().size()), *c);
  return c;
}

// What an op to record brings (its input tensors, the values that explain an Inf/NaN,
// the tensors it writes into), kept in `c` until it has run.
void begin_op(const OpFlags* op, c10::ArrayRef<c10::IValue> inputs, Ctx& c) {
  c.record = true;
  c.session = S->session.load(std::memory_order_relaxed);
  c.op = op;
  if (op->collective) c.args.assign(inputs.begin(), inputs.end());
  size_t vi = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    bool value_pos = false;
    while (vi < op->value_args.size() && op->value_args[vi] < static_cast<int>(i)) ++vi;
    if (vi < op->value_args.size() && op->value_args[vi] == static_cast<int>(i)) value_pos = true;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      // A Python number given to an op arrives as a "wrapped number" tensor;
      // as in a dispatch mode, it is a value, not a tensor with an id.
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
        if (value_pos) {
          double value = 0;
          if (wrapped_value(t, &value)) c.values.push_back(value);
        }
        continue;
      }
      c.ins.push_back(t);
    } else if (v.isDouble()) {
      if (value_pos) c.values.push_back(v.toDouble());
    } else if (v.isInt()) {
      if (value_pos) c.values.push_back(static_cast<double>(v.toInt()));
    } else {
      tensors_of(v, c.ins);
    }
  }
  for (int i : op->written) {  // the schema's positions: fn.inputs() holds every argument
    const size_t at = static_cast<size_t>(i);
    if (at < inputs.size()) tensors_of(inputs[at], c.written);
  }
  const int mode = S->mode;
  if (op->collective && op->record_values && mode != kNoTensor && mode != kShape && !c.ins.empty()) {
    // Few per step: what this rank sends, before the collective overwrites it.
    py::gil_scoped_acquire gil;
    try {
      py::object sent = S->host.attr("sent")(op->index, py_tensors(c.ins));
      if (!sent.is_none()) c.before = sent.release().ptr();
    } catch (py::error_already_set& e) {
      swallow(e, "nanscope: summarising a collective's inputs");
    }
  }
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  --tl.depth;
  Ctx* c = static_cast<Ctx*>(ctx);
  if (!c->record || S == nullptr || !S->active.load(std::memory_order_relaxed)) return;
  InFlight counted;
  if (!S->active.load() || S->session.load() != c->session) return;
  // The op threw (the guard's destructor runs while unwinding): it produced
  // nothing, and Python must not run while its error is on its way up.
  if (std::uncaught_exceptions() > 0) return;
  guarded([&] { record(c10::ArrayRef<c10::IValue>(fn.outputs().data(), fn.outputs().size()), *c); });
}

// -- the dispatch key -----------------------------------------------------------------------

// A thread that nanscope knows (the one that started recording, threads started
// since, and the autograd engine's threads, which take the key set and the
// RecordFunction switch of the thread that called backward) records through a
// kernel for this key instead: a boxed fallback for a mode key above autograd that
// no tensor carries, included in the thread's dispatch key set. Only the ops a
// dispatch mode would see reach it (the ops inside a recorded op's kernel run with
// the key excluded), where the RecordFunction callback is called, and has every
// argument boxed, for each of the dispatcher's calls. RecordFunction is switched
// off on such a thread, so that its ops are not seen twice; threads nanscope does
// not know (started before recording) are still seen by the callback.
void key_this_thread(bool on) {
  c10::impl::tls_set_dispatch_key_included(kRecordKey, on);
  at::enableRecordFunction(!on);
}

struct Depth {
  Depth() { ++tl.depth; }
  ~Depth() { --tl.depth; }
};

void pass_on(const c10::OperatorHandle& handle, c10::DispatchKeySet below, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard off(kRecordKey);
  handle.redispatchBoxed(below, stack);
}

void record_kernel(const c10::OperatorHandle& handle, c10::DispatchKeySet ks,
                   torch::jit::Stack* stack) {
  const auto below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kRecordKey);
  if (tl.depth > 0 || tl.busy || tl.excluded || tl.suspended > 0) return pass_on(handle, below, stack);
  if (S == nullptr || !S->active.load(std::memory_order_relaxed)) {
    // Recording ended: the thread goes back to how it was (the engine's threads are
    // given back their key set by the engine).
    key_this_thread(false);
    return pass_on(handle, below, stack);
  }
  if (g_cut.load(std::memory_order_relaxed) & kCutAll) return pass_on(handle, below, stack);
  Ctx c;
  bool composite = false;
  size_t nrets = 0;
  {
    InFlight counted;
    const bool begun = guarded([&] {
      const OpFlags* op = S->active.load() ? lookup(handle) : nullptr;  // null: stopped meanwhile
      composite = op != nullptr && op->composite;
      nrets = op != nullptr && op->sized ? op->nrets : handle.schema().returns().size();
      if (op != nullptr && !composite && !op->skip) {
        const size_t nargs = op->sized ? op->nargs : handle.schema().arguments().size();
        Depth depth;  // the Python it may call runs ops that are nanscope's
        begin_op(op, c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - nargs, nargs), c);
      }
    });
    if (!begun) c.record = false;
  }
  if (composite) {
    // Looked through: its decomposition comes back here, op by op. Outside the try
    // block: what the op throws (a Python error raised in a hook, such as checkpoint's
    // _StopRecomputationError) is the program's, on its way up.
    handle.redispatchBoxed(below, stack);
    return;
  }
  {
    Depth depth;
    pass_on(handle, below, stack);
  }
  if (!c.record || S == nullptr || !S->active.load(std::memory_order_relaxed)) return;
  InFlight counted;
  if (!S->active.load() || S->session.load() != c.session) return;
  guarded([&] { record(c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - nrets, nrets), c); });
}

TORCH_LIBRARY_IMPL(_, TESTING_ONLY_GenericWrapper, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&record_kernel>());
}

// -- the Python interface -------------------------------------------------------------------

// Empties the ops map when an op leaves the dispatcher (op_keys.h).
void forget_ops() {
  if (S == nullptr) return;
  std::lock_guard<std::mutex> g(S->ops_mu);
  S->ops.clear();
  g_ops_gen.fetch_add(1, std::memory_order_acq_rel);
}

// Drops the Python objects the recorder holds (with the GIL, none of its
// callbacks running).
void drop_python_objects(State* s) {
  s->stacks.clear();
  s->host = py::object();
}

// `dtypes`: (an empty tensor of the dtype, tfdbg2 enum or -1, kept by the filter, a float type).
void start(py::object host, int mode, std::vector<std::tuple<at::Tensor, int, bool, bool>> dtypes,
           py::bytes mode_field, py::bytes sum_prefix, py::bytes none_field, bool ranges,
           bool statistics) {
  if (S == nullptr) {
    S = new State();  // lives for the process: callbacks may still be running
    forget_ops_when_removed(&forget_ops);
  }
  State* s = S;
  if (s->active.load()) throw std::runtime_error("the native recorder is already on");
  if (!wait_quiet(10.0)) {
    throw std::runtime_error(
        "the native recorder is still inside an op of the previous session on another thread");
  }
  g_main_thread = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  // No callback runs now and none starts until `active`: the tables are ours.
  auto drain_lock = lock_drain();  // and no drain is under way
  {
    std::lock_guard<std::mutex> g(s->ev_mu);
    for (Event& ev : s->events) clear_python(ev);  // left by an op that ended after the last drain
    s->events.clear();
    for (Event& ev : s->ring) clear_python(ev);
    s->ring.clear();
    s->ring_bytes = 0;
    s->keep_after = 0;
    s->window = 100;
    s->value_cap = int64_t(1) << 30;
    s->taken.clear();
    s->taken_pos = 0;
    s->stopping = false;
    s->capacity = kCapacity;
  }
  drop_python_objects(s);
  s->host = std::move(host);
  s->mode = mode;
  // `ranges`: FULL_HEALTH rows carry the headroom ranges; `statistics`: the statistics
  // too, after them (the Python side decides: nanscope.backends.torch.summaries).
  s->width = mode == kCurt     ? 2
             : mode == kConcise ? 5
             : mode == kShape   ? 10
             : mode == kFull    ? (statistics ? kFullStatistics : ranges ? kFullRecorded : kFullSlots)
                                : 0;
  s->dtype_enum.fill(-1);
  s->dtype_ok.fill(false);
  s->dtype_float.fill(false);
  for (const auto& [example, num, ok, flt] : dtypes) {
    int st = static_cast<int>(example.scalar_type());
    if (st < 0 || st >= 64) continue;
    s->dtype_enum[st] = num;
    s->dtype_ok[st] = ok;
    s->dtype_float[st] = flt;
  }
  s->encoder.start(mode_field, sum_prefix, none_field);
  {
    std::lock_guard<std::mutex> g(s->ops_mu);
    s->op_by_index.clear();
    s->ops.clear();
    g_ops_gen.fetch_add(1, std::memory_order_acq_rel);
  }
  {
    std::lock_guard<std::mutex> g(s->ids_mu);
    s->ids.clear(drop_id);
    s->by_view.clear(forget);
    s->next_id = 0;
  }
  {
    std::lock_guard<std::mutex> g(s->links_mu);
    s->links.clear();
  }
  {
    std::lock_guard<std::mutex> g(s->cache_mu);
    s->cache.clear();
    s->blank.clear();
    s->values.clear();
  }
  s->serial = 0;
  s->step = 0;
  s->dropped = 0;
  s->dropped_nonfinite = 0;
  s->warned = false;
  s->session.fetch_add(1);
  s->active = true;
  s->handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                        .needsInputs(true)
                                        .needsOutputs(true)
                                        .scopes({at::RecordScope::FUNCTION}));
  key_this_thread(true);
}

// Ends recording: no op is recorded once this returns. Waits (a bounded time,
// without the GIL) for callbacks that began before it to leave.
void stop() {
  if (S == nullptr || !S->active.load()) return;
  S->active = false;
  at::removeCallback(S->handle);
  S->handle = 0;
  key_this_thread(false);
  {
    std::lock_guard<std::mutex> g(S->ev_mu);
    S->stopping = true;
  }
  S->ev_cv.notify_all();
  S->space_cv.notify_all();
  if (!wait_quiet(10.0)) {
    std::fprintf(stderr,
                 "nanscope: an op on another thread is still being recorded; it is left to finish\n");
  }
  {
    // The events shed last were the program's last: the drain takes them now.
    std::lock_guard<std::mutex> g(S->ev_mu);
    while (!S->ring.empty()) {
      S->events.push_back(std::move(S->ring.front()));
      S->ring.pop_front();
    }
    S->ring_bytes = 0;
  }
  S->ev_cv.notify_all();
}

void release() {
  // With the GIL held: drop the Python objects the recorder holds, unless a
  // callback still runs (stop() gave up waiting for it): then the next
  // start() drops them.
  if (S == nullptr || S->active.load() || S->inflight.load() > 0) return;
  drop_python_objects(S);
}

template <typename V>
py::tuple as_tuple(const V& values) {
  py::tuple t(values.size());
  for (size_t i = 0; i < values.size(); ++i) t[i] = py::int_(values[i]);
  return t;
}

// Until a batch is worth draining (or `timeout` seconds), without the GIL.
void wait_for_events(double timeout) {
  py::gil_scoped_release nogil;
  std::unique_lock<std::mutex> lk(S->ev_mu);
  S->ev_cv.wait_for(lk, std::chrono::duration<double>(timeout),
                    [] { return S->events.size() >= S->wake_at || S->stopping; });
}

void refill_taken() {
  pvec<Event>& taken = S->taken;
  if (S->taken_pos < taken.size()) return;
  taken.clear();
  S->taken_pos = 0;
  {
    std::lock_guard<std::mutex> lk(S->ev_mu);
    taken.swap(S->events);
  }
  S->space_cv.notify_all();
}

// The description of an event's op.
const OpFlags& op_of(const Event& ev) {
  // Recording threads append to the table (and may move it) while this runs.
  std::lock_guard<std::mutex> g(S->ops_mu);
  return *S->op_by_index[static_cast<size_t>(ev.op)];
}

// The next (at most `limit`) buffered events encoded, numbered from `first_seq`,
// as nanscope.events._queue.ExecutionBatch's fields (None: no event to encode);
// stops before an event that Python must encode (see drain). The encoding runs
// without the GIL: the GIL is held only to make the batch's few Python objects.
py::object encode_batch(int64_t first_seq, size_t limit) {
  Batch b;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(S->drain_mu);
    refill_taken();
    pvec<Event>& taken = S->taken;
    int64_t seq = first_seq;
    while (S->taken_pos < taken.size() && b.rows.size() < limit) {
      Event& ev = taken[S->taken_pos];
      if (!S->encoder.encodable(ev, S->host)) break;
      S->encoder.encode(ev, ev.flags != nullptr ? *ev.flags : op_of(ev), S->mode, S->width, seq++, S->host, b);
      ++S->taken_pos;
    }
  }
  if (b.rows.empty()) return py::none();
  py::list names;
  for (const auto& n : b.names) names.append(py::str(n));
  py::list ranges;
  for (const RangeUpdate& u : b.ranges) {
    ranges.append(py::make_tuple(S->encoder.module_path(u.module, S->host), u.phase, u.step, u.amax,
                                 u.amin, u.dtype));
  }
  py::bytes rows(reinterpret_cast<const char*>(b.rows.data()), b.rows.size() * sizeof(Row));
  return py::make_tuple(static_cast<int64_t>(b.rows.size()), py::bytes(b.data), rows, names, ranges);
}

// FULL_TENSOR values of an event that the Python side writes (an event is
// drained as a tuple before the writer has numbered its device), as `parts`:
// arrays, and nanscope.format.tensors.ValueView for views.
void values_to_parts(Event& ev) {
  static const char* const kNumpy[] = {nullptr, "float32", "float64", "int32", "uint8", "int16",
                                       "int8", nullptr, nullptr, "int64", "bool"};
  const Values& vals = *ev.values;
  py::object view_type = py::module_::import("nanscope.format.tensors").attr("ValueView");
  py::list parts;
  for (size_t i = 0; i < vals.outs.size(); ++i) {
    const TensorValue& v = vals.outs[i];
    const int64_t* dims = vals.dims.data() + v.dims_at;
    std::vector<py::ssize_t> shape(dims, dims + v.rank);
    py::object part = py::none();
    if (v.kind == TensorValue::kBytes) {
      const char* name = v.dtype == 19 ? "float16" : (v.dtype >= 0 && v.dtype <= 10 ? kNumpy[v.dtype] : nullptr);
      if (name != nullptr) {
        py::array a{py::dtype(name), shape};
        if (v.nbytes > 0) std::memcpy(a.mutable_data(), vals.bytes + v.begin, static_cast<size_t>(v.nbytes));
        part = a;
      }
    } else if (v.kind == TensorValue::kView || v.kind == TensorValue::kOmitted) {
      // An omitted value is a view naming no record (sequence 0): shape and counts only.
      const int64_t at = v.kind == TensorValue::kView ? S->encoder.seq_of(v.of_serial) : 0;
      if (at != 0 || v.kind == TensorValue::kOmitted) {
        const double* row = ev.sums.data() + i * kFullRecorded;
        const bool counted = v.dtype == 1 || v.dtype == 2 || v.dtype == 19;
        py::tuple counts(counted ? 7 : 1);
        for (int k = 0; k < (counted ? 7 : 1); ++k) counts[k] = static_cast<int64_t>(row[4 + k]);
        py::tuple sizes(v.rank), strides(v.rank);
        for (int32_t d = 0; d < v.rank; ++d) {
          sizes[d] = dims[d];
          strides[d] = dims[v.rank + d];
        }
        part = view_type(at, v.of_slot, v.offset, sizes, strides, counts);
      }
    }
    ev.has[i] = part.is_none() ? 0 : 2;
    parts.append(part);
  }
  ev.parts = parts.release().ptr();
  ev.sums.clear();
  ev.values.reset();
  ev.link_target = true;  // its sequence number, for views of its values
}

// At most `limit` buffered events as Python tuples. Small slices: the Python
// objects of a slice die before the garbage collector promotes them to its
// oldest generation, whose collections scan the whole program's heap.
py::list drain(size_t limit) {
  pvec<Event>& taken = S->taken;
  auto lk = lock_drain();
  refill_taken();
  py::list out;
  const int w = S->width;
  size_t end = std::min(taken.size(), S->taken_pos + limit);
  for (; S->taken_pos < end; ++S->taken_pos) {
    Event& ev = taken[S->taken_pos];
    if (ev.values) values_to_parts(ev);
    py::object sums = py::none();
    if (!ev.sums.empty()) {
      size_t n = ev.out_ids.size();
      py::array_t<double> a({n, static_cast<size_t>(w)});
      std::copy(ev.sums.begin(), ev.sums.end(), a.mutable_data());
      sums = a;
    }
    py::object parts = ev.parts ? py::reinterpret_steal<py::object>(ev.parts) : py::none();
    py::object inputs = ev.inputs ? py::reinterpret_steal<py::object>(ev.inputs) : py::none();
    py::object tag =
        ev.collective ? py::reinterpret_steal<py::object>(ev.collective) : py::none();
    ev.parts = ev.inputs = ev.collective = nullptr;
    out.append(py::make_tuple(
        ev.op, as_tuple(ev.out_ids), as_tuple(ev.in_ids), as_tuple(ev.out_dev), sums,
        py::bytes(reinterpret_cast<const char*>(ev.has.data()), ev.has.size()), parts, inputs,
        ev.stack, ev.module, ev.phase, ev.step, ev.serial, ev.fwd_serial, ev.fwd_stack,
        ev.link_target, ev.wall, tag));
  }
  return out;
}

py::list device_names() {
  std::lock_guard<std::mutex> g(S->dev_mu);
  py::list l;
  for (const auto& d : S->devices) l.append(d);
  return l;
}

int64_t tensor_id(const at::Tensor& t, bool fresh) {
  if (S == nullptr) return 0;
  std::lock_guard<std::mutex> g(S->ids_mu);
  return fresh ? new_id_locked(t) : get_id_locked(t);
}

}  // namespace
}  // namespace nanscope

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace nanscope;
  m.doc() = "nanscope's native PyTorch op recorder and checker";
  add_checker(m);
  m.def("start", &start);
  m.def("stop", &stop);
  m.def("release", &release);
  m.def("drain", &drain, py::arg("limit") = 256);
  m.def("wait_for_events", &wait_for_events);
  m.def("encode_batch", &encode_batch);
  m.def("note_seq", [](int64_t serial, int64_t seq) { S->encoder.note_seq(serial, seq); });
  m.def("seq_of", [](int64_t serial) { return S->encoder.seq_of(serial); });
  m.def("device_names", &device_names);
  m.def("dropped", []() -> int64_t { return S == nullptr ? 0 : S->dropped.load(); });
  m.def("dropped_nonfinite", []() -> int64_t { return S == nullptr ? 0 : S->dropped_nonfinite.load(); });
  // The writer's origin_window (the windows kept while shedding) and max_value_bytes.
  m.def("set_shedding", [](size_t window, int64_t value_cap) {
    if (S == nullptr) return;
    std::lock_guard<std::mutex> g(S->ev_mu);
    S->window = window;
    S->value_cap = std::max<int64_t>(0, value_cap);
  });
  m.def("set_capacity", [](size_t n) {  // for tests: a small buffer fills up quickly
    if (S == nullptr) return;
    std::lock_guard<std::mutex> g(S->ev_mu);
    S->capacity = std::max<size_t>(1, n);
  });
  m.def("tensor_id", &tensor_id, py::arg("tensor"), py::arg("fresh") = false);
  m.def("set_module", [](int m) { tl.module = m; });
  m.def("set_optimizer", [](int n, int64_t between) {
    tl.optimizer = n;
    tl.at_backward.note(tl.between, between);
    tl.between = between;
  });
  // Module paths from the frames of nn.Module's __call__ (its code object), not
  // hooks; None: hooks again. False where frames cannot be read without the GIL.
  m.def("set_module_frames", [](py::object code) {
    return set_module_code(code.is_none() ? nullptr : code.ptr());
  });
  m.def("forget_modules", []() {
    if (S != nullptr) S->stacks.forget_modules();
  });
  // The calling thread's module path index (with module frames on).
  m.def("current_module", []() { return S == nullptr ? 0 : S->stacks.module_here(intern_modules); });
  m.def("set_step", [](int64_t s) {
    if (S != nullptr) S->step = s;
  });
  m.def("set_suspended", [](int n) { tl.suspended = n; });
  m.def("set_bench_cut", [](int cut) { g_cut = cut; });  // bench/overhead_breakdown.py
  m.def("exclude_this_thread", []() { tl.excluded = true; });
  // A thread started while recording (dispatch.on_new_threads): recorded by key.
  m.def("key_this_thread", []() {
    if (S != nullptr && S->active.load()) key_this_thread(true);
  });
  // A forked child (a DataLoader worker) has only the thread that forked. The parent's
  // drain thread, or an op on another thread, may have held any of the state's mutexes
  // (or the pool's lock) at the fork, and nothing here would ever release them: the
  // child never touches that state again (its memory is left as it is) and records, if
  // it does, into a new state from a new pool.
  m.def("forget_in_child", []() {
    if (S == nullptr) return;
    if (S->active.load()) at::removeCallback(S->handle);  // its callbacks would read S
    renew_pool();
    S = new State();
  });
  // For tests (test_torch_native's forked workers): hold every mutex of the state, as a
  // thread of the program might at a fork, for `seconds`, without the GIL.
  m.def("hold_locks", [](double seconds) {
    if (S == nullptr) return;
    State* s = S;
    py::gil_scoped_release nogil;
    std::scoped_lock all(s->drain_mu, s->ev_mu, s->ops_mu, s->ids_mu, s->links_mu, s->cache_mu,
                         s->dev_mu, s->stacks.mutex());
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  });
}
