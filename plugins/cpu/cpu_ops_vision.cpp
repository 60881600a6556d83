// Detection and sampling ops on the cpu backend (f32): NonMaxSuppression, RoiAlign and
// GridSample, the post-processing and spatial-transformer ops of vision exports.
//
// NonMaxSuppression is the greedy algorithm: per batch and class, the boxes scoring above
// score_threshold in descending score order (ties keep box order), each kept unless its IoU with
// an already kept box exceeds iou_threshold, up to max_output_boxes_per_class. Corner boxes may
// come with their corners in either order.
//
// RoiAlign (Mask R-CNN) averages, or takes the largest of, sampling_ratio^2 bilinear samples per
// output bin of each region (ceil(region size / bins) per dim when sampling_ratio is 0), as ONNX
// Runtime and Detectron do; "half_pixel" shifts the region by half a pixel, "output_half_pixel"
// (the only behaviour before opset 16) instead grows it to at least 1x1.
//
// GridSample follows PyTorch's grid_sample, which the ONNX op was defined after and whose outputs
// the ONNX tests store: a grid coordinate in [-1, 1] maps to a pixel position (the corner pixels'
// centres with align_corners, else their outer edges), "border" clamps that position into the
// image, "reflection" mirrors it at the edges (then clamps); bilinear and nearest read taps outside
// the image as 0, bicubic (Keys' kernel, A = -0.75) applies the padding to each of its 16 taps.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_ops.h"

namespace hp_cpu {
namespace {

struct Box {
  float y1, x1, y2, x2;
};

Box box_at(const float* p, bool center) {
  if (center) return {p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
  return {std::min(p[0], p[2]), std::min(p[1], p[3]), std::max(p[0], p[2]), std::max(p[1], p[3])};
}

float iou(const Box& a, const Box& b) {
  const float ih = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
  const float iw = std::min(a.x2, b.x2) - std::max(a.x1, b.x1);
  if (ih <= 0 || iw <= 0) return 0;
  const float inter = ih * iw;
  const float uni = (a.y2 - a.y1) * (a.x2 - a.x1) + (b.y2 - b.y1) * (b.x2 - b.x1) - inter;
  return uni > 0 ? inter / uni : 0;
}

void nms(OpCall& c) {
  const View &boxes = c.need(0), &scores = c.need(1);
  if (boxes.dims.size() != 3 || boxes.dims[2] != 4) c.fail("boxes must be [batch, boxes, 4]");
  if (scores.dims.size() != 3 || scores.dims[0] != boxes.dims[0] || scores.dims[2] != boxes.dims[1])
    c.fail("scores must be [batch, classes, boxes]");
  const int64_t max_out = c.in(2).present() && c.in(2).numel() > 0 ? c.in(2).ints()[0] : 0;
  const float iou_th = c.in(3).present() && c.in(3).numel() > 0 ? c.in(3).as<float>()[0] : 0.f;
  const bool has_score_th = c.in(4).present() && c.in(4).numel() > 0;
  const float score_th = has_score_th ? c.in(4).as<float>()[0] : 0.f;
  const bool center = c.i("center_point_box", 0) != 0;
  const int64_t B = boxes.dims[0], N = boxes.dims[1], C = scores.dims[1];
  std::vector<int64_t> sel;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < C; ++k) {
      const float* s = scores.as<float>() + (b * C + k) * N;
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < N; ++i)
        if (!has_score_th || s[i] > score_th) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t p, int64_t q) { return s[p] > s[q]; });
      std::vector<Box> kept;
      for (int64_t i : cand) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        const Box bx = box_at(boxes.as<float>() + (b * N + i) * 4, center);
        bool keep = true;
        for (const Box& o : kept)
          if (iou(bx, o) > iou_th) {
            keep = false;
            break;
          }
        if (!keep) continue;
        kept.push_back(bx);
        sel.insert(sel.end(), {b, k, i});
      }
    }
  View y = c.out(0, HP_I64, {static_cast<int64_t>(sel.size() / 3), 3});
  std::copy(sel.begin(), sel.end(), y.as<int64_t>());
}

