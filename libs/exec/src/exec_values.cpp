// Moving values in and out of slots: the executor's entry points (Executor::run, run_values), a
// host tensor loaded into a slot, and the detached slots control flow passes between a node and its
// bodies (take, put, drop; docs/executor.md, "Control flow"), plus scalar reads of conditions and
// trip counts.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "exec_internal.h"

namespace hp::exec {

namespace {

std::string where_of(const PreparedNode& n) { return n.name.empty() ? n.op_type : n.name; }

}  // namespace

HostTensor empty_scan_output(const GraphIO& io) {
  HostTensor t;
  t.dtype = io.dtype >= 0 ? io.dtype : HP_F32;
  t.dims = {0};
  if (io.has_shape && std::all_of(io.dims.begin(), io.dims.end(), [](auto d) { return d >= 0; }))
    t.dims.insert(t.dims.end(), io.dims.begin(), io.dims.end());
  return t;
}

Expected<Slot> Executor::Impl::take(int id, bool steal) {
  Slot& s = slots[static_cast<std::size_t>(id)];
  if (!s.live)
    return Error(Errc::internal, fmt::format("tensor '{}' read before it was written",
                                             tensor_names[static_cast<std::size_t>(id)]));
  Slot out;
  out.dtype = s.dtype;
  out.dims = s.dims;
  out.bytes = s.bytes;
  out.seq = s.seq;
  out.live = true;
  if (steal) {
    for (int w = 0; w < 2; ++w) {
      out.ptr[w] = s.ptr[w];
      s.ptr[w] = nullptr;
    }
    s.seq.reset();
    s.live = false;
    return out;
  }
  if (s.seq) return out;
  HP_TRY(place(id, 0));
  HP_TRY(be[0]->stream_sync(stream[0]));
  HP_ASSIGN_OR_RETURN(auto p, alloc(0, s.bytes, id));
  const Slot& src = slots[static_cast<std::size_t>(id)];
  if (src.bytes) std::memcpy(p, src.ptr[0], src.bytes);
  out.ptr[0] = p;
  return out;
}

void Executor::Impl::put(int id, Slot&& s) {
  if (id < 0) {
    drop(s);
    return;
  }
  if (slots[static_cast<std::size_t>(id)].live) free_slot(id);
  Slot& d = slots[static_cast<std::size_t>(id)];
  d.dtype = s.dtype;
  d.dims = std::move(s.dims);
  d.bytes = s.bytes;
  d.seq = std::move(s.seq);
  for (int w = 0; w < 2; ++w) {
    d.ptr[w] = s.ptr[w];
    s.ptr[w] = nullptr;
  }
  d.live = true;
  s.live = false;
}

void Executor::Impl::drop(Slot& s) {
  for (int w = 0; w < 2; ++w) {
    release(w, s.ptr[w], s.bytes);
    s.ptr[w] = nullptr;
  }
  s.seq.reset();
  s.live = false;
}

Expected<std::int64_t> Executor::Impl::read_int(int id, const char* what, const PreparedNode& n) {
  HP_TRY(place(id, 0));
  HP_TRY(be[0]->stream_sync(stream[0]));
  const Slot& s = slots[static_cast<std::size_t>(id)];
  std::int64_t count = 1;
  for (std::int64_t d : s.dims) count *= d;
  if (count != 1)
    return Error(Errc::runtime,
                 fmt::format("{}: {} must hold one value, it has shape {}", n.op_type, what,
                             dims_label(s.dims)),
                 where_of(n));
  switch (s.dtype) {
    case HP_BOOL:
    case HP_U8: return static_cast<std::int64_t>(*static_cast<const std::uint8_t*>(s.ptr[0]));
    case HP_I32: return static_cast<std::int64_t>(*static_cast<const std::int32_t*>(s.ptr[0]));
    case HP_I64: return *static_cast<const std::int64_t*>(s.ptr[0]);
    default:
      return Error(Errc::runtime,
                   fmt::format("{}: {} must be bool or an integer, it is {}", n.op_type, what,
                               dtype_label(s.dtype)),
                   where_of(n));
  }
}

Status Executor::Impl::load_tensor(int id, const HostTensor& h) {
  if (slots[static_cast<std::size_t>(id)].live) free_slot(id);
  Slot& s = slots[static_cast<std::size_t>(id)];
  s.dtype = h.dtype;
  s.dims = h.dims;
  s.bytes = h.data.size();
  HP_ASSIGN_OR_RETURN(auto p, alloc(0, s.bytes, id));
  s.ptr[0] = p;
  s.live = true;
  if (s.bytes) std::memcpy(p, h.data.data(), s.bytes);
  return {};
}

Expected<std::vector<HostTensor>> Executor::run(const std::vector<HostTensor>& inputs) {
  Impl& im = *impl_;
  for (std::size_t k = 0; k < im.inputs.size() && k < inputs.size(); ++k)
    if (im.inputs[k].sequence)
      return Error(
          Errc::bad_input,
          fmt::format("graph input '{}' is a sequence; run it with run_values", im.inputs[k].name));
  im.early_outputs.clear();
  if (im.output_hook) im.early_outputs.resize(im.output_ids.size());
  HP_TRY(im.run_graph(inputs.size(),
                      [&](std::size_t k, int id) { return im.load_tensor(id, inputs[k]); }));
  std::vector<HostTensor> out;
  for (std::size_t k = 0; k < im.output_ids.size(); ++k) {
    if (!im.early_outputs.empty() && im.early_outputs[k]) {
      out.push_back(std::move(*im.early_outputs[k]));
      continue;
    }
    auto h = im.to_host(im.output_ids[k]);
    if (!h) return im.fail_run(std::move(h).error());
    out.push_back(std::move(*h));
  }
  im.early_outputs.clear();
  im.end_run();
  return out;
}

void Executor::set_output_hook(OutputHook hook) {
  Impl& im = *impl_;
  im.output_hook = std::move(hook);
  im.hooked_outputs.clear();
  if (im.output_hook)
    for (std::size_t k = 0; k < im.output_ids.size(); ++k)
      im.hooked_outputs[im.output_ids[k]].push_back(k);
  plan_hooked_release(im);
}

Expected<std::vector<HostValue>> Executor::run_values(const std::vector<HostValue>& inputs) {
  Impl& im = *impl_;
  auto load = [&](std::size_t k, int id) -> Status {
    const HostValue& v = inputs[k];
    if (!v.is_sequence) return im.load_tensor(id, v.tensor);
    auto seq = std::make_shared<SeqValue>();
    seq->elem_dtype = v.elem_dtype;
    for (const HostTensor& t : v.items) seq->items.push_back(std::make_shared<const HostTensor>(t));
    im.set_seq(id, std::move(seq));
    return {};
  };
  im.early_outputs.clear();  // the hook serves run() only
  HP_TRY(im.run_graph(inputs.size(), load));
  std::vector<HostValue> out;
  for (int id : im.output_ids) {
    HostValue v;
    const Slot& s = im.slots[static_cast<std::size_t>(id)];
    if (s.live && s.seq) {
      v.is_sequence = true;
      v.elem_dtype = s.seq->elem_dtype;
      for (const auto& t : s.seq->items) v.items.push_back(*t);
      for (HostTensor& t : v.items) t.name.clear();
    } else {
      auto h = im.to_host(id);
      if (!h) return im.fail_run(std::move(h).error());
      v.tensor = std::move(*h);
    }
    out.push_back(std::move(v));
  }
  im.end_run();
  return out;
}
}  // namespace hp::exec
