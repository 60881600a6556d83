#include "hp/core/error.h"

#include "hp/core/exit_code.h"

namespace hp {

std::vector<Diagnostic> Error::all() const {
  std::vector<Diagnostic> out;
  out.reserve(1 + more.size());
  out.push_back(what);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

std::string Error::str() const {
  return what.where.empty() ? what.message : what.where + ": " + what.message;
}

Error collect_errors(Errc code, std::vector<Diagnostic> diags) {
  Error e;
  e.code = code;
  if (diags.empty()) return e;
  e.what = std::move(diags.front());
  e.more.assign(std::make_move_iterator(diags.begin() + 1), std::make_move_iterator(diags.end()));
  return e;
}

const char* errc_name(Errc c) {
  switch (c) {
    case Errc::usage: return "usage";
    case Errc::bad_input: return "bad input";
    case Errc::infeasible: return "infeasible";
    case Errc::runtime: return "runtime failure";
    case Errc::mismatch: return "verification mismatch";
    case Errc::unavailable: return "unavailable";
    case Errc::not_implemented: return "not implemented";
    case Errc::internal: return "internal error";
  }
  return "internal error";
}

ExitCode exit_code_for(Errc c) {
  switch (c) {
    case Errc::usage: return ExitCode::usage;
    case Errc::bad_input: return ExitCode::bad_input;
    case Errc::infeasible: return ExitCode::infeasible;
    case Errc::runtime: return ExitCode::runtime;
    case Errc::mismatch: return ExitCode::mismatch;
    case Errc::unavailable: return ExitCode::unavailable;
    case Errc::not_implemented: return ExitCode::not_implemented;
    case Errc::internal: return ExitCode::internal;
  }
  return ExitCode::internal;
}

}  // namespace hp
