#pragma once
// The record encoder: a recorded event as the bytes of its DebugEvent record
// (an Execution), in canonical protobuf encoding written by hand, byte for
// byte what nanscope.events._encode writes (tests compare the two). Python
// then only frames and files the records, instead of building a message per
// op. Pieces that depend on Python-side tables (stacks' code locations,
// module paths, device ids) come from the Python side once each and are
// cached here. FULL_TENSOR values copied by the recorder are written here
// too, straight into the record (and a view's reference to values recorded
// before, Execution.output_views). An event with summaries computed by
// Python (accelerator, unusual FULL_TENSOR values) or input summaries stays
// with Python.
//
// Kept apart from the recorder (recorder.cpp), which makes the events on the
// threads that run ops: the encoder is the file format's side, and runs on
// nanscope's drain thread, on events already taken out of the recorder's
// buffer, without the GIL: the training thread's Python must not wait for it.
// The GIL is taken only to ask the Python side for a piece not cached yet.
//
// Events are encoded a batch at a time (Batch): the framed records back to
// back, their sidecar rows in nanscope.format.sidecar's layout, and the range
// history's updates, so that the writer's thread handles a batch with a few
// numpy operations and no Python object per event.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "event.h"

namespace nanscope {

// A row of the sidecar index: nanscope.format.sidecar.ROW_DTYPE, byte for byte.
#pragma pack(push, 1)
struct Row {
  uint64_t offset;  // within Batch::data
  uint32_t length;
  uint32_t name;    // Batch::names' index (the writer renumbers it)
  uint32_t graph;   // 0: no graph id
  int32_t slot;     // executions: num_outputs
  double wall_time;
  int64_t step, sequence, size, neg_inf, pos_inf, nan;
  int8_t nonfinite, phase;
  int16_t device;
};
#pragma pack(pop)
static_assert(sizeof(Row) == 84, "Row must match nanscope.format.sidecar.ROW_DTYPE");

// One update of the range history (nanscope.events._history.RangeHistory.add), the
// events of one module, phase and step in a row combined as add() would combine them.
struct RangeUpdate {
  int64_t module;
  int phase;
  int64_t step;
  double amax, amin, level;
  int dtype;
};

// Encoded events, as the writer takes them (nanscope.events._queue.ExecutionBatch).
struct Batch {
  std::string data;  // framed records (TFRecord), back to back
  std::vector<Row> rows;
  std::vector<std::string> names;  // op types, by Row::name
  std::unordered_map<int, uint32_t> name_of_op;
  std::vector<RangeUpdate> ranges;
  std::unordered_map<int64_t, size_t> open_range;  // (module, phase) -> its last update
};

// A TFRecord around `payload`, appended to `out` (length, masked CRC32C of it,
// payload, masked CRC32C of the payload), as nanscope.format.records.frame writes.
void append_framed(std::string& out, const std::string& payload);

// One recording's encoder. Its calls come from one thread at a time (the drain's);
// they take the GIL only to ask the Python side `host` for what is not cached.
class Encoder {
 public:
  // A new recording: its fixed pieces (from the Python side), every cache empty.
  void start(std::string mode_field, std::string sum_prefix, std::string none_field);

  // Events with summaries from Python, or on a device the writer has not
  // numbered yet (numbering takes the writer's lock, held while encoding),
  // are left to the Python side. `host` is the Python side.
  bool encodable(const Event& ev, pybind11::handle host);

  // Encodes one event into `out`: its framed record, row and range update.
  void encode(const Event& ev, const OpFlags& op, int mode, int width, int64_t seq,
              pybind11::handle host, Batch& out);

  // A module's path (the Python side's, cached), for the range updates; with the GIL.
  const std::string& module_path(int64_t module, pybind11::handle host);

  // A forward op's sequence number, for the backward ops that it links to.
  void note_seq(int64_t serial, int64_t seq);
  int64_t seq_of(int64_t serial) const;

 private:
  // A piece from the Python side's `method(a)` or `method(a, b)` (b >= 0), cached by `key`.
  const std::string& cached_piece(std::unordered_map<int64_t, std::string>& cache, int64_t key,
                                  pybind11::handle host, const char* method, int64_t a,
                                  int64_t b = -1);
  bool devices_known(const Event& ev) const;

  std::string mode_field;  // Execution.tensor_debug_mode
  std::string sum_prefix;  // a summary's tensor_protos field, up to its doubles
  std::string none_field;  // an output without a summary
  std::unordered_map<int64_t, std::string> located, forward_located, extras;
  std::unordered_map<int64_t, std::string> module_paths;  // module index -> path
  std::vector<int64_t> device_ids;  // device index -> the writer's device id
  std::unordered_map<int64_t, int64_t> seq_of_serial;  // forward ops' sequence numbers
};

}  // namespace nanscope
