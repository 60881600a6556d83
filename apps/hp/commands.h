// The hp subcommands. Each cmd_<name>.cpp exposes add_<name>_command(), which creates the CLI11
// subcommand, binds its flags into the library's options struct and sets a callback that calls one
// library entry point and renders the result. The callback stores its exit code in the Context.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "hp/core/error.h"
#include "hp/core/exit_code.h"

namespace hp::cli {

struct Context {
  int exit_code = 0;
  bool verbose = false;
  std::vector<std::string> allowed_recipe_env;  ///< --allow-recipe-env (hp/recipe/names.h)
  std::string command_line;  ///< "hp plan ..." as typed (shell-quoted), recorded in what hp writes
};

/// Prints every diagnostic of `e` as "hp: error: <where>: <message>" (+ "  hint: ...") on stderr
/// and returns the documented exit code for it.
int report_error(const Error& e);
/// "hp: warning: ..." on stderr.
void report_warning(const std::string& where, const std::string& message);

/// The check every --timeout flag carries: a finite number of seconds in [0, one year] (0: no
/// limit). CLI11's own number parsing takes "inf", "nan" and negatives, which would reach mpirun
/// as a negative --timeout; these are refused on the command line instead.
CLI::Validator timeout_seconds();

void add_plan_command(CLI::App& app, Context& ctx);
void add_shard_command(CLI::App& app, Context& ctx);
void add_offload_profile_command(CLI::App& app, Context& ctx);
void add_launch_command(CLI::App& app, Context& ctx);
void add_verify_command(CLI::App& app, Context& ctx);
void add_devices_command(CLI::App& app, Context& ctx);
void add_model_skeleton_command(CLI::App& app, Context& ctx);
/// Reads `app`'s subcommands and options when it runs, so it must be added last.
void add_completion_command(CLI::App& app, Context& ctx);

}  // namespace hp::cli
