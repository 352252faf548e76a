// The record encoder (see encoder.h).
#include "encoder.h"

// std::vector's caster (device_ids), which torch/extension.h brings to
// recorder.cpp: every file must cast a type with the same caster.
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace nanscope {
namespace py = pybind11;
namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, int field, int wire) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire); }

template <typename V>
void put_packed(std::string& out, int field, const V& values, const std::vector<int64_t>* map = nullptr) {
  if (values.empty()) return;
  std::string body;
  for (auto v : values) {
    int64_t x = map ? (*map)[static_cast<size_t>(v)] : static_cast<int64_t>(v);
    put_varint(body, static_cast<uint64_t>(x));
  }
  put_tag(out, field, 2);
  put_varint(out, body.size());
  out += body;
}

void put_nan_pair(std::string& out) {
  const double pair[2] = {std::nan(""), std::nan("")};
  out.append(reinterpret_cast<const char*>(pair), sizeof(pair));
}

// The largest finite value of a float DataType (nanscope.format.headroom.FORMATS); 0: not a float.
double format_max(int dtype) {
  switch (dtype) {
    case 19: return 65504.0;                 // DT_HALF
    case 14: return 3.3895313892515355e38;   // DT_BFLOAT16
    case 1: return 3.4028234663852886e38;    // DT_FLOAT
    case 2: return 1.7976931348623157e308;   // DT_DOUBLE
    default: return 0.0;
  }
}

// A TensorProto's fields before its content (dtype, shape) and the content's
// tag and length: what nanscope.format.tensors.array_to_proto serialises.
std::string value_head(const TensorValue& v, const Values& vals) {
  std::string proto;
  put_tag(proto, 1, 0);
  put_varint(proto, static_cast<uint64_t>(v.dtype));
  if (v.rank > 0) {
    std::string shape;
    for (int32_t d = 0; d < v.rank; ++d) {
      const int64_t size = vals.dims[static_cast<size_t>(v.dims_at + d)];
      put_tag(shape, 2, 2);
      if (size == 0) {
        put_varint(shape, 0);
      } else {
        std::string dim;
        put_tag(dim, 1, 0);
        put_varint(dim, static_cast<uint64_t>(size));
        put_varint(shape, dim.size());
        shape += dim;
      }
    }
    put_tag(proto, 2, 2);
    put_varint(proto, shape.size());
    proto += shape;
  }
  if (v.nbytes > 0) {
    put_tag(proto, 4, 2);
    put_varint(proto, static_cast<uint64_t>(v.nbytes));
  }
  return proto;
}

// An output_views (1009) entry: output `slot` is a view of values recorded
// in execution `sequence` (docs/FORMAT.md).
void put_view(std::string& out, size_t slot, int64_t sequence, const TensorValue& v,
              const Values& vals, const double* row) {
  std::string m;
  if (slot != 0) {
    put_tag(m, 1, 0);
    put_varint(m, slot);
  }
  put_tag(m, 2, 0);
  put_varint(m, static_cast<uint64_t>(sequence));
  if (v.of_slot != 0) {
    put_tag(m, 3, 0);
    put_varint(m, static_cast<uint64_t>(v.of_slot));
  }
  if (v.offset != 0) {
    put_tag(m, 4, 0);
    put_varint(m, static_cast<uint64_t>(v.offset));
  }
  const auto* dims = vals.dims.data() + v.dims_at;
  std::vector<int64_t> shape(dims, dims + v.rank), strides(dims + v.rank, dims + 2 * v.rank);
  put_packed(m, 5, shape);
  put_packed(m, 6, strides);
  // Its counts (value_row's), as the index has them: 7 for a float type, the size otherwise.
  const bool counted = v.dtype == 1 || v.dtype == 2 || v.dtype == 19;
  std::vector<int64_t> counts;
  for (int k = 4; k < (counted ? 11 : 5); ++k) counts.push_back(static_cast<int64_t>(row[k]));
  put_packed(m, 7, counts);
  put_tag(out, 1009, 2);
  put_varint(out, m.size());
  out += m;
}

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), a byte at a time from a table,
// or with SSE 4.2's crc32 instruction where the CPU has it.
struct CrcTable {
  uint32_t t[256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[i] = c;
    }
  }
};

