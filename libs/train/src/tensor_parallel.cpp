// Tensor-parallel training's collectives over the parameters (hp/train/tensor_parallel.h).
#include "hp/train/tensor_parallel.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hp/plugin/hp_plugin.h"
#include "rewrite.h"

namespace hp::train {

namespace {

using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

std::int64_t count(const Ranges& r) {
  std::int64_t n = 1;
  for (auto [b, e] : r) n *= e - b;
  return n;
}

/// Copies the block `r` of a row-major f32 tensor shaped `view` between `whole` and the packed
/// `piece` (to_whole: piece -> whole), one run of the last dim at a time.
void copy_block(const std::vector<std::int64_t>& view, const Ranges& r, float* whole, float* piece,
                bool to_whole) {
  const std::size_t nd = view.size();
  if (nd == 0) {
    if (to_whole)
      whole[0] = piece[0];
    else
      piece[0] = whole[0];
    return;
  }
  std::vector<std::int64_t> stride(nd, 1);
  for (std::size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * view[d];
  const std::int64_t run = r[nd - 1].second - r[nd - 1].first;
  std::vector<std::int64_t> idx(nd);
  for (std::size_t d = 0; d < nd; ++d) idx[d] = r[d].first;
  for (const auto& [b, e] : r)
    if (e <= b) return;
  std::int64_t out = 0;
  while (true) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < nd; ++d) at += idx[d] * stride[d];
    float* w = whole + at;
    float* p = piece + out;
    std::memcpy(to_whole ? w : p, to_whole ? p : w, static_cast<std::size_t>(run) * sizeof(float));
    out += run;
    // The next run: advance the index over every dim but the last, minor first.
    int d = static_cast<int>(nd) - 2;
    for (; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      if (++idx[u] < r[u].second) break;
      idx[u] = r[u].first;
    }
    if (d < 0) return;
  }
}

}  // namespace

int TensorParallel::index() const {
  if (!transport) return -1;
  auto it = std::find(group.begin(), group.end(), transport->rank());
  return it == group.end() ? -1 : static_cast<int>(it - group.begin());
}

Expected<std::unique_ptr<TensorParallelSync>> TensorParallelSync::create(
    const TensorParallel& tp, const std::map<std::string, ParamCut>& cuts,
    const std::vector<exec::HostTensor>& params) {
  std::unique_ptr<TensorParallelSync> s(new TensorParallelSync());
  s->tp_ = &tp;
  s->index_ = tp.index();
  if (s->index_ < 0) return Error(Errc::bad_input, "this rank is not in its tensor-parallel group");
  s->owned_ = cuts;
  for (const auto& p : params) {
    s->names_.push_back(p.name);
    s->local_dims_.push_back(p.dims);
    auto it = s->owned_.find(p.name);
    s->partial_.push_back(it == s->owned_.end() ? 1 : it->second.partial);
    // Split or whole: the norm, the gathers and the slices all read float32.
    if (p.dtype != HP_F32)
      return Error(Errc::bad_input, fmt::format("'{}' is not float32", p.name));
    if (it == s->owned_.end() || it->second.partial > 1) {
      s->cuts_.push_back(nullptr);  // the same on every member
      continue;
    }
    const ParamCut& c = it->second;
    if (c.ranges.size() != tp.group.size() ||
        count(c.ranges[static_cast<std::size_t>(s->index_)]) != p.numel())
      return Error(Errc::bad_input,
                   fmt::format("'{}': the partition's slice ({} elements) is not its layout's",
                               p.name, p.numel()));
    s->cuts_.push_back(&c);
  }
  return s;
}

void TensorParallelSync::to_trained(std::vector<exec::HostTensor>& params) const {
  for (std::size_t k = 0; k < params.size(); ++k)
    if (partial_[k] > 1) {
      float* v = params[k].as<float>();
      for (std::int64_t i = 0; i < params[k].numel(); ++i) v[i] *= static_cast<float>(partial_[k]);
    }
}

exec::HostTensor TensorParallelSync::stored(std::size_t param,
                                            const exec::HostTensor& trained) const {
  exec::HostTensor s = trained;
  if (partial_[param] > 1) {
    float* v = s.as<float>();
    for (std::int64_t i = 0; i < s.numel(); ++i) v[i] /= static_cast<float>(partial_[param]);
  }
  return s;
}

Expected<double> TensorParallelSync::global_norm(const std::vector<exec::HostTensor>& grads) const {
  std::vector<char> split_mask(grads.size()), whole_mask(grads.size());
  for (std::size_t k = 0; k < grads.size(); ++k) {
    split_mask[k] = cuts_[k] != nullptr;
    whole_mask[k] = !split_mask[k];
  }
  double split_sq = sum_of_squares(grads, split_mask);
  HP_TRY(
      tp_->transport->allreduce(tp_->group, &split_sq, &split_sq, 1, HP_F64, comm::ReduceOp::sum));
  return std::sqrt(split_sq + sum_of_squares(grads, whole_mask));
}

