// Human-readable formatting and parsing of bytes, FLOPs, times and counts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hp {

std::string format_bytes(double bytes);       ///< 1536 -> "1.50 KiB"
std::string format_flops(double flops);       ///< 3.1e12 -> "3.10 TFLOP"
std::string format_rate(double per_second, std::string_view unit);  ///< 3e9,"B" -> "3.00 GB/s"
std::string format_count(double n);           ///< 1.2e9 -> "1.20 G"
std::string format_seconds(double s);         ///< 0.0021 -> "2.10 ms"

/// Parses "64GiB", "80 GB", "1.5e9", "512MiB" into bytes; nullopt when malformed.
std::optional<double> parse_bytes(std::string_view text);

}  // namespace hp
