// PipelineStage (pipeline_stage.h): building a rank's chunks, its parameters, and the boundary
// tensors' messages. The step itself is in pipeline_step.cpp.
//
// Tags: a tensor crossing a boundary is two messages, a header (rank count, dtype, dims) and its
// bytes, tagged ((((c * 128 + k) * 2 + direction) * 16 + i) * 2 + {0, 1} for micro-batch k,
// direction 0 (activations) or 1 (their gradients), boundary tensor i, and c = b / p for boundary b
// of p ranks. Between one ordered pair of ranks in one direction the boundaries that pass differ in
// c (interleaving: b = c·p + r; ZB-V: chunk 0's go down the ranks, chunk 1's up), so messages with
// distinct tags never match the wrong receive whatever order the action lists interleave in, and
// with c < 4 every tag stays below 32768, the least MPI_TAG_UB MPI allows.
#include "pipeline_stage.h"

#include <fmt/core.h>

#include <algorithm>
#include <set>

#include "batches.h"
#include "hp/exec/backends.h"
#include "hp/plugin/hp_plugin.h"
#include "hp/train/expert_parallel.h"
#include "pipeline_tags.h"
#include "rewrite.h"

namespace hp::train::detail {

namespace {

bool is_float(int dtype) {
  return dtype == HP_F32 || dtype == HP_F16 || dtype == HP_BF16 || dtype == HP_F64;
}

Status check_role(const PipelineRole& role) {
  const int stages = role.stages(), p = static_cast<int>(role.ranks.size());
  if (static_cast<int>(role.cuts.size()) + 1 != stages)
    return Error(Errc::bad_input, fmt::format("{} pipeline stages need {} stage boundaries, not {}",
                                              stages, stages - 1, role.cuts.size()));
  if (role.micro_batches < 1 || role.micro_batches > kMaxMicro)
    return Error(Errc::bad_input,
                 fmt::format("pipeline training takes 1 to {} micro-batches, not {}", kMaxMicro,
                             role.micro_batches));
  for (const auto& cut : role.cuts)
    if (cut.empty() || cut.size() > static_cast<std::size_t>(kMaxCut))
      return Error(Errc::bad_input,
                   fmt::format("the stage boundary has {} tensors (1 to {} are supported)",
                               cut.size(), kMaxCut));
  if (stages > kMaxChunks * p)
    return Error(Errc::bad_input, fmt::format("{} virtual stages on {} ranks (at most {} chunks "
                                              "per rank are supported)",
                                              stages, p, kMaxChunks));
  for (int s = 0; s < stages; ++s) {
    const int at = role.position(s);
    if (at < 0 || at >= p)
      return Error(Errc::bad_input, fmt::format("virtual stage {} is on no rank", s));
  }
  return {};
}

}  // namespace

Expected<std::unique_ptr<PipelineStage>> PipelineStage::create(const TrainOptions& o,
                                                               const model::Model& forward,
                                                               const model::DimBindings& dims) {
  const PipelineRole& role = o.pp;
  HP_TRY(check_role(role));
  std::unique_ptr<PipelineStage> s(new PipelineStage());
  s->role_ = role;
  s->loss_kind_ = o.grad.loss;
  HP_ASSIGN_OR_RETURN(PipelinePieces pieces, split_pipeline(forward, role.cuts, dims));
  const int last = role.stages() - 1;
  // The floating-point tensors of boundary b: their gradients go back from stage b + 1 to b.
  auto float_cut = [&](int b) {
    std::vector<std::string> out;
    for (const auto& io : exec::model_io(pieces.stages[static_cast<std::size_t>(b) + 1]).inputs)
      for (const auto& c : role.cuts[static_cast<std::size_t>(b)])
        if (io.name == c && is_float(io.dtype)) out.push_back(c);
    return out;
  };
  std::vector<std::filesystem::path> paths(o.plugin_paths.begin(), o.plugin_paths.end());
  HP_ASSIGN_OR_RETURN(auto b,
                      exec::open_backends(o.backend.empty() ? "cpu" : o.backend, o.threads, paths));
  if (o.tp.active()) s->comm_ = std::make_unique<LockedComm>(*o.tp.transport, *s);
  if (o.ep.active()) {
    if (o.tp.active())
      return Error(Errc::not_implemented, "expert parallelism with tensor-parallel stages");
    s->comm_ = std::make_unique<LockedComm>(*o.ep.transport, *s);
    s->experts_of_.resize(o.ep.group.size());
    // split_pipeline types the pieces' inputs (the model's data inputs and the cut tensors) at the
    // micro-batch's dims; where the whole model has a batch dim on axis 0 of one, expert_piece
    // gives it back to the piece reading it.
    HP_ASSIGN_OR_RETURN(const model::Graph symbolic, model::build_graph(forward, {}));
    std::vector<std::string> read;
    for (const auto& in : forward.proto->graph().input()) read.push_back(in.name());
    for (const auto& out : forward.proto->graph().output()) read.push_back(out.name());
    for (const auto& cut : role.cuts) read.insert(read.end(), cut.begin(), cut.end());
    for (const auto& t : read)
      if (const int i = symbolic.find_tensor(t); i >= 0) {
        const auto& d = symbolic.tensor(i).dims;
        if (!d.empty() && !d[0].known() && dims.count(d[0].symbol)) s->row_symbol_[t] = d[0].symbol;
      }
  }
  for (int vs = 0; vs <= last; ++vs) {
    if (!s->mine(vs)) continue;
    Chunk& c = s->chunks_.emplace_back();
    c.stage = vs;
    if (vs > 0) c.float_in = float_cut(vs - 1);
    if (vs < last) c.float_out = float_cut(vs);
    GradSpec spec = o.grad;
    spec.dims = dims;
    if (vs < last) {
      spec.logits.clear();
      spec.output_grads = c.float_out;
    }
    spec.input_grads = c.float_in;
    // Expert parallelism: the members' losses are weighted before their gradients mix in the
    // experts (run_step's share), so the last stage scales the seed in its gradient model.
    if (o.ep.active() && vs == last) {
      spec.loss_scale = kLossScaleInput;
      c.graph_scale = true;
    }
    HP_ASSIGN_OR_RETURN(model::Model fwd, s->piece(o, pieces, vs, spec));
    HP_ASSIGN_OR_RETURN(c.gg, build_grad_graph(fwd, spec));
    HP_ASSIGN_OR_RETURN(GradParts parts,
                        split_backward(c.gg, role.split_weight ? BackwardSplit::input_weight
                                                               : BackwardSplit::whole));
    for (auto [part, dst] :
         {std::pair{&parts.forward, &c.forward}, std::pair{&parts.backward, &c.backward},
          std::pair{&parts.weight, &c.weight}}) {
      dst->part = std::move(*part);
      if (dst->part.empty()) continue;
      HP_ASSIGN_OR_RETURN(dst->ex, exec::Executor::create(dst->part.model, [&] {
                            exec::ExecOptions eo{b.primary, b.cpu, s->comm_.get()};
                            eo.pack_weights = false;  // rewritten every step
                            return eo;
                          }()));
    }
    // A weight two of this rank's chunks read (ZB-V's first and last stage: a tied embedding) is
    // one parameter of the rank; both chunks' gradient parts add into it.
    for (std::size_t k = 0; k < c.gg.grads.size(); ++k) {
      auto at = std::find(s->params_.begin(), s->params_.end(), c.gg.params[k]);
      if (at == s->params_.end()) at = s->params_.insert(at, c.gg.params[k]);
      c.grad_index[c.gg.grads[k]] = static_cast<std::size_t>(at - s->params_.begin());
    }
  }
  for (const auto& [w, stages] : pieces.shared) {
    if (std::find(s->params_.begin(), s->params_.end(), w) == s->params_.end()) continue;
    std::vector<int> ranks;
    for (int st : stages)
      if (std::find(ranks.begin(), ranks.end(), s->rank_of(st)) == ranks.end())
        ranks.push_back(s->rank_of(st));
    if (ranks.size() > 1) s->shared_[w] = std::move(ranks);
    s->owned_[w] = s->mine(stages.front());
  }
  HP_ASSIGN_OR_RETURN(auto values, s->read_params());
  for (auto& v : values) {
    if (v.dtype != HP_F32)
      return Error(Errc::bad_input, "only float32 parameters are trained for now", v.name);
    std::fill(v.data.begin(), v.data.end(), 0);
    s->grads_.push_back(std::move(v));
  }
  return s;
}

Expected<model::Model> PipelineStage::expert_piece(const TrainOptions& o, const model::Model& piece,
                                                   int vs, GradSpec& spec) {
  const int me = o.ep.index();
  // The partition's row checks infer the piece at its dims and at twice the batch (row_probe.cpp):
  // its inputs and outputs take their batch dim back (row_symbol_), or nothing would double.
  model::Model probed = piece;
  auto proto = std::make_shared<onnx::ModelProto>(*piece.proto);
  for (auto* list :
       {proto->mutable_graph()->mutable_input(), proto->mutable_graph()->mutable_output()})
    for (auto& v : *list) {
      auto it = row_symbol_.find(v.name());
      if (it == row_symbol_.end() || !v.type().tensor_type().has_shape() ||
          v.type().tensor_type().shape().dim_size() == 0)
        continue;
      // Replaces the static value (an output too: declared at the micro-batch, it would contradict
      // the inference at twice the batch).
      v.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param(
          it->second);
    }
  probed.proto = std::move(proto);
  HP_ASSIGN_OR_RETURN(ExpertPartition part, partition_experts(probed, o.ep.group, me, o.ep.routed,
                                                              spec.dims, /*allow_none=*/true));
  if (part.layers == 0) return piece;  // no expert here: the stage's weights are all shared
  expert_layers_[0] += part.layers;
  expert_layers_[1] += part.routed;
  expert_layers_[2] += part.summed;
  for (std::size_t m = 0; m < part.experts_of.size() && m < experts_of_.size(); ++m)
    experts_of_[m].insert(experts_of_[m].end(), part.experts_of[m].begin(),
                          part.experts_of[m].end());
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(
      model::Model m,
      model::parse_model(
          part.onnx, o.model.parent_path() / fmt::format("stage{}-ep-member{}.onnx", vs, me), lo));
  // The gathered tokens feed this member's experts: their gradient is summed over the group
  // (expert_parallel.h), as in a tensor-parallel region.
  spec.tp.varying = std::move(part.varying);
  spec.tp.group.assign(o.ep.group.begin(), o.ep.group.end());
  spec.tp.rank = o.ep.transport->rank();
  return m;
}

Expected<model::Model> PipelineStage::piece(const TrainOptions& o, const PipelinePieces& pieces,
                                            int vs, GradSpec& spec) {
  if (o.ep.active()) return expert_piece(o, pieces.stages[static_cast<std::size_t>(vs)], vs, spec);
  if (!o.tp.active()) return pieces.stages[static_cast<std::size_t>(vs)];
  HP_ASSIGN_OR_RETURN(TensorParallelPart part,
                      o.tp.partition(vs, o.tp.position,
                                     role_.grid.at(static_cast<std::size_t>(role_.position(vs)))));
  model::LoadOptions lo;
  lo.mode = model::LoadMode::require_data;
  HP_ASSIGN_OR_RETURN(
      model::Model m,
      model::parse_model(
          part.onnx, o.model.parent_path() / fmt::format("stage{}-member{}.onnx", vs, o.tp.index()),
          lo));
  auto proto = std::make_shared<onnx::ModelProto>(*m.proto);
  HP_TRY(recv_send_to_io(*proto));
  m.proto = std::move(proto);
  spec.dims.clear();  // the partition is specialised to the recipe's dims already
  spec.tp.varying = std::move(part.varying);
  spec.tp.group.assign(o.tp.group.begin(), o.tp.group.end());
  spec.tp.rank = o.tp.transport->rank();
  cuts_ = std::move(part.cuts);
  return m;
}

PipelineStage::Chunk* PipelineStage::chunk(int virtual_stage) {
  for (Chunk& c : chunks_)
    if (c.stage == virtual_stage) return &c;
  return nullptr;
}

Expected<std::vector<exec::HostTensor>> PipelineStage::read_params() {
  std::vector<exec::HostTensor> out;
  for (const auto& p : params_) {
    Part* holder = nullptr;
    for (Chunk& c : chunks_)
      for (Part* q : {&c.forward, &c.backward, &c.weight})
        if (q->ex &&
            std::find(q->part.params.begin(), q->part.params.end(), p) != q->part.params.end())
          holder = q;
    if (!holder) return Error(Errc::internal, "no part of the stage holds parameter " + p);
    HP_ASSIGN_OR_RETURN(auto h, holder->ex->weight(p));
    h.name = p;
    out.push_back(std::move(h));
  }
  return out;
}

bool PipelineStage::owns(const std::string& name) const {
  auto it = owned_.find(name);
  return it == owned_.end() || it->second;
}

std::vector<std::string> PipelineStage::notes() const {
  std::vector<std::string> out;
  for (const Chunk& c : chunks_)
    for (const auto& n : c.gg.notes)
      if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  return out;
}

Status PipelineStage::set_weights(const std::vector<exec::HostTensor>& params) {
  for (Chunk& c : chunks_)
    for (Part* q : {&c.forward, &c.backward, &c.weight}) {
      if (!q->ex) continue;
      for (const auto& p : params)
        if (std::find(q->part.params.begin(), q->part.params.end(), p.name) != q->part.params.end())
          HP_TRY(q->ex->set_weight(p.name, p));
    }
  return {};
}

std::int64_t PipelineStage::peak_bytes() const {
  std::int64_t peak = 0;
  for (const Chunk& c : chunks_)
    for (const Part* q : {&c.forward, &c.backward, &c.weight})
      if (q->ex) peak = std::max(peak, q->ex->stats().peak_bytes);
  return peak + held_peak_;
}

std::unique_lock<std::mutex> PipelineStage::hold() {
  return progress_ ? progress_->lock() : std::unique_lock<std::mutex>();
}

Status PipelineStage::send(int peer, int tag, const exec::HostTensor& t) {
  std::int64_t header[2 + kMaxRank] = {static_cast<std::int64_t>(t.dims.size()), t.dtype};
  if (t.dims.size() > static_cast<std::size_t>(kMaxRank))
    return Error(Errc::not_implemented, "a stage boundary tensor of rank above 8", t.name);
  for (std::size_t i = 0; i < t.dims.size(); ++i) header[2 + i] = t.dims[i];
  auto turn = hold();
  HP_TRY(role_.transport->send(peer, tag, header, sizeof header));
  HP_TRY(role_.transport->send(peer, tag + 1, t.data.data(),
                               static_cast<std::int64_t>(t.data.size())));
  if (progress_) progress_->sent();
  return {};
}

Expected<exec::HostTensor> PipelineStage::recv(int peer, int tag, const std::string& name) {
  std::int64_t header[2 + kMaxRank] = {};
  auto turn = hold();
  HP_TRY(role_.transport->recv(peer, tag, header, sizeof header));
  exec::HostTensor t;
  t.name = name;
  t.dtype = static_cast<int>(header[1]);
  if (header[0] < 0 || header[0] > kMaxRank || exec::dtype_size(t.dtype) == 0)
    return Error(Errc::runtime, "a malformed tensor header from the pipeline peer", name);
  t.dims.assign(header + 2, header + 2 + header[0]);
  t.data.resize(static_cast<std::size_t>(t.numel() * exec::dtype_size(t.dtype)));
  HP_TRY(role_.transport->recv(peer, tag + 1, t.data.data(),
                               static_cast<std::int64_t>(t.data.size())));
  return t;
}

}  // namespace hp::train::detail
