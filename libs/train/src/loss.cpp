// Loss names (autodiff.h); the loss nodes themselves are written by autodiff.cpp.
#include <fmt/core.h>

#include "hp/train/autodiff.h"

namespace hp::train {

Expected<LossKind> parse_loss(const std::string& name) {
  if (name == "cross_entropy") return LossKind::cross_entropy;
  if (name == "mse") return LossKind::mse;
  return Error(Errc::bad_input, fmt::format("unknown loss '{}' (cross_entropy or mse)", name));
}

const char* loss_name(LossKind k) { return k == LossKind::mse ? "mse" : "cross_entropy"; }

}  // namespace hp::train
