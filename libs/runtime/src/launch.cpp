#include "hp/runtime/launch.h"

namespace hp::runtime {

Expected<LaunchReport> launch(const LaunchOptions& options) {
  return Error(Errc::not_implemented, "'hp launch' is not implemented yet", "",
               "the executor and MPMD launcher arrive with issues #3 and #6");
}

}  // namespace hp::runtime
