// Private: the writing half of the TOML formats. hp writes recipes and clusters itself rather than
// through TOML++'s formatter, because TOML++ tables are sorted maps: a written recipe would list
// [layouts] before [recipe]. Our writer keeps the documented section and key order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hp::recipe::detail {

/// A TOML basic string, quoted and escaped.
std::string quote(std::string_view s);
/// A TOML float that reads back to the same double (shortest round-trip form, always a float).
std::string number(double v);
/// [1, 2, 3]
std::string int_array(const std::vector<std::int64_t>& v);
/// ["a", "b"]
std::string string_array(const std::vector<std::string>& v);

}  // namespace hp::recipe::detail
