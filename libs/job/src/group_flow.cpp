// The static half of group flows (group_flow.h): which tensor goes from which group to which, and
// whether the groups' modules agree on it. Everything here reads only the recipe and, for
// check_group_flows, the modules' declared graph inputs and outputs (no weights, no backend), so
// `hp verify` and `hp launch` can reject a broken recipe before any rank starts.
#include "hp/job/group_flow.h"

#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <map>
#include <set>

#include "hp/exec/executor.h"
#include "hp/exec/tensor.h"
#include "hp/job/job.h"
#include "hp/model/model.h"
#include "hp/plugin/hp_plugin.h"

namespace hp::job {
using exec::dtype_label;
using exec::GraphIO;
namespace fs = std::filesystem;

bool is_scheduler(const recipe::Group& g) { return g.module == kSchedulerModule; }

int FlowGraph::find(const std::string& tensor) const {
  for (std::size_t k = 0; k < flows.size(); ++k)
    if (flows[k].tensor == tensor) return static_cast<int>(k);
  return -1;
}

RowRange rows_of(std::int64_t batch, std::int64_t ranks, std::int64_t index) {
  const std::int64_t first = index * batch / ranks, end = (index + 1) * batch / ranks;
  return {first, end - first};
}

// Tags above those MPI_Comm_create_group uses on MPI_COMM_WORLD in comm_mpi.cpp (< 30000), below
// the 32767 every MPI guarantees (MPI_TAG_UB).
int flow_header_tag(int flow) { return 30001 + 2 * flow; }
int flow_data_tag(int flow) { return 30002 + 2 * flow; }

bool has_flows(const recipe::Recipe& r) {
  std::set<std::string> produced;
  for (const auto& g : r.groups) {
    if (is_scheduler(g)) return true;
    produced.insert(g.outputs.begin(), g.outputs.end());
  }
  for (const auto& g : r.groups)
    for (const auto& in : g.inputs)
      if (produced.count(in)) return true;
  return false;
}

namespace {

std::string group_key(std::size_t i, const char* field) {
  return fmt::format("groups[{}].{}", i, field);
}

// A cycle among the groups (edges producer -> consumer, the scheduler left out: it is both the
// source and the sink of a job), as "a -> b -> a", or empty.
std::string find_cycle(const recipe::Recipe& r, const FlowGraph& fg) {
  const std::size_t n = r.groups.size();
  std::vector<std::set<std::size_t>> next(n);
  for (const auto& f : fg.flows)
    for (auto c : f.consumers)
      if (f.producer != fg.scheduler && c != fg.scheduler) next[f.producer].insert(c);
  std::vector<int> state(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::size_t> path;
  std::string cycle;
  auto dfs = [&](auto&& self, std::size_t g) -> bool {
    state[g] = 1;
    path.push_back(g);
    for (auto c : next[g]) {
      if (state[c] == 1) {
        auto it = std::find(path.begin(), path.end(), c);
        for (; it != path.end(); ++it) cycle += "'" + r.groups[*it].name + "' -> ";
        cycle += "'" + r.groups[c].name + "'";
        return true;
      }
      if (state[c] == 0 && self(self, c)) return true;
    }
    state[g] = 2;
    path.pop_back();
    return false;
  };
  for (std::size_t g = 0; g < n; ++g)
    if (state[g] == 0 && dfs(dfs, g)) break;
  return cycle;
}

}  // namespace

Expected<FlowGraph> build_flows(const recipe::Recipe& r, const recipe::SourceMap& where) {
  FlowGraph fg;
  const std::size_t n = r.groups.size();
  fg.external_inputs.resize(n);
  fg.job_outputs.resize(n);
  std::vector<Diagnostic> problems;
  auto fail = [&](std::size_t g, const char* field, std::string msg, std::string hint = {}) {
    problems.push_back({where.at(group_key(g, field)), std::move(msg), std::move(hint)});
  };
  for (std::size_t i = 0; i < n; ++i) {
    const auto& g = r.groups[i];
    if (!is_scheduler(g)) continue;
    if (fg.scheduler)
      fail(i, "module",
           fmt::format("groups '{}' and '{}' are both schedulers", r.groups[*fg.scheduler].name,
                       g.name),
           "a job has one scheduler rank");
    else
      fg.scheduler = i;
    if (g.ranks.size() != 1)
      fail(
          i, "ranks",
          fmt::format("scheduler group '{}' has {} ranks but must have 1", g.name, g.ranks.size()));
  }

  // Producers first: one per tensor.
  std::map<std::string, std::size_t> producer;
  for (std::size_t i = 0; i < n; ++i)
    for (const auto& t : r.groups[i].outputs) {
      auto [it, added] = producer.emplace(t, i);
      if (added) {
        fg.flows.push_back({t, i, {}});
      } else if (it->second != i) {
        fail(i, "outputs",
             fmt::format("tensor '{}' is produced by groups '{}' and '{}'", t,
                         r.groups[it->second].name, r.groups[i].name),
             "a tensor flowing between groups needs exactly one producer group");
      }
    }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& g = r.groups[i];
    for (const auto& t : g.inputs) {
      auto it = producer.find(t);
      if (it == producer.end()) {
        if (fg.scheduler)
          fail(i, "inputs",
               fmt::format("group '{}' reads '{}' but no group lists it in its outputs", g.name, t),
               fmt::format("add '{}' to the outputs of the group that computes it (the scheduler's "
                           "for a request "
                           "tensor)",
                           t));
        else
          fg.external_inputs[i].push_back(t);
        continue;
      }
      if (it->second == i) {
        fail(i, "inputs",
             fmt::format("group '{}' reads '{}', which it produces itself", g.name, t));
        continue;
      }
      auto& consumers = fg.flows[static_cast<std::size_t>(fg.find(t))].consumers;
      if (std::find(consumers.begin(), consumers.end(), i) == consumers.end())
        consumers.push_back(i);
    }
  }
  // Outputs nobody reads: job outputs without a scheduler, mistakes with one. Unread tensors do not
  // flow, so they leave the flow list.
  std::vector<Flow> flowing;
  for (auto& f : fg.flows) {
    const auto& g = r.groups[f.producer];
    if (!f.consumers.empty()) {
      flowing.push_back(std::move(f));
      continue;
    }
    if (fg.scheduler)
      fail(f.producer, "outputs",
           fmt::format("group '{}' produces '{}' but no group reads it", g.name, f.tensor),
           "list it in the inputs of the group that needs it, or in the scheduler's inputs to make "
           "it a job output");
    else if (g.ranks.size() > 1 && has_flows(r))
      fail(f.producer, "outputs",
           fmt::format(
               "'{}' is a job output of group '{}', whose {} ranks each hold part of the batch",
               f.tensor, g.name, g.ranks.size()),
           "add a scheduler group that lists it in its inputs: the scheduler collects the whole "
           "batch");
    else
      fg.job_outputs[f.producer].push_back(f.tensor);
  }
  fg.flows = std::move(flowing);
  for (auto& f : fg.flows) std::sort(f.consumers.begin(), f.consumers.end());
  if (std::string cycle = find_cycle(r, fg); !cycle.empty())
    problems.push_back(
        {where.at("groups"), "the groups' flows form a cycle: " + cycle,
         "a group runs once it has all of its inputs, so a cycle would wait forever"});
  if (!problems.empty()) return collect_errors(Errc::bad_input, std::move(problems));
  return fg;
}

namespace {

const GraphIO* find_io(const std::vector<GraphIO>& ios, const std::string& name) {
  for (const auto& io : ios)
    if (io.name == name) return &io;
  return nullptr;
}

std::string names_of(const std::vector<GraphIO>& ios) {
  std::string s;
  for (const auto& io : ios) s += (s.empty() ? "" : ", ") + io.name;
  return s.empty() ? "none" : s;
}

std::string io_label(const GraphIO& io) {
  std::string dims;
  for (auto d : io.dims)
    dims += (dims.empty() ? "" : ",") + (d < 0 ? std::string("?") : std::to_string(d));
  return fmt::format("{} [{}]", io.dtype >= 0 ? dtype_label(io.dtype) : std::string("?"), dims);
}

}  // namespace

Status check_group_flows(const Job& job) {
  const recipe::Recipe& r = job.recipe;
  if (job.kind != JobKind::flow_groups) return {};
  HP_ASSIGN_OR_RETURN(auto fg, build_flows(r, job.where));
  const auto& where = job.where;
  std::vector<Diagnostic> problems;
  auto fail = [&](std::size_t g, const char* field, std::string msg, std::string hint = {}) {
    problems.push_back({where.at(group_key(g, field)), std::move(msg), std::move(hint)});
  };

  // Every module's declared inputs and outputs against the group's lists.
  std::vector<std::optional<exec::ModelIO>> io(r.groups.size());
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const auto& g = r.groups[i];
    if (is_scheduler(g)) continue;
    auto m = model::load_model(job.module_path(g));
    if (!m) {
      fail(i, "module",
           fmt::format("group '{}': module '{}': {}", g.name, g.module, m.error().what.message));
      continue;
    }
    io[i] = exec::model_io(*m);
    for (const auto& t : g.inputs)
      if (!find_io(io[i]->inputs, t))
        fail(i, "inputs",
             fmt::format("group '{}' lists input '{}' but its module '{}' has no graph input of "
                         "that name (it has: {})",
                         g.name, t, g.module, names_of(io[i]->inputs)),
             "the names in a group's inputs are its module's graph input names");
    for (const auto& t : g.outputs)
      if (!find_io(io[i]->outputs, t))
        fail(i, "outputs",
             fmt::format("group '{}' lists output '{}' but its module '{}' has no graph output of "
                         "that name (it has: {})",
                         g.name, t, g.module, names_of(io[i]->outputs)),
             "the names in a group's outputs are its module's graph output names");
    if (fg.scheduler)
      for (const auto& in : io[i]->inputs)
        if (std::find(g.inputs.begin(), g.inputs.end(), in.name) == g.inputs.end())
          fail(i, "inputs",
               fmt::format("module input '{}' of group '{}' is fed by no flow", in.name, g.name),
               fmt::format("list '{}' in the group's inputs and in its producer's outputs (the "
                           "scheduler's for a "
                           "request tensor)",
                           in.name));
  }