/// The bilinear value of img (H x W) at (y, x), 0 outside [-1, H] x [-1, W]; `max_mode` takes the
/// largest weighted corner instead of the sum.
double roi_sample(const float* img, int64_t H, int64_t W, double y, double x, bool max_mode) {
  if (y < -1.0 || y > double(H) || x < -1.0 || x > double(W)) return 0;
  y = std::max(y, 0.0);
  x = std::max(x, 0.0);
  int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x), y1 = y0 + 1, x1 = x0 + 1;
  if (y0 >= H - 1) y0 = y1 = H - 1, y = double(y0);
  if (x0 >= W - 1) x0 = x1 = W - 1, x = double(x0);
  const double ly = y - double(y0), lx = x - double(x0), hy = 1 - ly, hx = 1 - lx;
  const double a = hy * hx * img[y0 * W + x0], b = hy * lx * img[y0 * W + x1],
               c = ly * hx * img[y1 * W + x0], d = ly * lx * img[y1 * W + x1];
  return max_mode ? std::max(std::max(a, b), std::max(c, d)) : a + b + c + d;
}

void roi_align(OpCall& c) {
  const View &x = c.need(0), &rois = c.need(1), &bidx = c.need(2);
  if (x.dims.size() != 4) c.fail("X must be [N, C, H, W]");
  if (rois.dims.size() != 2 || rois.dims[1] != 4) c.fail("rois must be [num_rois, 4]");
  const std::vector<int64_t> batch = bidx.ints();
  const int64_t R = rois.dims[0], N = x.dims[0], C = x.dims[1], H = x.dims[2], W = x.dims[3];
  if (static_cast<int64_t>(batch.size()) != R) c.fail("batch_indices must have one per roi");
  const int64_t oh = c.i("output_height", 1), ow = c.i("output_width", 1),
                ratio = c.i("sampling_ratio", 0);
  const double scale = c.f("spatial_scale", 1.0);
  const std::string mode = c.s("mode", "avg");
  const bool half = c.s("coordinate_transformation_mode",
                        c.opset() >= 16 ? "half_pixel" : "output_half_pixel") == "half_pixel";
  const bool max_mode = mode == "max";
  View y = c.out(0, HP_F32, {R, C, oh, ow});
  for (int64_t r = 0; r < R; ++r) {
    if (batch[r] < 0 || batch[r] >= N) c.fail("batch index out of range");
    const float* box = rois.as<float>() + r * 4;
    const double off = half ? 0.5 : 0.0;
    const double sx = box[0] * scale - off, sy = box[1] * scale - off;
    double rw = box[2] * scale - off - sx, rh = box[3] * scale - off - sy;
    if (!half) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
    const double bh = rh / double(oh), bw = rw / double(ow);
    const int64_t gh = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rh / double(oh)));
    const int64_t gw = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rw / double(ow)));
    const double count = double(std::max<int64_t>(gh * gw, 1));
    for (int64_t ch = 0; ch < C; ++ch) {
      const float* img = x.as<float>() + (batch[r] * C + ch) * H * W;
      for (int64_t ph = 0; ph < oh; ++ph)
        for (int64_t pw = 0; pw < ow; ++pw) {
          double acc = 0;
          bool first = true;
          for (int64_t iy = 0; iy < gh; ++iy)
            for (int64_t ix = 0; ix < gw; ++ix) {
              const double yy = sy + double(ph) * bh + (double(iy) + 0.5) * bh / double(gh);
              const double xx = sx + double(pw) * bw + (double(ix) + 0.5) * bw / double(gw);
              const double v = roi_sample(img, H, W, yy, xx, max_mode);
              acc = max_mode ? (first ? v : std::max(acc, v)) : acc + v;
              first = false;
            }
          y.as<float>()[((r * C + ch) * oh + ph) * ow + pw] =
              static_cast<float>(max_mode ? acc : acc / count);
        }
    }
  }
}

struct Sampler {
  int64_t W, H;
  bool align;
  std::string pad;

  double unnormalize(double g, int64_t size) const {
    return align ? (g + 1) / 2 * double(size - 1) : ((g + 1) * double(size) - 1) / 2;
  }
  static double reflect(double v, double twice_lo, double twice_hi) {
    if (twice_lo == twice_hi) return 0;
    const double lo = twice_lo / 2, span = (twice_hi - twice_lo) / 2;
    v = std::fabs(v - lo);
    const double extra = std::fmod(v, span);
    const int64_t flips = static_cast<int64_t>(std::floor(v / span));
    return flips % 2 == 0 ? extra + lo : span - extra + lo;
  }
  /// The padding mode applied to a position along a dim of `size` pixels.
  double pad_coord(double v, int64_t size) const {
    if (pad == "border") return std::clamp(v, 0.0, double(size - 1));
    if (pad == "reflection") {
      v = align ? reflect(v, 0, 2.0 * double(size - 1)) : reflect(v, -1, 2.0 * double(size) - 1);
      return std::clamp(v, 0.0, double(size - 1));
    }
    return v;
  }
};

