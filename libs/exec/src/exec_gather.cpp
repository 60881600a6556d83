// Weights lent by a WeightSource (Executor::set_weight_source): ZeRO-3's parameters, which each
// data-parallel rank holds a share of and gathers from the others for the nodes that read them.
//
// Uses. The readers of a group (nodes that take one of its weights as an input, or capture one into
// a subgraph) are cut into uses wherever two consecutive readers are far apart: further than
// max(16, live nodes / (2 x groups)), about the span a group's layer takes in the forward. A
// layer's weights are read in its forward and again in its backward (the input gradient of a
// MatMul reads the weight), with the rest of the model in between, so they make two uses; the last
// layer's two may merge into one, as FSDP keeps the last block's parameters across the loss.
//
// Replay. Uses are numbered by their first node. At the start of a run the first use's group is
// asked for; when use u begins (before its first node) the group of use u + 1 is asked for and
// then u's is fetched into fresh pool buffers, so that u + 1's transfer runs while u computes;
// after use u's last node its weights go back to the pool. The weights are not persistent, so
// nothing is cached from them across runs (a cached transpose would keep a whole copy) and a failed
// run's drain frees them like any other tensor.
#include <fmt/core.h>

#include <algorithm>
#include <set>

#include "exec_internal.h"

namespace hp::exec {

struct GatherState {
  WeightSource* source = nullptr;
  std::vector<std::vector<int>> groups;  ///< tensor ids
  std::vector<char> is_gathered;         ///< by tensor id
  struct Use {
    std::size_t group = 0;
    std::size_t first = 0, last = 0;  ///< node indices
  };
  std::vector<Use> uses;                                  ///< by first node
  std::vector<std::vector<std::size_t>> open_at, end_at;  ///< per node: uses beginning, ending
  std::size_t asked = 0;  ///< this run: uses whose group was asked for (prefetch)
};

bool gathered_weight(const Executor::Impl& im, int id) {
  return im.gather && id >= 0 && static_cast<std::size_t>(id) < im.gather->is_gathered.size() &&
         im.gather->is_gathered[static_cast<std::size_t>(id)];
}

namespace {

void plan_uses(Executor::Impl& im) {
  GatherState& g = *im.gather;
  const std::size_t n = im.nodes.size();
  g.open_at.assign(n, {});
  g.end_at.assign(n, {});
  g.uses.clear();
  const auto live = static_cast<std::size_t>(std::count_if(
      im.nodes.begin(), im.nodes.end(), [](const PreparedNode& x) { return !x.dead; }));
  const std::size_t gap =
      std::max<std::size_t>(16, live / (2 * std::max<std::size_t>(1, g.groups.size())));
  std::vector<char> in_group(im.slots.size(), 0);
  for (std::size_t gi = 0; gi < g.groups.size(); ++gi) {
    for (int id : g.groups[gi]) in_group[static_cast<std::size_t>(id)] = 1;
    std::vector<std::size_t> readers;
    for (std::size_t k = 0; k < n; ++k) {
      const PreparedNode& x = im.nodes[k];
      if (x.dead) continue;
      bool reads = false;
      for (const auto* list : {&x.inputs, &x.captured})
        for (int t : *list) reads = reads || (t >= 0 && in_group[static_cast<std::size_t>(t)]);
      if (reads) readers.push_back(k);
    }
    for (int id : g.groups[gi]) in_group[static_cast<std::size_t>(id)] = 0;
    for (std::size_t a = 0; a < readers.size();) {
      std::size_t b = a;
      while (b + 1 < readers.size() && readers[b + 1] - readers[b] <= gap) ++b;
      g.uses.push_back({gi, readers[a], readers[b]});
      a = b + 1;
    }
  }
  std::stable_sort(
      g.uses.begin(), g.uses.end(),
      [](const GatherState::Use& a, const GatherState::Use& b) { return a.first < b.first; });
  for (std::size_t u = 0; u < g.uses.size(); ++u) {
    g.open_at[g.uses[u].first].push_back(u);
    g.end_at[g.uses[u].last].push_back(u);
  }
}

}  // namespace

Status Executor::set_weight_source(WeightSource* source,
                                   std::vector<std::vector<std::string>> groups) {
  Impl& im = *impl_;
  if (!source) return Error(Errc::bad_input, "set_weight_source without a source");
  if (im.gather) return Error(Errc::bad_input, "the executor has a weight source already");
  if (im.weights_loaded)
    return Error(Errc::bad_input, "set_weight_source after the first run: the weights are loaded");
  if (im.opts.offload.enabled)
    return Error(Errc::not_implemented,
                 "weights gathered from a weight source (ZeRO-3) do not combine with offload yet",
                 "", "drop [offload] or use optimizer_shard 2");
  auto g = std::make_shared<GatherState>();
  g->source = source;
  g->is_gathered.assign(im.slots.size(), 0);
  const std::set<int> outputs(im.output_ids.begin(), im.output_ids.end());
  for (const auto& names : groups) {
    auto& ids = g->groups.emplace_back();
    for (const auto& name : names) {
      const auto [id, host] = find_weight(im, name);
      if (id < 0) return Error(Errc::bad_input, "the model has no initializer of this name", name);
      if (host->dtype != HP_F32)
        return Error(Errc::bad_input, "only float32 weights come from a weight source", name);
      if (g->is_gathered[static_cast<std::size_t>(id)])
        return Error(Errc::bad_input, "the weight is in two groups", name);
      if (outputs.count(id))
        return Error(Errc::bad_input, "a graph output cannot come from a weight source", name);
      g->is_gathered[static_cast<std::size_t>(id)] = 1;
      ids.push_back(id);
    }
  }
  // The slots learn the weights' shapes now and the decoded copies go: the source holds them.
  for (auto& [id, h] : im.weights) {
    if (!g->is_gathered[static_cast<std::size_t>(id)]) continue;
    Slot& s = im.slots[static_cast<std::size_t>(id)];
    s.dtype = h.dtype;
    s.dims = h.dims;
    s.bytes = h.data.size();
    s.weight_key = 0;  // never packed: its value changes every step
    std::vector<unsigned char>().swap(h.data);
  }
  im.gather = std::move(g);
  plan_lifetimes(im);
  plan_uses(im);
  return {};
}

std::vector<std::size_t> Executor::weight_source_order() const {
  std::vector<std::size_t> order;
  if (impl_->gather)
    for (const auto& u : impl_->gather->uses) order.push_back(u.group);
  return order;
}

void gather_begin_run(Executor::Impl& im) {
  im.stats.gathers = 0;
  if (!im.gather) return;
  GatherState& g = *im.gather;
  g.asked = 0;
  if (!g.uses.empty()) {
    g.source->prefetch(g.uses[0].group);
    g.asked = 1;
  }
}

Status gather_before_node(Executor::Impl& im, std::size_t k) {
  if (!im.gather) return {};
  GatherState& g = *im.gather;
  for (std::size_t u : g.open_at[k]) {
    while (g.asked < g.uses.size() && g.asked <= u + 1) g.source->prefetch(g.uses[g.asked++].group);
    const std::vector<int>& ids = g.groups[g.uses[u].group];
    std::vector<float*> dst;
    dst.reserve(ids.size());
    for (int id : ids) {
      if (im.slots[static_cast<std::size_t>(id)].live) im.free_slot(id);
      Slot& s = im.slots[static_cast<std::size_t>(id)];
      HP_ASSIGN_OR_RETURN(void* p, im.alloc(0, s.bytes, id));
      s.ptr[0] = p;
      s.live = true;
      ++s.version;
      dst.push_back(static_cast<float*>(p));
    }
    if (Status st = g.source->fetch(g.uses[u].group, dst); !st)
      return Error(
          st.error().code,
          fmt::format("fetching weight group {}: {}", g.uses[u].group, st.error().message()),
          im.tensor_names[static_cast<std::size_t>(ids.front())]);
    ++im.stats.gathers;
  }
  return {};
}

void gather_after_node(Executor::Impl& im, std::size_t k) {
  if (!im.gather) return;
  for (std::size_t u : im.gather->end_at[k])
    for (int id : im.gather->groups[im.gather->uses[u].group]) im.free_slot(id);
}

}  // namespace hp::exec
