// `hp devices --measure` (hp/offload/local_cluster.h) on the cpu plugin: the GEMM probe's figures,
// the cluster built from the probes (valid, round-tripping, shaped by --ranks and --threads), and
// the options it refuses.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>

#include "hp/offload/local_cluster.h"
#include "hp/recipe/cluster.h"

using namespace hp;
using namespace hp::offload;
namespace fs = std::filesystem;

TEST_CASE("--measure: the GEMM probe reports a rate per size and their median", "[offload]") {
  ComputeOptions o;
  o.sizes = {64, 32, 128};  // sorted by the probe
  o.repeats = 3;
  o.threads = 1;
  auto r = measure_gemm(o);
  REQUIRE(r.ok());
  REQUIRE(r->sizes.size() == 3);
  CHECK(r->sizes[0].n == 32);
  CHECK(r->sizes[2].n == 128);
  for (const GemmProbe& p : r->sizes) CHECK(p.flops > 0);
  CHECK(r->fp32 == r->sizes[1].flops);
  CHECK(r->threads == 1);
  CHECK(r->backend == "cpu");

  o.sizes = {};
  CHECK(measure_gemm(o).error().code == Errc::usage);
  o.sizes = {16384};
  CHECK(measure_gemm(o).error().code == Errc::usage);
  o.sizes = {64};
  o.backend = "no-such-backend";
  CHECK(measure_gemm(o).error().code == Errc::unavailable);
}

TEST_CASE("--measure: the local cluster is one node of the ranks asked for", "[offload]") {
  LocalClusterOptions o;
  o.ranks = 3;
  o.threads = 1;
  o.compute.sizes = {32, 64};
  o.compute.repeats = 2;
  o.copies.sizes = {1 << 20};
  o.copies.repeats = 2;
  const fs::path out =
      fs::temp_directory_path() / ("hp_local_cluster_" + std::to_string(::getpid()) + ".toml");
  o.out = out;
  auto r = measure_local_cluster(o);
  REQUIRE(r.ok());
  const recipe::Cluster& c = r->cluster;
  REQUIRE(c.device_types.size() == 1);
  const recipe::DeviceType& d = c.device_types[0];
  CHECK(c.ranks() == 3);
  CHECK(d.kind == recipe::DeviceKind::cpu);
  CHECK(d.sustained_flops.fp32 == r->compute.fp32);
  CHECK(d.peak_flops.fp32 > 0);
  CHECK(d.memory_bandwidth == r->bandwidth.memcpy);
  REQUIRE(c.tiers.size() == 2);
  CHECK(c.tiers[0].size == 3);
  CHECK(c.tiers[0].bandwidth == Approx(r->bandwidth.memcpy / 2));
  CHECK(r->written == out.string());
  // The file reads back to the same cluster, and hp plan's loader takes it.
  auto back = recipe::load_cluster(out);
  REQUIRE(back.ok());
  CHECK(*back == c);
  fs::remove(out);

  // A CPU's three ranks were probed at once; the cluster holds the slowest one's figures.
  CHECK(r->at_once == 3);
  CHECK(c.description.find("3 ranks at once") != std::string::npos);
  const std::string text = render_local_cluster(*r, false);
  CHECK(text.find("3 ranks at once with 1 thread(s) each") != std::string::npos);
  CHECK(text.find("wrote cluster 'local-measured'") != std::string::npos);

  o.out.clear();
  o.alone = true;  // one rank by itself
  auto alone = measure_local_cluster(o);
  REQUIRE(alone.ok());
  CHECK(alone->at_once == 1);
  CHECK(render_local_cluster(*alone, false).find("one rank of 3 with 1 thread(s)") !=
        std::string::npos);
  o.alone = false;
  // A probe failing in every rank's thread is the error, and no thread is left waiting for the
  // others at the sizes' barrier.
  o.compute.sizes = {0};
  CHECK(measure_local_cluster(o).error().code == Errc::usage);
  o.compute.sizes = {32, 64};
  o.out = out;

  o.ranks = 0;
  CHECK(measure_local_cluster(o).error().code == Errc::usage);
  o.ranks = 1;
  o.out = fs::temp_directory_path() / "hp-no-such-dir" / "c.toml";
  CHECK(measure_local_cluster(o).error().code == Errc::bad_input);
}
