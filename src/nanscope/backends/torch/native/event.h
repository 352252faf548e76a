#pragma once
// What the recorder (recorder.cpp) and the record encoder (encoder.cpp)
// share: an op's description (OpFlags), a recorded op's event (Event) and
// the numbers of the tensor debug modes and phases that events carry. The
// recorder fills events on the threads that run ops; the drain thread hands
// them to the encoder, so both must see one definition.
#include <Python.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "inline_vec.h"
#include "pool.h"

namespace nanscope {

// tfdbg2's TensorDebugMode numbers, and Event.phase's values.
constexpr int kNoTensor = 1, kCurt = 2, kConcise = 3, kFull = 4, kShape = 5, kFullTensor = 7;
constexpr int kPhaseForward = 1, kPhaseBackward = 2, kPhaseOptimizer = 3;
// A FULL_HEALTH row in memory: tfdbg2's 11 slots, then the largest finite |x|
// and the smallest non-zero finite |x| (nanscope.format.headroom), which the
// encoder writes to Execution.output_ranges. With statistics asked for, four
// more (nanscope.format.statistics): the mean, standard deviation and L2 norm of
// the finite elements and the bits hash, which go to Execution.output_statistics.
constexpr int kFullSlots = 11, kFullRecorded = 13, kFullStatistics = 17, kWidestRow = 17;
// The most entries of a table that links backward ops to forward ones (the encoder's
// sequence numbers) before it starts over. (The recorder's links keep a window of the
// latest autograd nodes instead: recorder.cpp's kLinksWindow.)
constexpr size_t kLinksMax = 1 << 20;

// What the recorder knows of an op, from the Python side's description. Every op
// reads it: what an op reads (up to `written`'s begin and end) lies in its first cache
// line, one line to fetch per op.
struct alignas(64) OpFlags {
  int index = -1;  // the Python side's op index (name, OpInfo)
  bool not_op = false;
  bool composite = false;
  bool skip = false;
  bool same_elements = false;
  bool record_values = true;
  bool collective = false;  // a torch.distributed operation: the Python side tags it
  bool uninitialised = false;
  bool view = false;
  // Its schema's numbers of arguments and returns (the dispatch key's kernel reads
  // them off the stack for every call).
  bool sized = false;  // nargs and nrets known (described with the op's handle)
  uint32_t nargs = 0;
  uint32_t nrets = 0;
  std::vector<int> value_args;
  // Argument positions it writes into (its schema's `Tensor(a!)`): what it does not
  // return among them (_foreach_mul_'s list, _fused_adamw_'s) are outputs too.
  std::vector<int> written;
  std::string name;  // "aten.log.default"
};

// FULL_TENSOR: one output's value as its record holds it (see encoder.cpp).
// kOmitted: past the record's bound on values (the writer's max_value_bytes), written
// as a view entry naming no record (sequence 0): its shape and counts, no elements.
struct TensorValue {
  enum Kind : int8_t { kNone = 0, kBytes = 1, kView = 2, kOmitted = 3 };
  Kind kind = kNone;
  int32_t dtype = 0;       // the DataType of the bytes (bfloat16 is widened to float32)
  int64_t begin = 0;       // kBytes: where its bytes start in Values::bytes
  int64_t nbytes = 0;
  int32_t rank = 0;        // its shape: Values::dims[dims_at, dims_at + rank)
  int64_t dims_at = 0;     // kView: its strides follow its shape in Values::dims
  // kView: the values are those of output `of_slot` of the event `of_serial`
  // (recorded before), read from element `offset` with this output's strides.
  int64_t of_serial = -1;
  int32_t of_slot = 0;
  int64_t offset = 0;
};

// Bytes held by FULL_TENSOR values not yet encoded and freed, for the
// recorder's bound on its buffer (recorder.cpp's push).
inline std::atomic<int64_t> g_value_bytes{0};

// An event's FULL_TENSOR values: one allocation for all its outputs' bytes.
// Plain malloc, not the pool: these are tensor-sized and freed within a drain
// cycle, like the program's own tensors.
struct Values {
  std::vector<TensorValue> outs;
  std::vector<int64_t> dims;
  char* bytes = nullptr;
  int64_t nbytes = 0;
  Values() = default;
  Values(const Values&) = delete;
  Values& operator=(const Values&) = delete;
  ~Values() {
    if (bytes != nullptr) {
      std::free(bytes);
      g_value_bytes.fetch_sub(nbytes, std::memory_order_relaxed);
    }
  }
  bool allocate(int64_t n) {
    if (n <= 0) return true;
    bytes = static_cast<char*>(std::malloc(static_cast<size_t>(n)));
    if (bytes == nullptr) return false;
    nbytes = n;
    g_value_bytes.fetch_add(n, std::memory_order_relaxed);
    return true;
  }
};

// A recorded op, buffered until the drain thread takes it.
struct Event {
  int32_t op = -1;
  int32_t stack = -1;
  int32_t module = 0;
  int32_t fwd_stack = -1;
  int32_t fwd_module = 0;
  int32_t phase = 0;
  int32_t extra_inputs = 0;
  bool link_target = false;
  int64_t step = 0;
  int64_t serial = 0;
  int64_t fwd_serial = -1;
  double wall = 0;
  // The op's description (OpFlags live for the process): read by the drain thread
  // without the lock on the op table.
  const OpFlags* flags = nullptr;
  // Inline room for a small op's ids and one FULL_HEALTH row: no allocation per
  // event (an allocation here is freed by the drain thread, and a pool shared by
  // the two threads makes both take its lock on every event).
  InlineVec<int64_t, 4> in_ids;
  InlineVec<int64_t, 4> out_ids;
  InlineVec<int32_t, 4> out_dev;
  InlineVec<uint8_t, 8> has;   // 1: computed here, 2: in `parts`, 0: none
  // FULL_TENSOR values copied here (`sums`, below, then holds kFullRecorded-wide rows
  // of their counts, FULL_HEALTH's layout, for the index and the ranges).
  std::unique_ptr<Values> values;
  PyObject* parts = nullptr;  // owned: summaries computed in Python, aligned with outputs
  PyObject* inputs = nullptr; // owned: input summaries (an op that made Inf/NaN)
  PyObject* collective = nullptr; // owned: a torch.distributed operation's tag
  // Last: an op recorded without values (NO_TENSOR) leaves this room untouched, so an
  // event in the buffer spans the fewest cache lines (its size and capacity lead it).
  InlineVec<double, 3 * kFullRecorded> sums;  // width values per output
};

}  // namespace nanscope
