// The documented exit codes of `hp` (man hp(1), README). Scripts rely on them: never renumber.
#pragma once

#include "hp/core/error.h"

namespace hp {

enum class ExitCode : int {
  ok = 0,
  internal = 1,         ///< a bug in hp (uncaught exception, broken invariant)
  usage = 2,            ///< bad command line
  bad_input = 3,        ///< malformed or inconsistent input file / option value
  infeasible = 4,       ///< no plan satisfies the constraints
  runtime = 5,          ///< failure while running (I/O, MPI, kernel, a rank died)
  mismatch = 6,         ///< verification mismatch
  unavailable = 7,      ///< requested backend / vendor runtime unavailable
  not_implemented = 8,  ///< subcommand or option not implemented yet
};

ExitCode exit_code_for(Errc c);

}  // namespace hp
