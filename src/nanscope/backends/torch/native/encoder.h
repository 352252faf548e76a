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
// nanscope's drain thread, with the GIL, on events already taken out of the
// recorder's buffer.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "event.h"

namespace nanscope {

// One recording's encoder; every call with the GIL held.
class Encoder {
 public:
  // A new recording: its fixed pieces (from the Python side), every cache empty.
  void start(std::string mode_field, std::string sum_prefix, std::string none_field);

  // Events with summaries from Python, or on a device the writer has not
  // numbered yet (numbering takes the writer's lock, held while encoding),
  // are left to the Python side. `host` is the Python side.
  bool encodable(const Event& ev, pybind11::handle host);

  // The record of one event and its index row's columns, in the order of
  // nanscope.events._queue.EncodedExecution.
  pybind11::tuple encode(const Event& ev, const OpFlags& op, int mode, int width, int64_t seq,
                         pybind11::handle host);

  // A forward op's sequence number, for the backward ops that it links to.
  void note_seq(int64_t serial, int64_t seq);
  int64_t seq_of(int64_t serial) const;

 private:
  const std::string& cached_piece(std::unordered_map<int64_t, std::string>& cache, int64_t key,
                                  pybind11::handle host, const char* method, pybind11::args args);
  bool devices_known(const Event& ev) const;
  const std::string& module_path(int64_t module, pybind11::handle host);

  std::string mode_field;  // Execution.tensor_debug_mode
  std::string sum_prefix;  // a summary's tensor_protos field, up to its doubles
  std::string none_field;  // an output without a summary
  std::unordered_map<int64_t, std::string> located, forward_located, extras;
  std::unordered_map<int64_t, std::string> module_paths;  // module index -> path
  std::vector<int64_t> device_ids;  // device index -> the writer's device id
  std::unordered_map<int64_t, int64_t> seq_of_serial;  // forward ops' sequence numbers
};

}  // namespace nanscope
