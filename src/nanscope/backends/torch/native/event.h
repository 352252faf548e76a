#pragma once
// What the recorder (recorder.cpp) and the record encoder (encoder.cpp)
// share: an op's description (OpFlags), a recorded op's event (Event) and
// the numbers of the tensor debug modes and phases that events carry. The
// recorder fills events on the threads that run ops; the drain thread hands
// them to the encoder, so both must see one definition.
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pool.h"

namespace nanscope {

// tfdbg2's TensorDebugMode numbers, and Event.phase's values.
constexpr int kNoTensor = 1, kCurt = 2, kConcise = 3, kFull = 4, kShape = 5, kFullTensor = 7;
constexpr int kPhaseForward = 1, kPhaseBackward = 2, kPhaseOptimizer = 3;
// A FULL_HEALTH row in memory: tfdbg2's 11 slots, then the largest finite |x|
// and the smallest non-zero finite |x| (nanscope.format.headroom), which the
// encoder writes to Execution.output_ranges.
constexpr int kFullSlots = 11, kFullRecorded = 13, kWidestRow = 13;
// The most entries of a table that links backward ops to forward ones (the
// recorder's links, the encoder's sequence numbers) before it starts over.
constexpr size_t kLinksMax = 1 << 20;

// What the recorder knows of an op, from the Python side's description.
struct OpFlags {
  int index = -1;  // the Python side's op index (name, OpInfo)
  bool not_op = false;
  bool composite = false;
  bool skip = false;
  bool same_elements = false;
  bool record_values = true;
  bool collective = false;  // a torch.distributed operation: the Python side tags it
  bool uninitialised = false;
  bool view = false;
  std::vector<int> value_args;
  std::string name;  // "aten.log.default"
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
  pvec<int64_t> in_ids{pool()}, out_ids{pool()};
  pvec<int32_t> out_dev{pool()};
  pvec<double> sums{pool()};  // width values per output
  pvec<uint8_t> has{pool()};  // 1: computed here, 2: in `parts`, 0: none
  PyObject* parts = nullptr;  // owned: summaries computed in Python, aligned with outputs
  PyObject* inputs = nullptr; // owned: input summaries (an op that made Inf/NaN)
  PyObject* collective = nullptr; // owned: a torch.distributed operation's tag
};

}  // namespace nanscope
