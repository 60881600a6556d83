// The un-offloaded memory timeline of one stage (timeline.h). Weights and optimizer states are
// allocated for the whole step; a unit's gradients from its first backward to the end of the step
// (hp's executor writes them in the backward and the optimizer step consumes them, so none are held
// through the forward); an activation lives from its forward to the end of its backward; the KV
// cache of inference from its forward to the end of the step.
#include "hp/offload/timeline.h"

#include <algorithm>

#include <fmt/core.h>

namespace hp::offload {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::parameters: return "parameters";
    case Kind::gradients: return "gradients";
    case Kind::optimizer: return "optimizer";
    case Kind::activations: return "activations";
    case Kind::kv_cache: return "kv_cache";
    case Kind::buffers: return "buffers";
    case Kind::workspace: return "workspace";
  }
  return "?";
}

double sum(const Breakdown& b) {
  double s = 0;
  for (double x : b) s += x;
  return s;
}

Timeline simulate(const StageInput& in) {
  Timeline t;
  Breakdown fixed{};
  for (const auto& u : in.units) {
    fixed[static_cast<int>(Kind::parameters)] += u.parameters;
    fixed[static_cast<int>(Kind::optimizer)] += u.optimizer;
  }
  fixed[static_cast<int>(Kind::buffers)] = in.buffers;
  fixed[static_cast<int>(Kind::workspace)] = in.workspace;
  double acts = 0, kv = 0, grads = 0, clock = 0;
  auto push = [&](Slot::Type type, std::int64_t u, std::int64_t j, double dur,
                  double transient_act) {
    Slot s;
    s.type = type;
    s.unit = u;
    s.micro = j;
    s.start = clock;
    s.duration = dur;
    s.memory = fixed;
    s.memory[static_cast<int>(Kind::activations)] = acts + transient_act;
    s.memory[static_cast<int>(Kind::kv_cache)] = kv;
    s.memory[static_cast<int>(Kind::gradients)] = grads;
    clock += dur;
    t.slots.push_back(s);
  };
  const auto n = static_cast<std::int64_t>(in.units.size());
  std::vector<bool> born(static_cast<std::size_t>(n), false);
  for (const Op& op : schedule_ops(in.schedule, in.stages, in.stage, in.micro_batches,
                                   in.virtual_stages, in.train)) {
    if (op.forward) {
      for (std::int64_t u = 0; u < n; ++u) {
        const Unit& x = in.units[static_cast<std::size_t>(u)];
        if (x.chunk != op.chunk) continue;
        // The activation kept for backward is written during this forward: count it now.
        acts += in.train ? x.act : 0.0;
        kv += x.kv;
        // Inference keeps nothing for backward, but the layer's activations exist while it runs.
        push(Slot::forward, u, op.micro, x.fwd, in.train ? 0.0 : x.act);
      }
    } else {
      for (std::int64_t u = n - 1; u >= 0; --u) {
        const Unit& x = in.units[static_cast<std::size_t>(u)];
        if (x.chunk != op.chunk) continue;
        if (!born[static_cast<std::size_t>(u)]) {
          born[static_cast<std::size_t>(u)] = true;
          grads += x.gradients;  // written by this backward, kept to the optimizer step
        }
        push(Slot::backward, u, op.micro, x.bwd, x.act_transient);
        acts -= x.act;  // freed once its backward has run
      }
    }
  }
  if (in.train)
    for (std::int64_t u = n - 1; u >= 0; --u)
      push(Slot::optimizer, u, 0, in.units[static_cast<std::size_t>(u)].opt, 0);
  t.step = clock;
  for (std::size_t i = 0; i < t.slots.size(); ++i)
    if (sum(t.slots[i].memory) > sum(t.slots[t.peak].memory)) t.peak = i;
  return t;
}

std::string describe_slot(const StageInput& in, const Slot& s) {
  const std::string& name = in.units[static_cast<std::size_t>(s.unit)].name;
  switch (s.type) {
    case Slot::forward: return fmt::format("forward of {}, micro-batch {}", name, s.micro);
    case Slot::backward: return fmt::format("backward of {}, micro-batch {}", name, s.micro);
    case Slot::optimizer: return fmt::format("optimizer step of {}", name);
  }
  return name;
}

}  // namespace hp::offload
