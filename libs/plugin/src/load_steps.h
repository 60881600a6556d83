// The per-file loading steps behind load_plugin() (private to libs/plugin).
#pragma once

#include <string>
#include <vector>

#include "hp/plugin/registry.h"

namespace hp::plugin::detail {

/// Runs dlopen → entry → major → table → probe → open → devices on rec.path, filling rec.
void run_load_steps(PluginRecord& rec, const std::vector<std::string>& open_options);

}  // namespace hp::plugin::detail
