#include "hp/offload/offload.h"

namespace hp::offload {

Expected<OffloadReport> run(const OffloadOptions& options) {
  return Error(Errc::not_implemented, "'hp offload-profile' is not implemented yet", "",
               "memory timelines and offload schedules arrive with HyperOffload (issue #7)");
}

}  // namespace hp::offload
