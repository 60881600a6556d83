// Placeholder, replaced by the library-backed implementation.
#include "commands.h"

namespace hp::cli {

void add_verify_command(CLI::App& app, Context& ctx) {
  CLI::App* sub = app.add_subcommand("verify", "verify");
  sub->allow_extras();
  sub->callback([&ctx] { ctx.exit_code = report_error(Error(Errc::not_implemented, "'hp verify' is not implemented yet")); });
}

}  // namespace hp::cli
