// hp: entry point. Owns the subcommand table, CLI parsing, the single top-level error printer and
// the mapping to documented exit codes (hp/core/exit_code.h). Subcommands live in cmd_<name>.cpp.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "commands.h"
#include "hp/core/interrupt.h"
#include "hp/core/version.h"
#include "hp/recipe/names.h"

namespace hp::cli {
namespace {

struct CommandRow {
  const char* name;
  void (*add)(CLI::App&, Context&);
};

// The one list of subcommands: `hp --help`, the man page test and "did you mean" all read it.
constexpr CommandRow kCommands[] = {
    {"plan", add_plan_command},
    {"shard", add_shard_command},
    {"offload-profile", add_offload_profile_command},
    {"launch", add_launch_command},
    {"verify", add_verify_command},
    {"devices", add_devices_command},
    {"model-skeleton", add_model_skeleton_command},
    {"completion", add_completion_command},  // last: it reads the commands above
};

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// An unknown first word gets "did you mean" (ninja's SpellcheckString idea).
bool check_command_name(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return true;
  std::string_view word = argv[1];
  const char* best = nullptr;
  std::size_t best_d = 3;
  for (const auto& row : kCommands) {
    if (word == row.name) return true;
    std::size_t d = edit_distance(word, row.name);
    if (d < best_d) best_d = d, best = row.name;
  }
  Error e(
      Errc::usage, fmt::format("unknown command '{}'", word), "",
      best ? fmt::format("did you mean '{}'?", best) : "run 'hp --help' for the list of commands");
  report_error(e);
  return false;
}

// argv as a shell would re-read it: arguments with spaces or shell syntax in single quotes.
std::string command_line(int argc, char** argv) {
  std::string out = "hp";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOP"
                                         "QRSTUVWXYZ0123456789-_=.,/:+@%") == std::string::npos;
    std::string quoted;
    for (char c : a) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += " " + (plain ? a : "'" + quoted + "'");
  }
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"hp: plan, shard, profile, launch and verify parallel executions of large models"};
  app.name("hp");
  app.set_version_flag("--version", std::string("hp ") + version_string());
  app.require_subcommand(1);
  Context ctx;
  ctx.command_line = command_line(argc, argv);
  app.add_flag("-v,--verbose", ctx.verbose, "log what hp looks at (plugin paths tried, ...)");
  // Global, before or after the command word (subcommands inherit fallthrough): a recipe may set
  // loader and plugin variables in a group's env only when the user names them here.
  app.fallthrough();
  app.add_option("--allow-recipe-env", ctx.allowed_recipe_env,
                 "let recipes set this loader/plugin variable (LD_PRELOAD, HP_PLUGIN_PATH, ...) in "
                 "a group's env; repeatable, '*' for all")
      ->each([](const std::string& name) {
        auto names = recipe::allowed_recipe_env();
        names.push_back(name);
        recipe::set_allowed_recipe_env(std::move(names));
      })
      ->type_name("NAME");
  for (const auto& row : kCommands) row.add(app, ctx);
  app.footer(
      "Exit status: 0 ok, 1 internal error, 2 usage, 3 bad input, 4 infeasible, 5 runtime "
      "failure,\n"
      "6 verification mismatch, 7 backend unavailable, 8 not implemented yet. See hp(1).");
  if (!check_command_name(argc, argv)) return static_cast<int>(ExitCode::usage);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return report_error(
        Error(Errc::usage, e.what(), "", "run 'hp --help' or 'hp <command> --help'"));
  }
  return ctx.exit_code;
}

}  // namespace
}  // namespace hp::cli

int main(int argc, char** argv) {
  // SIGINT/SIGTERM/SIGHUP remove hp's temporaries and exit 5 with a message (hp/core/interrupt.h).
  hp::install_interrupt_handlers();
  try {
    return hp::cli::run(argc, argv);
  } catch (const std::exception& e) {
    // Last resort: libraries return errors as values, so reaching here is a bug in hp.
    return hp::cli::report_error(hp::Error(hp::Errc::internal, e.what(), "", "please report this"));
  }
}
