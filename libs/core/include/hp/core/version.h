#pragma once

namespace hp {
/// Version string of this hp build (the CMake project version).
const char* version_string();
}  // namespace hp
