// Sequence values and the sequence ops (SequenceEmpty, SequenceConstruct, SequenceInsert,
// SequenceAt, SequenceErase, SequenceLength, SplitToSequence, ConcatFromSequence, SequenceMap,
// and Identity of a sequence).
//
// A sequence is a value kind of its own in a slot (Slot::seq) next to tensors: an immutable list of
// host tensors shared by pointer, so SequenceInsert or an Identity copies the list, never the
// elements. No backend kernel sees one: an op other than these reading a sequence is an error
// (Impl::place). The elements stay in host memory because sequences in exported models are
// bookkeeping around the real work (a list of chunks to concatenate, the per-iteration results of a
// Loop); SequenceAt and ConcatFromSequence copy into a pool buffer, where kernels read as usual.
// docs/executor.md, "Sequences".
#include <fmt/core.h>

#include <cstring>

#include "exec_internal.h"

namespace hp::exec {

namespace {

std::string where_of(const PreparedNode& n) { return n.name.empty() ? n.op_type : n.name; }

std::int64_t product(const std::vector<std::int64_t>& d, std::size_t from, std::size_t to) {
  std::int64_t p = 1;
  for (std::size_t k = from; k < to; ++k) p *= d[k];
  return p;
}

}  // namespace

HostTensor narrow_axis(const HostTensor& t, int axis, std::int64_t start, std::int64_t len) {
  const auto ax = static_cast<std::size_t>(axis);
  const std::int64_t outer = product(t.dims, 0, ax);
  const std::int64_t inner = product(t.dims, ax + 1, t.dims.size()) * dtype_size(t.dtype);
  const std::int64_t dim = t.dims[ax];
  HostTensor r;
  r.dtype = t.dtype;
  r.dims = t.dims;
  r.dims[ax] = len;
  r.data.resize(static_cast<std::size_t>(outer * len * inner));
  for (std::int64_t o = 0; o < outer && len * inner > 0; ++o)
    std::memcpy(r.data.data() + o * len * inner, t.data.data() + (o * dim + start) * inner,
                static_cast<std::size_t>(len * inner));
  return r;
}

HostTensor slice_axis(const HostTensor& t, int axis, std::int64_t index) {
  HostTensor r = narrow_axis(t, axis, index, 1);
  r.dims.erase(r.dims.begin() + axis);
  return r;
}

Expected<HostTensor> join_axis(const std::vector<const HostTensor*>& items, int axis, bool stack,
                               const std::string& where) {
  if (items.empty()) return Error(Errc::runtime, "nothing to concatenate", where);
  const HostTensor& first = *items[0];
  auto dims_of = [&](const HostTensor& t) {
    std::vector<std::int64_t> d = t.dims;
    if (stack) d.insert(d.begin() + axis, 1);
    return d;
  };
  std::vector<std::int64_t> out = dims_of(first);
  const auto ax = static_cast<std::size_t>(axis);
  if (ax >= out.size())
    return Error(Errc::runtime,
                 fmt::format("axis {} is out of range for rank {}", axis, first.dims.size()),
                 where);
  out[ax] = 0;
  for (const HostTensor* t : items) {
    const auto d = dims_of(*t);
    bool same = t->dtype == first.dtype && d.size() == out.size();
    for (std::size_t k = 0; same && k < d.size(); ++k)
      if (k != ax && d[k] != out[k]) same = false;
    if (!same)
      return Error(
          Errc::runtime,
          fmt::format("cannot join {} {} with {} {} along axis {}", dtype_label(t->dtype),
                      dims_label(t->dims), dtype_label(first.dtype), dims_label(first.dims), axis),
          where);
    out[ax] += d[ax];
  }
  const std::int64_t outer = product(out, 0, ax);
  const std::int64_t inner = product(out, ax + 1, out.size()) * dtype_size(first.dtype);
  HostTensor r;
  r.dtype = first.dtype;
  r.dims = out;
  r.data.resize(static_cast<std::size_t>(outer * out[ax] * inner));
  std::int64_t at = 0;  // offset along the axis
  for (const HostTensor* t : items) {
    const std::int64_t len = stack ? 1 : t->dims[ax];
    for (std::int64_t o = 0; o < outer && len * inner > 0; ++o)
      std::memcpy(r.data.data() + (o * out[ax] + at) * inner, t->data.data() + o * len * inner,
                  static_cast<std::size_t>(len * inner));
    at += len;
  }
  return r;
}

Expected<const SeqValue*> Executor::Impl::seq_of(int id, const PreparedNode& n) {
  const Slot* s = id >= 0 ? &slots[static_cast<std::size_t>(id)] : nullptr;
  if (!s || !s->live || !s->seq)
    return Error(Errc::runtime,
                 fmt::format("{} reads '{}', which is not a sequence", n.op_type,
                             id >= 0 ? tensor_names[static_cast<std::size_t>(id)] : ""),
                 where_of(n));
  return s->seq.get();
}

void Executor::Impl::set_seq(int id, std::shared_ptr<const SeqValue> v) {
  if (id < 0) return;
  if (slots[static_cast<std::size_t>(id)].live) free_slot(id);
  Slot& s = slots[static_cast<std::size_t>(id)];
  s.dtype = v->elem_dtype;
  s.dims.clear();
  s.bytes = 0;
  s.seq = std::move(v);
  s.live = true;
}

namespace {

/// A position input of SequenceInsert / At / Erase made non-negative; `size` is the valid upper
/// bound (inclusive for an insert, which may append).
Expected<std::int64_t> position(Executor::Impl& im, const PreparedNode& n, std::int64_t dflt,
                                std::int64_t size, bool inclusive) {
  std::int64_t p = dflt;
  if (n.inputs.size() > 1 && n.inputs[1] >= 0 && n.builtin != Builtin::SequenceInsert) {
    HP_ASSIGN_OR_RETURN(p, im.read_int(n.inputs[1], "the position", n));
  }
  if (n.builtin == Builtin::SequenceInsert && n.inputs.size() > 2 && n.inputs[2] >= 0) {
    HP_ASSIGN_OR_RETURN(p, im.read_int(n.inputs[2], "the position", n));
  }
  const std::int64_t hi = inclusive ? size : size - 1;
  if (p < -size || p > hi)
    return Error(Errc::runtime,
                 fmt::format("{}: position {} is outside [{}, {}]", n.op_type, p, -size, hi),
                 where_of(n));
  return p < 0 ? p + size : p;
}

}  // namespace

Status Executor::Impl::run_sequence(PreparedNode& n) {
  auto out = std::make_shared<SeqValue>();
  auto host = [&](int id) -> Expected<std::shared_ptr<const HostTensor>> {
    HP_ASSIGN_OR_RETURN(auto h, to_host(id));
    return std::make_shared<const HostTensor>(std::move(h));
  };
  const int o = n.outputs.empty() ? -1 : n.outputs[0];
  switch (n.builtin) {
    case Builtin::SequenceEmpty:
      out->elem_dtype = dtype_from_onnx(static_cast<std::int32_t>(attr_int(n, "dtype", 1)));
      break;
    case Builtin::SequenceConstruct:
      for (int id : n.inputs) {
        HP_ASSIGN_OR_RETURN(auto t, host(id));
        if (!out->items.empty() && t->dtype != out->elem_dtype)
          return Error(Errc::runtime, "SequenceConstruct: the inputs' types differ", where_of(n));
        out->elem_dtype = t->dtype;
        out->items.push_back(std::move(t));
      }
      break;
    case Builtin::SequenceInsert: {
      HP_ASSIGN_OR_RETURN(const SeqValue* s, seq_of(n.inputs[0], n));
      *out = *s;
      HP_ASSIGN_OR_RETURN(auto t, host(n.inputs.size() > 1 ? n.inputs[1] : -1));
      if (out->elem_dtype >= 0 && t->dtype != out->elem_dtype)
        return Error(Errc::runtime,
                     fmt::format("SequenceInsert: a {} tensor into a sequence of {}",
                                 dtype_label(t->dtype), dtype_label(out->elem_dtype)),
                     where_of(n));
      const auto size = static_cast<std::int64_t>(out->items.size());
      HP_ASSIGN_OR_RETURN(auto p, position(*this, n, size, size, true));
      out->elem_dtype = t->dtype;
      out->items.insert(out->items.begin() + p, std::move(t));
      break;
    }
    case Builtin::SequenceErase: {
      HP_ASSIGN_OR_RETURN(const SeqValue* s, seq_of(n.inputs[0], n));
      *out = *s;
      const auto size = static_cast<std::int64_t>(out->items.size());
      HP_ASSIGN_OR_RETURN(auto p, position(*this, n, size - 1, size, false));
      out->items.erase(out->items.begin() + p);
      break;
    }
    case Builtin::SequenceAt: {
      HP_ASSIGN_OR_RETURN(const SeqValue* s, seq_of(n.inputs[0], n));
      const auto size = static_cast<std::int64_t>(s->items.size());
      if (n.inputs.size() < 2 || n.inputs[1] < 0)
        return Error(Errc::bad_input, "SequenceAt needs a position", where_of(n));
      HP_ASSIGN_OR_RETURN(auto p, position(*this, n, 0, size, false));
      return o < 0 ? Status{} : load_tensor(o, *s->items[static_cast<std::size_t>(p)]);
    }
    case Builtin::SequenceLength: {
      HP_ASSIGN_OR_RETURN(const SeqValue* s, seq_of(n.inputs[0], n));
      HostTensor len;
      len.dtype = HP_I64;
      len.data.resize(8);
      const auto v = static_cast<std::int64_t>(s->items.size());
      std::memcpy(len.data.data(), &v, 8);
      return o < 0 ? Status{} : load_tensor(o, len);
    }
    case Builtin::SplitToSequence: {
      HP_ASSIGN_OR_RETURN(auto x, to_host(n.inputs[0]));
      const auto rank = static_cast<std::int64_t>(x.dims.size());
      std::int64_t axis = attr_int(n, "axis", 0);
      if (axis < -rank || axis >= rank)
        return Error(
            Errc::bad_input,
            fmt::format("SplitToSequence: axis {} is out of range for rank {}", axis, rank),
            where_of(n));
      if (axis < 0) axis += rank;
      const int ax = static_cast<int>(axis);
      const std::int64_t dim = x.dims[static_cast<std::size_t>(ax)];
      out->elem_dtype = x.dtype;
      const bool has_split = n.inputs.size() > 1 && n.inputs[1] >= 0;
      if (!has_split) {  // one element per index, the axis dropped unless keepdims
        const bool keep = attr_int(n, "keepdims", 1) != 0;
        for (std::int64_t i = 0; i < dim; ++i)
          out->items.push_back(std::make_shared<const HostTensor>(keep ? narrow_axis(x, ax, i, 1)
                                                                       : slice_axis(x, ax, i)));
        break;
      }
      HP_ASSIGN_OR_RETURN(auto split, to_host(n.inputs[1]));
      std::vector<std::int64_t> lens;
      for (std::int64_t i = 0; i < split.numel(); ++i)
        lens.push_back(split.dtype == HP_I32 ? split.as<std::int32_t>()[i]
                                             : split.as<std::int64_t>()[i]);
      if (split.dims.empty()) {  // a scalar: chunks of that size, the last one shorter
        const std::int64_t c = lens.at(0);
        if (c <= 0)
          return Error(Errc::runtime, fmt::format("SplitToSequence: split {} is not positive", c),
                       where_of(n));
        lens.clear();
        for (std::int64_t at = 0; at < dim; at += c) lens.push_back(std::min(c, dim - at));
      }
      std::int64_t at = 0;
      for (std::int64_t l : lens) {
        if (l < 0 || at + l > dim)
          return Error(Errc::runtime,
                       fmt::format("SplitToSequence: the split lengths do not sum to {}", dim),
                       where_of(n));
        out->items.push_back(std::make_shared<const HostTensor>(narrow_axis(x, ax, at, l)));
        at += l;
      }
      if (at != dim)
        return Error(Errc::runtime,
                     fmt::format("SplitToSequence: the split lengths sum to {}, not {}", at, dim),
                     where_of(n));
      break;
    }
    case Builtin::ConcatFromSequence: {
      HP_ASSIGN_OR_RETURN(const SeqValue* s, seq_of(n.inputs[0], n));
      if (s->items.empty())
        return Error(Errc::runtime, "ConcatFromSequence of an empty sequence", where_of(n));
      const bool stack = attr_int(n, "new_axis", 0) != 0;
      const auto rank = static_cast<std::int64_t>(s->items[0]->dims.size()) + (stack ? 1 : 0);
      std::int64_t axis = attr_int(n, "axis", 0);
      if (axis < -rank || axis >= rank)
        return Error(
            Errc::bad_input,
            fmt::format("ConcatFromSequence: axis {} is out of range for rank {}", axis, rank),
            where_of(n));
      if (axis < 0) axis += rank;
      std::vector<const HostTensor*> items;
      for (const auto& t : s->items) items.push_back(t.get());
      HP_ASSIGN_OR_RETURN(auto joined,
                          join_axis(items, static_cast<int>(axis), stack, where_of(n)));
      return o < 0 ? Status{} : load_tensor(o, joined);
    }
    default: return Error(Errc::internal, fmt::format("no sequence op {}", n.op_type), where_of(n));
  }
  set_seq(o, std::move(out));
  return {};
}

Status Executor::Impl::run_sequence_map(PreparedNode& n) {
  Body& b = *n.bodies[0];
  HP_ASSIGN_OR_RETURN(const SeqValue* first, seq_of(n.inputs[0], n));
  const std::size_t len = first->items.size();
  // Inputs after the first may be sequences (mapped element by element) or tensors (the same
  // tensor in every iteration).
  std::vector<std::shared_ptr<const SeqValue>> seqs(n.inputs.size());
  std::vector<HostTensor> tensors(n.inputs.size());
  for (std::size_t j = 0; j < n.inputs.size(); ++j) {
    const Slot& s = slots[static_cast<std::size_t>(n.inputs[j])];
    if (s.seq) {
      seqs[j] = s.seq;
      if (s.seq->items.size() != len)
        return Error(Errc::runtime,
                     fmt::format("SequenceMap: input sequences have {} and {} elements", len,
                                 s.seq->items.size()),
                     where_of(n));
    } else {
      HP_ASSIGN_OR_RETURN(tensors[j], to_host(n.inputs[j]));
    }
  }
  std::vector<std::shared_ptr<SeqValue>> outs(n.outputs.size());
  for (std::size_t k = 0; k < outs.size(); ++k) {
    outs[k] = std::make_shared<SeqValue>();
    outs[k]->elem_dtype = b.output_io[k].dtype;
  }
  for (std::size_t i = 0; i < len; ++i) {
    for (std::size_t j = 0; j < n.inputs.size(); ++j)
      HP_TRY(load_tensor(b.inputs[j], seqs[j] ? *seqs[j]->items[i] : tensors[j]));
    HP_TRY(run_body(b));
    for (std::size_t k = 0; k < outs.size(); ++k) {
      HP_ASSIGN_OR_RETURN(auto h, to_host(b.outputs[k]));
      outs[k]->elem_dtype = h.dtype;
      outs[k]->items.push_back(std::make_shared<const HostTensor>(std::move(h)));
    }
    clear_body(b);
  }
  for (std::size_t k = 0; k < outs.size(); ++k) set_seq(n.outputs[k], std::move(outs[k]));
  return {};
}

}  // namespace hp::exec
