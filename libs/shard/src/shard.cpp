#include "hp/shard/shard.h"

namespace hp::shard {

Expected<ShardReport> run(const ShardOptions& options) {
  return Error(Errc::not_implemented, "'hp shard' is not implemented yet", "",
               "layouts and per-rank partitions arrive with the HyperShard work (issue #5)");
}

}  // namespace hp::shard