Expected<std::vector<exec::HostTensor>> TensorParallelSync::gather(
    const std::vector<exec::HostTensor>& slices) const {
  std::vector<exec::HostTensor> out;
  const std::size_t p = tp_->group.size();
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const exec::HostTensor& s = slices[k];
    if (!cuts_[k]) {
      out.push_back(s);
      continue;
    }
    const ParamCut& c = *cuts_[k];
    if (s.dtype != HP_F32)
      return Error(Errc::internal, fmt::format("'{}' is not float32", names_[k]));
    std::vector<float> all(static_cast<std::size_t>(s.numel()) * p);
    HP_TRY(tp_->transport->allgather(tp_->group, s.data.data(), all.data(),
                                     static_cast<std::int64_t>(s.data.size())));
    exec::HostTensor w;
    w.name = s.name;
    w.dtype = HP_F32;
    w.dims = c.shape;
    std::int64_t n = 1;
    for (auto d : c.shape) n *= d;
    w.data.assign(static_cast<std::size_t>(n) * sizeof(float), 0);
    for (std::size_t j = 0; j < p; ++j)
      copy_block(c.view, c.ranges[j], w.as<float>(),
                 all.data() + j * static_cast<std::size_t>(s.numel()), true);
    out.push_back(std::move(w));
  }
  return out;
}

Expected<exec::HostTensor> TensorParallelSync::slice(std::size_t param,
                                                     const exec::HostTensor& whole) const {
  if (!cuts_[param]) return whole;
  const ParamCut& c = *cuts_[param];
  if (whole.dims != c.shape || whole.dtype != HP_F32)
    return Error(Errc::bad_input,
                 fmt::format("'{}' is not a float32 tensor of the model's shape", names_[param]));
  const Ranges& r = c.ranges[static_cast<std::size_t>(index_)];
  exec::HostTensor s;
  s.name = whole.name;
  s.dtype = HP_F32;
  s.dims = local_dims_[param];
  s.data.assign(static_cast<std::size_t>(count(r)) * sizeof(float), 0);
  copy_block(c.view, r, const_cast<float*>(whole.as<float>()), s.as<float>(), false);
  return s;
}

std::vector<Extent> TensorParallelSync::runs(std::size_t param) const {
  std::int64_t n = 1;
  for (auto d : local_dims_[param]) n *= d;
  if (!cuts_[param]) return {{0, n}};
  const ParamCut& c = *cuts_[param];
  const Ranges& r = c.ranges[static_cast<std::size_t>(index_)];
  const std::size_t nd = c.view.size();
  if (nd == 0 || n == 0) return n ? std::vector<Extent>{{0, n}} : std::vector<Extent>{};
  // copy_block's walk: one run of the last dim per index of the others, minor first.
  std::vector<std::int64_t> stride(nd, 1), idx(nd);
  for (std::size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * c.view[d];
  for (std::size_t d = 0; d < nd; ++d) idx[d] = r[d].first;
  const std::int64_t run = r[nd - 1].second - r[nd - 1].first;
  std::vector<Extent> out;
  while (true) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < nd; ++d) at += idx[d] * stride[d];
    if (!out.empty() && out.back().begin + out.back().count == at)
      out.back().count += run;
    else
      out.push_back({at, run});
    int d = static_cast<int>(nd) - 2;
    for (; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      if (++idx[u] < r[u].second) break;
      idx[u] = r[u].first;
    }
    if (d < 0) return out;
  }
}

std::vector<std::int64_t> TensorParallelSync::whole_dims(std::size_t param) const {
  return cuts_[param] ? cuts_[param]->shape : local_dims_[param];
}

namespace detail {

Status recv_send_to_io(onnx::ModelProto& m) {
  onnx::GraphProto& g = *m.mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (auto& n : *g.mutable_node()) {
    if (n.domain() != "hp" || (n.op_type() != "Recv" && n.op_type() != "Send")) {
      *kept.Add() = std::move(n);
      continue;
    }
    if (n.op_type() == "Send") {
      bool listed = false;
      for (const auto& o : g.output()) listed = listed || o.name() == n.input(0);
      if (!listed)
        return Error(Errc::bad_input,
                     fmt::format("the partition sends '{}', which is no graph output", n.input(0)));
      continue;
    }
    // The received activation: a graph input of the dtype and local shape the Recv names.
    auto* in = g.add_input();
    in->set_name(n.output(0));
    auto* tt = in->mutable_type()->mutable_tensor_type();
    for (const auto& a : n.attribute()) {
      if (a.name() == "dtype") tt->set_elem_type(static_cast<std::int32_t>(a.i()));
      if (a.name() == "shape")
        for (auto d : a.ints()) tt->mutable_shape()->add_dim()->set_dim_value(d);
    }
  }
  g.mutable_node()->Swap(&kept);
  return {};
}

}  // namespace detail

}  // namespace hp::train
