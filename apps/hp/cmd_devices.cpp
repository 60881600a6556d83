// Placeholder, replaced by the library-backed implementation.
#include "commands.h"

namespace hp::cli {

void add_devices_command(CLI::App& app, Context& ctx) {
  CLI::App* sub = app.add_subcommand("devices", "devices");
  sub->allow_extras();
  sub->callback([&ctx] { ctx.exit_code = report_error(Error(Errc::not_implemented, "'hp devices' is not implemented yet")); });
}

}  // namespace hp::cli