  // Producer and consumer agree on every flowing tensor: dtype, rank, dims past axis 0, and axis 0
  // as the whole batch (rows per rank x ranks). All flows carry the same batch of requests.
  std::int64_t batch = -1;
  std::string batch_from;
  auto agree_batch = [&](std::size_t g, const GraphIO& x) {
    if (x.dims.empty() || x.dims[0] < 0) return;
    const std::int64_t whole = x.dims[0] * static_cast<std::int64_t>(r.groups[g].ranks.size());
    const std::string from = fmt::format("'{}' of group '{}' ({} ranks x {} rows)", x.name,
                                         r.groups[g].name, r.groups[g].ranks.size(), x.dims[0]);
    if (batch < 0) {
      batch = whole;
      batch_from = from;
    } else if (whole != batch) {
      fail(g, "module",
           fmt::format("{} is a batch of {} requests but {} is {}", from, whole, batch_from, batch),
           "every group serves the same requests: a module's axis 0 is the rows one rank serves");
    }
  };
  for (const auto& f : fg.flows) {
    const auto& p = io[f.producer];
    const GraphIO* out = p ? find_io(p->outputs, f.tensor) : nullptr;
    if (out) agree_batch(f.producer, *out);
    for (auto c : f.consumers) {
      const GraphIO* in = io[c] ? find_io(io[c]->inputs, f.tensor) : nullptr;
      if (!in) continue;
      agree_batch(c, *in);
      if (!out || !out->has_shape || !in->has_shape) continue;
      bool same = out->dtype == in->dtype && out->dims.size() == in->dims.size();
      for (std::size_t d = 1; same && d < in->dims.size(); ++d)
        same = out->dims[d] < 0 || in->dims[d] < 0 || out->dims[d] == in->dims[d];
      if (!same)
        fail(c, "inputs",
             fmt::format("'{}' flows from group '{}' as {} per rank but group '{}' reads it as {}",
                         f.tensor, r.groups[f.producer].name, io_label(*out), r.groups[c].name,
                         io_label(*in)),
             "dtype and every dim past axis 0 must match; axis 0 is the rows each rank serves");
    }
  }
  if (!problems.empty()) return collect_errors(Errc::bad_input, std::move(problems));
  return {};
}

}  // namespace hp::job
