// Lowering sequence idioms to plain tensor ops, for shape inference only.
//
// PyTorch exports `torch.repeat_interleave(k, n, dim=1)` over a dim it cannot see statically (the
// k/v heads of a GQA attention after a view with dynamic batch and seq) as a Loop over sequences:
// SplitToSequence cuts k into its heads, the Loop body expands and reshapes each (SequenceAt, ...,
// SequenceInsert into a loop-carried sequence) and ConcatFromSequence joins the result. ONNX's
// inference (1.12) keeps one merged element type per sequence and infers only the rank of the
// concatenation, so every dim downstream becomes an invented unk__N. Yet once the inputs are bound
// all of it is static: the trip count is a dim, the splits are ones. So, on the weightless copy
// that shape.cpp infers on (never on the model itself), a sequence whose length is known becomes a
// list of tensor names and the ops on it become tensor ops ONNX infers exactly: SplitToSequence ->
// Split, SequenceAt -> Identity of the element, SequenceInsert/SequenceEmpty/SequenceConstruct ->
// list edits, ConcatFromSequence -> Concat, SequenceLength -> a constant, and a Loop with a known
// trip count and a constant-true condition -> its body unrolled once per iteration (outputs renamed
// per iteration, the iteration number a constant, scan outputs stacked with Unsqueeze + Concat).
//
// The lowering is all or nothing: when any op that reads a sequence cannot be lowered yet (a trip
// count whose value is still unknown, a position computed in the body), the graph is left as it
// was, and the next inference round, knowing more values, tries again.
#include <fmt/core.h>

#include <map>

#include "shape_infer.h"

namespace hp::model {
namespace {

constexpr std::int64_t kMaxTrips = 256;
using List = std::vector<std::string>;

struct Lowering {
  const ValueMap& values;
  int opset;
  int& serial;
  std::vector<onnx::NodeProto> out;          ///< the new node list
  std::vector<onnx::TensorProto> consts;     ///< initializers the lowering adds
  std::map<std::string, List> seqs;          ///< sequence name -> its elements' tensor names
  std::map<std::string, std::int64_t> ints;  ///< iteration numbers known during unrolling

  std::string fresh(const std::string& base) { return fmt::format("{}__hp{}", base, serial++); }

  std::string const_ints(const std::vector<std::int64_t>& v, bool scalar) {
    onnx::TensorProto t;
    t.set_name(fresh("hp_seq_const"));
    t.set_data_type(onnx::TensorProto::INT64);
    if (!scalar) t.add_dims(static_cast<std::int64_t>(v.size()));
    for (auto x : v) t.add_int64_data(x);
    consts.push_back(t);
    return t.name();
  }

  onnx::NodeProto& emit(const std::string& op, const List& ins, const List& outs) {
    onnx::NodeProto& n = out.emplace_back();
    n.set_op_type(op);
    for (const auto& i : ins) n.add_input(i);
    for (const auto& o : outs) n.add_output(o);
    return n;
  }

  // Unsqueeze/Squeeze/Split take their axes or sizes as an input from opset 13, before as an
  // attribute.
  void emit_axes(const std::string& op, const std::string& x, const std::string& name,
                 const std::vector<std::int64_t>& v, const List& outs) {
    if (opset >= 13) {
      emit(op, {x, const_ints(v, false)}, outs);
      return;
    }
    auto& n = emit(op, {x}, outs);
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto d : v) a->add_ints(d);
  }

  std::optional<std::int64_t> scalar(const std::string& name) const {
    if (auto it = ints.find(name); it != ints.end()) return it->second;
    auto it = values.find(name);
    if (it == values.end() || it->second.data.size() != 1) return std::nullopt;
    return saturate_i64(it->second.data[0]);
  }

  bool reads_sequence(const onnx::NodeProto& n) const {
    for (const auto& i : n.input())
      if (seqs.count(i)) return true;
    return false;
  }