uint32_t crc32c_table(const unsigned char* p, size_t n) {
  static const CrcTable table;
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table.t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, size_t n) {
  uint64_t c = 0xFFFFFFFFu;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; i < n; ++i) c32 = __builtin_ia32_crc32qi(c32, p[i]);
  return c32 ^ 0xFFFFFFFFu;
}
#endif

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  if (hardware) return crc32c_sse42(p, n);
#endif
  return crc32c_table(p, n);
}

uint32_t masked_crc(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

void put_u32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);  // little-endian hosts only, as PyTorch's CPU kernels assume
  out.append(b, 4);
}

}  // namespace

void append_framed(std::string& out, const std::string& payload) {
  uint64_t n = payload.size();
  char len[8];
  std::memcpy(len, &n, 8);
  out.append(len, 8);
  put_u32(out, masked_crc(len, 8));
  out += payload;
  put_u32(out, masked_crc(payload.data(), payload.size()));
}

const std::string& Encoder::module_path(int64_t module, py::handle host) {
  auto it = module_paths.find(module);
  if (it != module_paths.end()) return it->second;
  py::gil_scoped_acquire gil;
  std::string path = host.attr("module_path")(module).cast<std::string>();
  return module_paths.emplace(module, std::move(path)).first->second;
}

void Encoder::start(std::string mode_field, std::string sum_prefix, std::string none_field) {
  this->mode_field = std::move(mode_field);
  this->sum_prefix = std::move(sum_prefix);
  this->none_field = std::move(none_field);
  located.clear();
  forward_located.clear();
  extras.clear();
  module_paths.clear();
  device_ids.clear();
  seq_of_serial.clear();
}

const std::string& Encoder::cached_piece(std::unordered_map<int64_t, std::string>& cache, int64_t key,
                                         py::handle host, const char* method, int64_t a, int64_t b) {
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  py::gil_scoped_acquire gil;
  py::object piece = b >= 0 ? host.attr(method)(a, b) : host.attr(method)(a);
  return cache.emplace(key, piece.cast<std::string>()).first->second;
}

bool Encoder::devices_known(const Event& ev) const {
  for (int32_t d : ev.out_dev) {
    if (static_cast<size_t>(d) >= device_ids.size()) return false;
  }
  return true;
}

bool Encoder::encodable(const Event& ev, py::handle host) {
  if (ev.parts != nullptr || ev.inputs != nullptr || ev.collective != nullptr) return false;
  if (!devices_known(ev)) {
    py::gil_scoped_acquire gil;
    device_ids = host.attr("device_ids")().cast<std::vector<int64_t>>();
    return devices_known(ev);
  }
  return true;
}