double cubic1(double x, double a) { return ((a + 2) * x - (a + 3)) * x * x + 1; }
double cubic2(double x, double a) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; }
double cubic_interp(const double v[4], double t) {
  const double a = -0.75;
  return v[0] * cubic2(t + 1, a) + v[1] * cubic1(t, a) + v[2] * cubic1(1 - t, a) +
         v[3] * cubic2(2 - t, a);
}

void grid_sample(OpCall& c) {
  const View &x = c.need(0), &grid = c.need(1);
  if (x.dims.size() != 4 || grid.dims.size() != 4 || grid.dims[3] != 2 || grid.dims[0] != x.dims[0])
    throw OpError("only 2-D sampling ([N,C,H,W] input, [N,H,W,2] grid) is supported",
                  HP_UNSUPPORTED);
  const std::string mode = c.s("mode", "bilinear");
  if (mode != "bilinear" && mode != "nearest" && mode != "bicubic")
    throw OpError("mode '" + mode + "' is not supported", HP_UNSUPPORTED);
  const int64_t N = x.dims[0], C = x.dims[1], H = x.dims[2], W = x.dims[3];
  const int64_t OH = grid.dims[1], OW = grid.dims[2];
  Sampler s{W, H, c.i("align_corners", 0) != 0, c.s("padding_mode", "zeros")};
  View y = c.out(0, HP_F32, {N, C, OH, OW});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < C; ++ch) {
      const float* img = x.as<float>() + (n * C + ch) * H * W;
      auto at = [&](int64_t yy, int64_t xx) -> double {
        return yy < 0 || yy >= H || xx < 0 || xx >= W ? 0.0 : img[yy * W + xx];
      };
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const float* g = grid.as<float>() + ((n * OH + oh) * OW + ow) * 2;
          double ix = s.unnormalize(g[0], W), iy = s.unnormalize(g[1], H), v = 0;
          if (mode == "bicubic") {
            const double fx = std::floor(ix), fy = std::floor(iy);
            auto tap = [&](double yy, double xx) {
              xx = s.pad_coord(xx, W);
              yy = s.pad_coord(yy, H);
              return at(static_cast<int64_t>(yy), static_cast<int64_t>(xx));
            };
            double rows[4];
            for (int i = 0; i < 4; ++i) {
              const double vals[4] = {tap(fy - 1 + i, fx - 1), tap(fy - 1 + i, fx),
                                      tap(fy - 1 + i, fx + 1), tap(fy - 1 + i, fx + 2)};
              rows[i] = cubic_interp(vals, ix - fx);
            }
            v = cubic_interp(rows, iy - fy);
          } else {
            ix = s.pad_coord(ix, W);
            iy = s.pad_coord(iy, H);
            if (mode == "nearest") {
              v = at(static_cast<int64_t>(std::nearbyint(iy)),
                     static_cast<int64_t>(std::nearbyint(ix)));
            } else {
              const int64_t x0 = static_cast<int64_t>(std::floor(ix)),
                            y0 = static_cast<int64_t>(std::floor(iy));
              const double tx = ix - double(x0), ty = iy - double(y0);
              v = at(y0, x0) * (1 - tx) * (1 - ty) + at(y0, x0 + 1) * tx * (1 - ty) +
                  at(y0 + 1, x0) * (1 - tx) * ty + at(y0 + 1, x0 + 1) * tx * ty;
            }
          }
          y.as<float>()[((n * C + ch) * OH + oh) * OW + ow] = static_cast<float>(v);
        }
    }
}

}  // namespace

void register_vision_ops(OpTable& t) {
  t["NonMaxSuppression"] = {nms, [](const std::vector<int32_t>& d) {
                              return d.size() >= 2 && d[0] == HP_F32 && d[1] == HP_F32;
                            }};
  t["GridSample"] = {grid_sample, all_f32};
  t["RoiAlign"] = {roi_align, [](const std::vector<int32_t>& d) {
                     return d.size() == 3 && d[0] == HP_F32 && d[1] == HP_F32 &&
                            (d[2] == HP_I64 || d[2] == HP_I32);
                   }};
}

}  // namespace hp_cpu
