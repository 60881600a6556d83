// Errors as values. Libraries never print or exit: they return an hp::Error, and only apps/ turns
// it into "hp: error: <where>: <message>" and an exit code. An Error can carry several diagnostics
// so a validating pass can report every problem of an input in one run (collect, then stop).
#pragma once

#include <string>
#include <vector>

namespace hp {

/// What went wrong, in the terms the exit code is chosen by (see exit_code.h).
enum class Errc {
  usage,            ///< the command line itself is wrong
  bad_input,        ///< a file or option value is malformed or inconsistent
  infeasible,       ///< the input is fine but no plan satisfies the constraints
  runtime,          ///< something failed while running (I/O, MPI, a kernel)
  mismatch,         ///< verification found outputs out of tolerance
  unavailable,      ///< a backend or vendor runtime is not usable on this machine
  not_implemented,  ///< the feature exists in the CLI but not yet in hp
  internal,         ///< a bug in hp
};

/// One located message: `where` is "file:line:col", a tensor or node name, or empty.
struct Diagnostic {
  std::string where;
  std::string message;
  std::string hint;
};

struct Error {
  Errc code = Errc::internal;
  Diagnostic what;               ///< the primary problem
  std::vector<Diagnostic> more;  ///< further problems found by the same pass

  Error() = default;
  Error(Errc c, std::string message, std::string where = {}, std::string hint = {})
      : code(c), what{std::move(where), std::move(message), std::move(hint)} {}

  const std::string& message() const { return what.message; }
  const std::string& where() const { return what.where; }
  /// All diagnostics, primary first.
  std::vector<Diagnostic> all() const;
  /// "where: message" of the primary diagnostic, for logs and test assertions.
  std::string str() const;
};

/// Builds one Error from several diagnostics (the first becomes primary). Empty list: no error.
Error collect_errors(Errc code, std::vector<Diagnostic> diags);

const char* errc_name(Errc c);

}  // namespace hp
