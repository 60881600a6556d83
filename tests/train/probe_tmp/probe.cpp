// Throwaway: hp::train::train on a model with a fixed batch; args: model inputs metrics save loss logits opt lr wd clip steps [frozen...] ; env MOM, B1, B2, RECOMP=blocks
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include "hp/train/trainer.h"
int main(int argc, char** argv) {
  hp::train::TrainOptions o;
  o.model = argv[1]; o.inputs_dir = argv[2]; o.metrics = argv[3]; o.save_model = argv[4];
  auto lk = hp::train::parse_loss(argv[5]); if (!lk) { std::cerr << "bad loss\n"; return 3; }
  o.grad.loss = *lk; o.grad.logits = argv[6];
  auto ok = hp::train::parse_optimizer_kind(argv[7]); o.optimizer.kind = *ok;
  o.optimizer.lr = atof(argv[8]); o.optimizer.weight_decay = atof(argv[9]); o.optimizer.clip_norm = atof(argv[10]);
  o.steps = atoi(argv[11]);
  for (int i = 12; i < argc; ++i) o.grad.frozen.push_back(argv[i]);
  if (getenv("MOM")) o.optimizer.momentum = atof(getenv("MOM"));
  if (getenv("B2")) o.optimizer.beta2 = atof(getenv("B2"));
  if (getenv("RECOMP")) for (int b = 0; b < atoi(getenv("RECOMP")); ++b) o.grad.recompute_blocks.push_back(b);
  o.threads = 1;
  o.plugin_paths = {"/work/wt-torchref/build/plugins/libhp-backend-cpu.so"};
  o.sink = [](bool err, const std::string& l) { (err ? std::cerr : std::cout) << l << "\n"; };
  auto r = hp::train::train(o);
  if (!r) { for (auto& d : r.error().all()) std::cerr << "hp: error: " << d.where << ": " << d.message << "\n"; return 3; }
  std::cout << r->summary;
  return 0;
}
