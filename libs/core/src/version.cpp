#include "hp/core/version.h"

namespace hp {
const char* version_string() { return HP_VERSION_STRING; }
}  // namespace hp
