// Scan in the executor (opset 9 and later, and Scan-8 with its batch axis and sequence_lens): the
// scan inputs are sliced into host tensors step by step, the body runs through the executor's node
// loop (exec_subgraph.cpp), and the per-step scan outputs are joined at the end (slice_axis /
// join_axis, exec_sequence.cpp). docs/executor.md, "Control flow".
#include <fmt/core.h>

#include <algorithm>

#include "exec_internal.h"

namespace hp::exec {

namespace {

std::string where_of(const PreparedNode& n) { return n.name.empty() ? n.op_type : n.name; }

/// The scan itself, on host tensors: `steps` iterations over `xs` (sliced along in_axes, backwards
/// where in_dirs says), `states` updated in place, every iteration's scan outputs appended to `ys`.
Status scan_steps(Executor::Impl& im, Body& b, std::vector<HostTensor>& states,
                  const std::vector<HostTensor>& xs, const std::vector<int>& in_axes,
                  const std::vector<std::int64_t>& in_dirs, std::int64_t steps,
                  std::vector<std::vector<HostTensor>>& ys) {
  const std::size_t ns = states.size();
  for (std::int64_t t = 0; t < steps; ++t) {
    for (std::size_t j = 0; j < ns; ++j) HP_TRY(im.load_tensor(b.inputs[j], states[j]));
    for (std::size_t m = 0; m < xs.size(); ++m) {
      const std::int64_t at = in_dirs[m] ? steps - 1 - t : t;
      HP_TRY(im.load_tensor(b.inputs[ns + m], slice_axis(xs[m], in_axes[m], at)));
    }
    HP_TRY(im.run_body(b));
    for (std::size_t j = 0; j < ns; ++j) {
      HP_ASSIGN_OR_RETURN(states[j], im.to_host(b.outputs[j]));
    }
    for (std::size_t k = 0; k < ys.size(); ++k) {
      HP_ASSIGN_OR_RETURN(auto h, im.to_host(b.outputs[ns + k]));
      ys[k].push_back(std::move(h));
    }
    im.clear_body(b);
  }
  return {};
}

/// An axis attribute in [-rank, rank) made non-negative; Errc::bad_input otherwise.
Expected<int> norm_axis(std::int64_t a, std::size_t rank, const PreparedNode& n) {
  const auto r = static_cast<std::int64_t>(rank);
  if (a < -r || a >= r)
    return Error(Errc::bad_input,
                 fmt::format("{}: axis {} is out of range for rank {}", n.op_type, a, r),
                 where_of(n));
  return static_cast<int>(a < 0 ? a + r : a);
}

}  // namespace

Status Executor::Impl::run_scan(PreparedNode& n) {
  Body& b = *n.bodies[0];
  const bool v8 = n.opset < 9;  // Scan-8: a leading batch axis and a sequence_lens input
  const std::size_t first = v8 ? 1 : 0;
  const std::size_t m = static_cast<std::size_t>(attr_int(n, "num_scan_inputs", 0));
  if (m < 1 || m > n.inputs.size() - first)
    return Error(Errc::bad_input,
                 fmt::format("Scan: num_scan_inputs {} does not fit {} inputs", m, n.inputs.size()),
                 where_of(n));
  const std::size_t ns = n.inputs.size() - first - m, ks = n.outputs.size() - ns;
  std::vector<HostTensor> states, xs;
  for (std::size_t j = first; j < n.inputs.size(); ++j) {
    HP_ASSIGN_OR_RETURN(auto h, to_host(n.inputs[j]));
    (j < first + ns ? states : xs).push_back(std::move(h));
  }
  auto dirs_of = [&](const char* name, std::size_t count) {
    auto v = attr_ints(n, name);
    v.resize(count, 0);
    return v;
  };
  const auto in_dirs = dirs_of(v8 ? "directions" : "scan_input_directions", m);
  std::vector<std::int64_t> ys_axes(ks, 0), out_dirs = dirs_of("scan_output_directions", ks);
  if (!v8) {
    auto a = attr_ints(n, "scan_output_axes");
    for (std::size_t k = 0; k < a.size() && k < ks; ++k) ys_axes[k] = a[k];
  }
  std::vector<int> in_axes(m, 0);
  std::int64_t steps = -1;
  const int batch_dims = v8 ? 1 : 0;
  {
    auto a = attr_ints(n, "scan_input_axes");
    for (std::size_t k = 0; k < m; ++k) {
      const std::size_t rank = xs[k].dims.size() - (v8 && !xs[k].dims.empty() ? 1 : 0);
      HP_ASSIGN_OR_RETURN(in_axes[k], norm_axis(!v8 && k < a.size() ? a[k] : 0, rank, n));
      const std::int64_t len = xs[k].dims[static_cast<std::size_t>(in_axes[k] + batch_dims)];
      if (steps >= 0 && len != steps)
        return Error(Errc::runtime,
                     fmt::format("Scan: scan inputs have {} and {} steps", steps, len),
                     where_of(n));
      steps = len;
    }
  }
  std::vector<HostTensor> results(ns + ks);
  auto finish_outputs = [&](std::vector<std::vector<HostTensor>>& ys,
                            std::vector<HostTensor>& st) -> Status {
    for (std::size_t j = 0; j < ns; ++j) results[j] = std::move(st[j]);
    for (std::size_t k = 0; k < ks; ++k) {
      if (out_dirs[k]) std::reverse(ys[k].begin(), ys[k].end());
      if (ys[k].empty()) {
        results[ns + k] = empty_scan_output(b.output_io[ns + k]);
        continue;
      }
      std::vector<const HostTensor*> items;
      for (const HostTensor& h : ys[k]) items.push_back(&h);
      const std::size_t rank = ys[k][0].dims.size() + 1;
      HP_ASSIGN_OR_RETURN(auto ax, norm_axis(ys_axes[k], rank, n));
      HP_ASSIGN_OR_RETURN(results[ns + k], join_axis(items, ax, true, where_of(n)));
    }
    return {};
  };
  if (!v8) {
    std::vector<std::vector<HostTensor>> ys(ks);
    HP_TRY(scan_steps(*this, b, states, xs, in_axes, in_dirs, steps, ys));
    HP_TRY(finish_outputs(ys, states));
  } else {
    // Scan-8: the batch is a loop around the scan; sequence_lens shortens a batch entry's scan,
    // whose scan outputs are then padded with zeros to the full length.
    const std::int64_t batch = xs[0].dims.empty() ? 0 : xs[0].dims[0];
    std::vector<std::int64_t> lens(static_cast<std::size_t>(batch), steps);
    if (n.inputs[0] >= 0) {
      HP_ASSIGN_OR_RETURN(auto l, to_host(n.inputs[0]));
      for (std::int64_t i = 0; i < batch && i < l.numel(); ++i)
        lens[static_cast<std::size_t>(i)] =
            l.dtype == HP_I32 ? l.as<std::int32_t>()[i] : l.as<std::int64_t>()[i];
    }
    std::vector<std::vector<HostTensor>> per_state(ns), per_out(ks);
    for (std::int64_t bi = 0; bi < batch; ++bi) {
      std::vector<HostTensor> st, xb;
      for (const HostTensor& s : states) st.push_back(slice_axis(s, 0, bi));
      for (const HostTensor& x : xs) xb.push_back(slice_axis(x, 0, bi));
      const std::int64_t len = lens[static_cast<std::size_t>(bi)];
      if (len < 0 || len > steps)
        return Error(Errc::runtime,
                     fmt::format("Scan: sequence length {} of batch entry {} is "
                                 "outside [0, {}]",
                                 len, bi, steps),
                     where_of(n));
      std::vector<std::vector<HostTensor>> ys(ks);
      HP_TRY(scan_steps(*this, b, st, xb, in_axes, in_dirs, len, ys));
      for (std::size_t k = 0; k < ks; ++k) {
        if (ys[k].empty() && steps > 0)
          return Error(Errc::not_implemented, "Scan: an empty sequence in a Scan-8 batch",
                       where_of(n));
        while (static_cast<std::int64_t>(ys[k].size()) < steps) {
          HostTensor z = ys[k][0];
          std::fill(z.data.begin(), z.data.end(), 0);
          ys[k].push_back(std::move(z));
        }
        std::vector<const HostTensor*> items;
        for (const HostTensor& h : ys[k]) items.push_back(&h);
        HP_ASSIGN_OR_RETURN(auto j, join_axis(items, 0, true, where_of(n)));
        per_out[k].push_back(std::move(j));
      }
      for (std::size_t j = 0; j < ns; ++j) per_state[j].push_back(std::move(st[j]));
    }
    for (std::size_t j = 0; j < ns; ++j) per_state[j].resize(static_cast<std::size_t>(batch));
    for (std::size_t idx = 0; idx < ns + ks; ++idx) {
      auto& list = idx < ns ? per_state[idx] : per_out[idx - ns];
      std::vector<const HostTensor*> items;
      for (const HostTensor& h : list) items.push_back(&h);
      if (items.empty()) return Error(Errc::not_implemented, "Scan: an empty batch", where_of(n));
      HP_ASSIGN_OR_RETURN(results[idx], join_axis(items, 0, true, where_of(n)));
    }
  }
  for (std::size_t k = 0; k < results.size(); ++k)
    if (n.outputs[k] >= 0) HP_TRY(load_tensor(n.outputs[k], results[k]));
  return {};
}

}  // namespace hp::exec