void Encoder::encode(const Event& ev, const OpFlags& op, int mode, int width, int64_t seq,
                     py::handle host, Batch& out) {
  // The drain thread's buffers, kept from one event to the next (no allocation per event).
  thread_local std::string body_buf, payload_buf;
  std::string& body = body_buf;
  body.clear();
  put_tag(body, 1, 2);
  put_varint(body, op.name.size());
  body += op.name;
  if (!ev.out_ids.empty()) {
    put_tag(body, 2, 0);
    put_varint(body, ev.out_ids.size());
  }
  put_packed(body, 4, ev.in_ids);
  put_packed(body, 5, ev.out_ids);
  body += mode_field;
  int64_t size = 0, ni = 0, pi = 0, nn = 0;
  bool seen = false, flagged = false;
  // FULL_HEALTH rows carry their ranges after tfdbg2's slots: those go to
  // output_ranges (1008), and the index keeps one pair (headroom::combine).
  // FULL_TENSOR values come with such rows, for the index and the ranges only.
  const bool full_tensor = mode == kFullTensor && ev.values != nullptr;
  if (full_tensor) width = kFullRecorded;
  const bool ranged = (mode == kFull && width >= kFullRecorded) || full_tensor;
  // With statistics asked for, four more slots per row: to output_statistics (1010).
  const bool with_statistics = mode == kFull && width == kFullStatistics && !full_tensor;
  const int written = ranged ? kFullSlots : width;
  // FULL_TENSOR: the values' bytes are not copied into `body`, but straight
  // into the payload at these places of it.
  struct Hole {
    size_t at;
    const char* bytes;
    size_t n;
  };
  std::vector<Hole> holes;
  size_t hole_bytes = 0;
  std::string views;
  std::string ranges;
  std::string stats;
  bool stats_seen = false;
  double amax = std::nan(""), amin = std::numeric_limits<double>::infinity(), best = -1;
  int range_dtype = 0;
  if (mode != kNoTensor) {
    for (size_t i = 0; i < ev.out_ids.size(); ++i) {
      if (i >= ev.has.size() || ev.has[i] != 1) {
        body += none_field;
        if (ranged) put_nan_pair(ranges);
        if (with_statistics) {
          put_nan_pair(stats);
          put_nan_pair(stats);
        }
        continue;
      }
      const double* row = ev.sums.data() + i * width;
      if (full_tensor) {
        const Values& vals = *ev.values;
        const TensorValue& v = vals.outs[i];
        if (v.kind == TensorValue::kBytes) {
          std::string head = value_head(v, vals);
          put_tag(body, 7, 2);
          put_varint(body, head.size() + static_cast<uint64_t>(v.nbytes));
          body += head;
          if (v.nbytes > 0) {
            holes.push_back({body.size(), vals.bytes + v.begin, static_cast<size_t>(v.nbytes)});
            hole_bytes += static_cast<size_t>(v.nbytes);
          }
        } else if (v.kind == TensorValue::kOmitted) {
          // Past the record's bound: its shape and counts in a view entry naming no
          // record (sequence 0); the index and the ranges below have them too.
          body += none_field;
          put_view(views, i, 0, v, vals, row);
        } else {
          // A view: its values are in an earlier record; without that record's
          // number (its event was not encoded here) the output reads as not recorded.
          body += none_field;
          const int64_t at = v.kind == TensorValue::kView ? seq_of(v.of_serial) : 0;
          if (at == 0) continue;
          put_view(views, i, at, v, vals, row);
        }
      } else {
        body += sum_prefix;
        body.append(reinterpret_cast<const char*>(row), sizeof(double) * written);
      }
      if (with_statistics) {
        stats.append(reinterpret_cast<const char*>(row + kFullRecorded), sizeof(double) * 4);
        for (int k = kFullRecorded; k < kFullStatistics; ++k) stats_seen = stats_seen || !std::isnan(row[k]);
      }
      if (ranged) {
        ranges.append(reinterpret_cast<const char*>(row + kFullSlots), sizeof(double) * 2);
        double top = format_max(static_cast<int>(row[2]));
        if (top > 0 && row[11] >= 0) {
          if (row[11] / top > best) {
            best = row[11] / top;
            amax = row[11];
            range_dtype = static_cast<int>(row[2]);
          }
          amin = std::min(amin, row[12]);
        }
      }
      seen = true;
      if (mode == kFull || full_tensor) {
        size += static_cast<int64_t>(row[4]);
        ni += static_cast<int64_t>(row[5]);
        pi += static_cast<int64_t>(row[6]);
        nn += static_cast<int64_t>(row[7]);
      } else if (mode == kConcise) {
        size += static_cast<int64_t>(row[1]);
        ni += static_cast<int64_t>(row[2]);
        pi += static_cast<int64_t>(row[3]);
        nn += static_cast<int64_t>(row[4]);
      } else if (mode == kCurt) {
        flagged = flagged || row[1] != 0;
      } else if (mode == kShape) {
        size += static_cast<int64_t>(row[3]);
      }
    }
  }
  if (ev.stack >= 0) body += cached_piece(located, ev.stack, host, "located", ev.stack);
  put_packed(body, 9, ev.out_dev, &device_ids);
  body += cached_piece(extras, (static_cast<int64_t>(ev.module) << 2) | ev.phase, host, "extras",
                       ev.module, ev.phase);
  if (ev.fwd_serial >= 0) {
    auto it = seq_of_serial.find(ev.fwd_serial);
    if (it != seq_of_serial.end() && it->second != 0) {
      put_tag(body, 1003, 0);
      put_varint(body, static_cast<uint64_t>(it->second));
    }
  }
  if (ev.fwd_stack >= 0) {
    body += cached_piece(forward_located, ev.fwd_stack, host, "forward_located", ev.fwd_stack);
  }
  if (seq) {
    put_tag(body, 1005, 0);
    put_varint(body, static_cast<uint64_t>(seq));
  }
  if (range_dtype != 0) {  // some output's ranges are known
    if (!full_tensor) {  // FULL_TENSOR: the reader takes them from the values
      put_tag(body, 1008, 2);
      put_varint(body, ranges.size());
      body += ranges;
    }
  } else {
    amin = std::nan("");
  }
  if (stats_seen) {  // as the Python encoder: only where some output's are known
    put_tag(body, 1010, 2);
    put_varint(body, stats.size());
    body += stats;
  }
  body += views;
  std::string& payload = payload_buf;
  payload.clear();
  payload.reserve(body.size() + 24);
  if (ev.wall != 0) {
    put_tag(payload, 1, 1);
    payload.append(reinterpret_cast<const char*>(&ev.wall), sizeof(double));
  }
  if (ev.step != 0) {
    put_tag(payload, 2, 0);
    put_varint(payload, static_cast<uint64_t>(ev.step));
  }
  put_tag(payload, 9, 2);
  put_varint(payload, body.size() + hole_bytes);
  if (holes.empty()) {
    payload += body;
  } else {
    // The values, between the body's pieces (off the GIL: the drain encodes without it).
    payload.reserve(payload.size() + body.size() + hole_bytes);
    size_t from = 0;
    for (const Hole& h : holes) {
      payload.append(body, from, h.at - from);
      payload.append(h.bytes, h.n);
      from = h.at;
    }
    payload.append(body, from, std::string::npos);
  }
  if (ev.link_target || full_tensor) note_seq(ev.serial, seq);
  // The index row's health, as nanscope.format.health.index_row computes it.
  int64_t h_size = -1, h_ni = -1, h_pi = -1, h_nn = -1, h_bad = -1;
  if (seen && (mode == kFull || mode == kConcise || full_tensor)) {
    h_size = size, h_ni = ni, h_pi = pi, h_nn = nn, h_bad = (ni + pi + nn) > 0;
  } else if (seen && mode == kCurt) {
    h_bad = flagged;
  } else if (seen && mode == kShape) {
    h_size = size;
  }
  int64_t device = ev.out_dev.empty() ? 0 : device_ids[static_cast<size_t>(ev.out_dev[0])];
  if (range_dtype != 0) {  // the index stores float32 (as headroom.combine holds them)
    amax = std::min(amax, static_cast<double>(std::numeric_limits<float>::max()));
    if (amin > 0) amin = std::max(amin, static_cast<double>(std::numeric_limits<float>::denorm_min()));
  }
  auto named = out.name_of_op.find(op.index);
  if (named == out.name_of_op.end()) {
    named = out.name_of_op.emplace(op.index, static_cast<uint32_t>(out.names.size())).first;
    out.names.push_back(op.name);
  }
  Row row{};
  row.offset = out.data.size();
  append_framed(out.data, payload);
  row.length = static_cast<uint32_t>(out.data.size() - row.offset);
  row.name = named->second;
  row.graph = 0;
  row.slot = static_cast<int32_t>(ev.out_ids.size());
  row.wall_time = ev.wall;
  row.step = ev.step;
  row.sequence = seq;
  row.size = h_size, row.neg_inf = h_ni, row.pos_inf = h_pi, row.nan = h_nn;
  row.nonfinite = static_cast<int8_t>(h_bad);
  row.phase = static_cast<int8_t>(ev.phase);
  row.device = static_cast<int16_t>(device);
  out.rows.push_back(row);
  if (range_dtype != 0) {
    // As RangeHistory.add: within a step, the largest amax relative to its format wins
    // (the first on a tie) and the smallest amin; a new step starts a new update.
    const double level = amax / format_max(range_dtype);
    const int64_t key = (static_cast<int64_t>(ev.module) << 2) | ev.phase;
    auto open = out.open_range.find(key);
    if (open != out.open_range.end() && out.ranges[open->second].step == ev.step) {
      RangeUpdate& u = out.ranges[open->second];
      if (level > u.level) u.amax = amax, u.dtype = range_dtype, u.level = level;
      if (amin < u.amin) u.amin = amin;
    } else {
      out.open_range[key] = out.ranges.size();
      out.ranges.push_back({ev.module, ev.phase, ev.step, amax, amin, level, range_dtype});
    }
  }
}

void Encoder::note_seq(int64_t serial, int64_t seq) {
  if (seq_of_serial.size() > kLinksMax) seq_of_serial.clear();
  seq_of_serial[serial] = seq;
}

int64_t Encoder::seq_of(int64_t serial) const {
  auto it = seq_of_serial.find(serial);
  return it == seq_of_serial.end() ? 0 : it->second;
}

}  // namespace nanscope
