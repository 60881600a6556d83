// Human-readable formatting and parsing of bytes, FLOPs, times and counts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hp {

std::string format_bytes(double bytes);                             ///< 1536 -> "1.50 KiB"
std::string format_flops(double flops);                             ///< 3.1e12 -> "3.10 TFLOP"
std::string format_rate(double per_second, std::string_view unit);  ///< 3e9,"B" -> "3.00 GB/s"
std::string format_count(double n);                                 ///< 1.2e9 -> "1.20 G"
std::string format_seconds(double s);                               ///< 0.0021 -> "2.10 ms"

/// An axis tick step: the least 1, 2 or 5 x 10^k at or above `raw` (the pictures' ticks).
double nice_step(double raw);
/// A time tick's label, "1.5 s", "20 ms", "250 us": the unit and as many decimals as `step` needs.
std::string format_tick_seconds(double t, double step);

/// Parses "64GiB", "80 GB", "1.5e9", "512MiB" into bytes; nullopt when malformed.
std::optional<double> parse_bytes(std::string_view text);

/// Parses a duration into seconds, the one rule for recipes (tier latency) and options
/// (--latency-budget): a non-negative decimal number (optional '+', fraction, exponent: "2", "1.5",
/// ".5", "3e-6") followed by an optional unit - ns, us (also µs, μs), ms or s - with optional
/// spaces around the number and between it and the unit. No unit means seconds. "0" is zero.
/// nullopt for negatives, inf/nan, hex, unknown units ("5 min", "5MS") and anything else.
std::optional<double> parse_seconds(std::string_view text);

}  // namespace hp