  // Lowers `n` (a node of the graph or of an unrolled body, inputs already renamed); false when it
  // reads a sequence but cannot be lowered.
  bool lower(const onnx::NodeProto& n, const ShapeMap& shapes) {
    const std::string& op = n.op_type();
    if (op == "SequenceEmpty") return seqs[n.output(0)] = {}, true;
    if (op == "SequenceConstruct")
      return seqs[n.output(0)] = {n.input().begin(), n.input().end()}, true;
    if (op == "SplitToSequence") return lower_split(n, shapes);
    if (op == "Loop") return lower_loop(n, shapes);
    if (!reads_sequence(n)) {
      out.push_back(n);
      return true;
    }
    // A sequence read through another input than the first (a mutated or hand-made graph) is not
    // a form exporters write: left unlowered, not a map::at escaping as an exception.
    auto first = n.input_size() > 0 ? seqs.find(n.input(0)) : seqs.end();
    if (first == seqs.end()) return false;
    const List& s = first->second;
    auto position = [&](int i, std::int64_t dflt) -> std::optional<std::int64_t> {
      if (i >= n.input_size() || n.input(i).empty()) return dflt;
      auto p = scalar(n.input(i));
      if (!p) return std::nullopt;
      return *p < 0 ? *p + static_cast<std::int64_t>(s.size()) : *p;
    };
    if (op == "SequenceAt") {
      auto p = position(1, 0);
      if (!p || *p < 0 || *p >= static_cast<std::int64_t>(s.size())) return false;
      emit("Identity", {s[static_cast<std::size_t>(*p)]}, {n.output(0)});
      return true;
    }
    if (op == "SequenceInsert") {
      auto p = position(2, static_cast<std::int64_t>(s.size()));
      if (!p || *p < 0 || *p > static_cast<std::int64_t>(s.size())) return false;
      List l = s;
      l.insert(l.begin() + *p, n.input(1));
      seqs[n.output(0)] = std::move(l);
      return true;
    }
    if (op == "SequenceLength") {
      emit("Identity", {const_ints({static_cast<std::int64_t>(s.size())}, true)}, {n.output(0)});
      return true;
    }
    if (op == "ConcatFromSequence" && !s.empty()) {
      std::int64_t axis = attr_int(n, "axis", 0);
      List parts = s;
      if (attr_int(n, "new_axis", 0) != 0) {
        for (auto& p : parts) {
          std::string u = fresh(n.output(0));
          emit_axes("Unsqueeze", p, "axes", {axis}, {u});
          p = u;
        }
      }
      auto& c = emit("Concat", parts, {n.output(0)});
      auto* a = c.add_attribute();
      a->set_name("axis");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(axis);
      return true;
    }
    return false;
  }

  // SplitToSequence with known split sizes (or, without them, a known dim: pieces of one).
  bool lower_split(const onnx::NodeProto& n, const ShapeMap& shapes) {
    std::int64_t axis = attr_int(n, "axis", 0);
    bool keep = attr_int(n, "keepdims", 1) != 0;
    auto it = shapes.find(n.input(0));
    std::optional<std::int64_t> dim;
    if (it != shapes.end() && it->second.has_shape) {
      auto r = static_cast<std::int64_t>(it->second.dims.size());
      std::int64_t a = axis < 0 ? axis + r : axis;
      if (a >= 0 && a < r && it->second.dims[static_cast<std::size_t>(a)].known())
        dim = it->second.dims[static_cast<std::size_t>(a)].value;
    }
    std::vector<std::int64_t> sizes;
    bool squeeze = false;
    if (n.input_size() > 1 && !n.input(1).empty()) {
      auto v = values.find(n.input(1));
      if (v == values.end()) return false;
      if (v->second.shape.empty()) {  // a scalar: chunks of that size, the last one shorter
        std::int64_t c = saturate_i64(v->second.data[0]);
        if (!dim || c <= 0 || *dim / c > kMaxTrips) return false;
        for (std::int64_t left = *dim; left > 0; left -= c) sizes.push_back(std::min(c, left));
      } else {
        for (double d : v->second.data) sizes.push_back(saturate_i64(d));
      }
    } else {
      if (!dim || *dim > kMaxTrips) return false;
      sizes.assign(static_cast<std::size_t>(*dim), 1);
      squeeze = !keep;
    }
    if (sizes.empty()) return seqs[n.output(0)] = {}, true;
    List parts;
    for (std::size_t i = 0; i < sizes.size(); ++i) parts.push_back(fresh(n.output(0)));
    auto& s = opset >= 13 ? emit("Split", {n.input(0), const_ints(sizes, false)}, parts)
                          : emit("Split", {n.input(0)}, parts);
    auto* a = s.add_attribute();
    a->set_name("axis");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(axis);
    if (opset < 13) {
      auto* sa = s.add_attribute();
      sa->set_name("split");
      sa->set_type(onnx::AttributeProto::INTS);
      for (auto d : sizes) sa->add_ints(d);
    }
    if (squeeze) {
      for (auto& p : parts) {
        std::string q = fresh(n.output(0));
        emit_axes("Squeeze", p, "axes", {axis}, {q});
        p = q;
      }
    }
    seqs[n.output(0)] = std::move(parts);
    return true;
  }

  // A Loop with a known trip count whose condition stays true: its body once per iteration.
  bool lower_loop(const onnx::NodeProto& n, const ShapeMap& shapes) {
    const onnx::GraphProto* body = nullptr;
    for (const auto& a : n.attribute())
      if (a.name() == "body" && a.has_g()) body = &a.g();
    if (!body || n.input_size() < 2 || n.input(0).empty()) return false;
    auto trips = scalar(n.input(0));
    if (!trips || *trips < 0 || *trips > kMaxTrips) return false;
    if (!n.input(1).empty()) {
      auto c = scalar(n.input(1));
      if (!c || *c == 0) return false;
    }
    const int carried = n.input_size() - 2;
    if (body->input_size() != carried + 2 || body->output_size() < carried + 1) return false;
    if (!condition_stays_true(*body)) return false;
    for (const auto& bn : body->node())
      for (const auto& a : bn.attribute())
        if (a.has_g() || a.graphs_size() > 0) return false;  // nested subgraphs: not unrolled
    List state(n.input().begin() + 2, n.input().end());
    std::vector<List> scans(static_cast<std::size_t>(body->output_size() - 1 - carried));
    for (std::int64_t it = 0; it < *trips; ++it) {
      std::map<std::string, std::string> rename;
      std::string iter = const_ints({it}, true);
      ints[iter] = it;
      rename[body->input(0).name()] = iter;
      rename[body->input(1).name()] = const_ints({1}, true);
      for (int k = 0; k < carried; ++k) rename[body->input(k + 2).name()] = state[k];
      for (const auto& bn : body->node()) {
        onnx::NodeProto c = bn;
        for (auto& i : *c.mutable_input())
          if (auto r = rename.find(i); r != rename.end()) i = r->second;
        for (auto& o : *c.mutable_output()) {
          if (o.empty()) continue;
          std::string fresh_name = fresh(o);
          rename[o] = fresh_name;
          o = fresh_name;
        }
        if (!lower(c, shapes)) return false;
      }
      auto renamed = [&](const std::string& s) {
        auto r = rename.find(s);
        return r == rename.end() ? s : r->second;
      };
      for (int k = 0; k < carried; ++k) state[k] = renamed(body->output(k + 1).name());
      for (std::size_t j = 0; j < scans.size(); ++j)
        scans[j].push_back(renamed(body->output(static_cast<int>(1 + carried + j)).name()));
    }
    for (int k = 0; k < carried && k < n.output_size(); ++k) {
      if (n.output(k).empty()) continue;
      if (auto s = seqs.find(state[k]); s != seqs.end())
        seqs[n.output(k)] = s->second;
      else
        emit("Identity", {state[k]}, {n.output(k)});
    }
    for (std::size_t j = 0; j < scans.size(); ++j) {
      int o = carried + static_cast<int>(j);
      if (o >= n.output_size() || n.output(o).empty()) continue;
      if (scans[j].empty()) return false;
      List parts;
      for (const auto& s : scans[j]) {
        parts.push_back(fresh(n.output(o)));
        emit_axes("Unsqueeze", s, "axes", {0}, {parts.back()});
      }
      auto& c = emit("Concat", parts, {n.output(o)});
      auto* a = c.add_attribute();
      a->set_name("axis");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(0);
    }
    return true;
  }

  // The body's condition output is its condition input, or a Cast/Identity of it or of a constant
  // true (what the exporter writes for a for-loop).
  bool condition_stays_true(const onnx::GraphProto& body) const {
    const std::string& cond = body.output(0).name();
    if (cond == body.input(1).name()) return true;
    for (const auto& bn : body.node()) {
      if (bn.output_size() == 0 || bn.output(0) != cond) continue;
      if ((bn.op_type() != "Cast" && bn.op_type() != "Identity") || bn.input_size() != 1)
        return false;
      if (bn.input(0) == body.input(1).name()) return true;
      auto v = scalar(bn.input(0));
      return v && *v != 0;
    }
    return false;
  }
};

}  // namespace

int lower_sequences(onnx::GraphProto& g, const ShapeMap& shapes, const ValueMap& values, int opset,
                    int& serial, std::set<std::string>& sequences) {
  bool any = false;
  for (const auto& n : g.node())
    any = any || n.op_type() == "SplitToSequence" || n.op_type() == "SequenceEmpty" ||
          n.op_type() == "SequenceConstruct" || (n.op_type() == "Loop" && n.output_size() > 0);
  if (!any) return 0;
  int saved = serial;
  Lowering l{values, opset, serial, {}, {}, {}, {}};
  int lowered = 0;
  for (const auto& n : g.node()) {
    bool seq_op = n.op_type() == "Loop" || n.op_type().rfind("Sequence", 0) == 0 ||
                  n.op_type() == "SplitToSequence" || n.op_type() == "ConcatFromSequence";
    // A Loop without sequences is left to ONNX's own Loop inference unless it must be unrolled
    // because it reads or builds a sequence.
    if (n.op_type() == "Loop" && !l.reads_sequence(n)) {
      bool builds = false;
      for (const auto& a : n.attribute())
        if (a.name() == "body")
          for (const auto& bn : a.g().node())
            builds = builds || bn.op_type().rfind("Sequence", 0) == 0;
      if (!builds) seq_op = false;
    }
    if (!seq_op && !l.reads_sequence(n)) {
      l.out.push_back(n);
      continue;
    }
    if (!l.lower(n, shapes)) {
      serial = saved;
      return 0;
    }
    ++lowered;
  }
  *g.mutable_node() = {l.out.begin(), l.out.end()};
  for (auto& t : l.consts) *g.add_initializer() = std::move(t);
  for (const auto& [name, list] : l.seqs) sequences.insert(name);
  return lowered;
}

}  // namespace hp::model
