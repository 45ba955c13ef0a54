// oneDNN (Debian libdnnl-dev) against caviar's own im2col + GEMM convolution
// (src/models/vae/conv.hpp), on the layers of the default convolutional VAE for Fashion-MNIST, to
// decide which one the VAE should use. Built only where oneDNN is found (bench/CMakeLists.txt).
//
// What caviar needs from a convolution: the driver (src/engine/gradient.hpp) runs one thread per
// micro-block, so each call is single-threaded on a block of N images (N depends only on the batch
// size), and its results must be the same bits whatever the rank and thread counts. So this
// program measures, at N = 25 and 50 (a batch of 100 in 4 or 2 blocks):
//   - time of forward, backward to the data and backward to the weights (with the bias) of each
//     layer: caviar, oneDNN with the activations' own NCHW layout ("plain"), and oneDNN with
//     format_tag::any ("any"), whose reorders from and to NCHW (and of the weights, which change
//     at every step) are timed with it. oneDNN on 1 thread (how caviar would call it) and on 2;
//     caviar's functions are single-threaded by design (the driver parallelises over blocks);
//   - the difference of oneDNN's results from caviar's;
//   - invariance: repeated calls, oneDNN at 1 against 2 threads, a batch of 50 against the same
//     images as two blocks of 25, and two blocks run at once on two OpenMP threads (as caviar's
//     driver would run them) against the same blocks run one after the other.
//
// Timing: every measurement is the median of single-call times over at least --min-ms of calls;
// the measurements are interleaved (round r runs every configuration once) and the table shows
// the median over --rounds rounds and the range (min-max) of the round medians, because the
// machine may be shared.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/vae/conv.hpp"

namespace {

using caviar::vae::ConvShape;
using MatF = caviar::vae::Mat<float>;
using dnnl::memory;
using Tag = memory::format_tag;

constexpr int kMaxN = 50;
constexpr int kBlock = 25;  // two blocks of 25 make the batch of 50 (invariance check iii)
// --library-scratchpad: oneDNN's default scratchpad instead of one per primitive (check iv).
bool g_library_scratchpad = false;

// A layer of the network: a convolution of shape s, or the transposed convolution that is its
// adjoint (caviar describes a transposed convolution by the convolution it is the adjoint of).
struct Layer {
  std::string name;
  ConvShape s;
  bool transposed = false;

  int in_c() const { return transposed ? s.out_channels : s.in_channels; }
  int in_h() const { return transposed ? s.out_height() : s.height; }
  int in_w() const { return transposed ? s.out_width() : s.width; }
  int out_c() const { return transposed ? s.in_channels : s.out_channels; }
  int out_h() const { return transposed ? s.height : s.out_height(); }
  int out_w() const { return transposed ? s.width : s.out_width(); }
  int in_size() const { return in_c() * in_h() * in_w(); }
  int out_size() const { return out_c() * out_h() * out_w(); }
  // The convolution's multiply-adds per image; its adjoint and both backward passes have as many.
  double macs() const { return double(s.out_size()) * s.patch(); }
};

// The layer's inputs for a batch of kMaxN images; a block of N uses the first N columns (or the
// columns of block 1 for the invariance check).
struct LayerData {
  MatF x, dy;  // input (in_size x kMaxN), dL/d(output) (out_size x kMaxN)
  std::vector<float> w, b;
};

LayerData make_data(const Layer& l, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  LayerData d;
  d.x.resize(l.in_size(), kMaxN);
  d.dy.resize(l.out_size(), kMaxN);
  for (Eigen::Index i = 0; i < d.x.size(); ++i) d.x.data()[i] = u(gen);
  for (Eigen::Index i = 0; i < d.dy.size(); ++i) d.dy.data()[i] = u(gen);
  // A Kaiming-like scale, so that outputs are O(1) as in training.
  const float scale = 1.f / std::sqrt(float(l.s.patch()));
  d.w.resize(l.s.weights());
  d.b.resize(l.out_c());
  for (float& v : d.w) v = scale * u(gen);
  for (float& v : d.b) v = 0.1f * u(gen);
  return d;
}

// Results of one implementation on one block: forward output, dL/dx, dL/dW, dL/db.
struct Outputs {
  std::vector<float> y, dx, gw, gb;
  Outputs(const Layer& l, int n)
      : y(std::size_t(l.out_size()) * n),
        dx(std::size_t(l.in_size()) * n),
        gw(l.s.weights()),
        gb(l.out_c()) {}
};

// No dL/dx wanted (typed, since the scalar type is deduced from every argument).
constexpr MatF* kNoDx = nullptr;

enum Op { kFwd, kBwdData, kBwdWeights, kBwdAll, kOps };
const char* const kOpName[kOps] = {"fwd", "bwd_data", "bwd_weights", "bwd_all"};

// ---------------------------------------------------------------------------------------------
// caviar: the functions of conv.hpp on one block, as the VAE calls them.
class CaviarLayer {
 public:
  CaviarLayer(const Layer& l, const LayerData& d, int first, int n)
      : l_(l),
        w_(d.w),
        b_(d.b),
        x_(d.x.middleCols(first, n)),
        dy_(d.dy.middleCols(first, n)),
        out_(l, n) {
    if (!l.transposed) run(kFwd);  // the patch matrix that conv_backward reuses
  }

  void run(Op op) {
    const ConvShape& s = l_.s;
    const int p = s.out_positions();
    switch (op) {
      case kFwd:
        if (l_.transposed)
          caviar::vae::conv_transpose_forward(s, w_.data(), b_.data(), x_, y_);
        else
          caviar::vae::conv_forward(s, w_.data(), b_.data(), x_, cols_, y_);
        break;
      case kBwdWeights:
        if (l_.transposed)
          caviar::vae::conv_transpose_backward(s, w_.data(), x_, dy_, out_.gw.data(),
                                               out_.gb.data(), kNoDx);
        else
          caviar::vae::conv_backward(s, w_.data(), cols_, dy_, out_.gw.data(), out_.gb.data(),
                                     kNoDx);
        break;
      case kBwdData: {
        // conv.hpp computes dL/dx inside the backward call, sharing a layout change (conv) or the
        // patch matrix of dy (transposed) with dL/dW; here the same steps alone, to set against
        // oneDNN's backward-data primitive. kBwdAll is the call the VAE makes.
        // The product is constructed, not assigned, as in conv.hpp (assignment would add a copy).
        MatF tmp;
        if (l_.transposed) {
          caviar::vae::im2col(s, dy_, tmp);
          const MatF prod =
              tmp * caviar::vae::WeightMap<float>(w_.data(), s.out_channels, s.patch()).transpose();
          caviar::vae::positions_to_columns(prod, s.out_channels, p, dx_);
        } else {
          caviar::vae::columns_to_positions(dy_, s.out_channels, p, tmp);
          const MatF prod =
              tmp * caviar::vae::WeightMap<float>(w_.data(), s.out_channels, s.patch());
          dx_.setZero(s.in_size(), dy_.cols());
          caviar::vae::col2im_add(s, prod, dx_);
        }
        break;
      }
      case kBwdAll:
        if (l_.transposed)
          caviar::vae::conv_transpose_backward(s, w_.data(), x_, dy_, out_.gw.data(),
                                               out_.gb.data(), &dx_);
        else
          caviar::vae::conv_backward(s, w_.data(), cols_, dy_, out_.gw.data(), out_.gb.data(),
                                     &dx_);
        break;
      default:
        break;
    }
  }
  // The results so far (copied here, outside the timed calls).
  const Outputs& out() {
    copy(y_, out_.y);
    copy(dx_, out_.dx);
    return out_;
  }

 private:
  static void copy(const MatF& m, std::vector<float>& v) {
    if (m.size()) std::memcpy(v.data(), m.data(), sizeof(float) * std::size_t(m.size()));
  }
  const Layer& l_;
  const std::vector<float>&w_, &b_;
  MatF x_, dy_, cols_, y_, dx_;
  Outputs out_;
};

// ---------------------------------------------------------------------------------------------
// oneDNN: a primitive with its arguments, and the reorders between caviar's layouts and the ones
// the primitive asked for (none when they are the same).
struct Call {
  struct Reorder {
    dnnl::reorder r;
    memory from, to;
  };
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
  std::vector<Reorder> before, after;
  std::string impl;

  void run(dnnl::stream& st) {
    for (auto& r : before) r.r.execute(st, r.from, r.to);
    prim.execute(st, args);
    for (auto& r : after) r.r.execute(st, r.from, r.to);
    st.wait();
  }
  // Binds argument `arg` to the user's memory, through a temporary in the layout `want` if it
  // differs: inputs are reordered into it before the primitive, outputs out of it after.
  void bind(const dnnl::engine& eng, int arg, const memory::desc& want, const memory& user,
            bool output) {
    if (want == user.get_desc()) {
      args[arg] = user;
      return;
    }
    memory tmp(want, eng);
    args[arg] = tmp;
    if (output)
      after.push_back({dnnl::reorder(tmp, user), tmp, user});
    else
      before.push_back({dnnl::reorder(user, tmp), user, tmp});
  }
};

// A layer's three oneDNN primitives on one block, created for the thread count in force.
class DnnlLayer {
 public:
  DnnlLayer(const dnnl::engine& eng, const Layer& l, LayerData& d, int first, int n, bool any)
      : out_(l, n) {
    const memory::dims src_dims{n, l.in_c(), l.in_h(), l.in_w()};
    const memory::dims dst_dims{n, l.out_c(), l.out_h(), l.out_w()};
    // caviar's weights are row-major (C_out x C_in k k) of the convolution: OIHW for it; for its
    // adjoint, whose output channels are the convolution's inputs, that memory is IOHW.
    const memory::dims w_dims{l.out_c(), l.in_c(), l.s.kernel, l.s.kernel};
    const Tag w_tag = l.transposed ? Tag::iohw : Tag::oihw;
    const memory::dims b_dims{l.out_c()};
    const memory::desc src_u(src_dims, memory::data_type::f32, Tag::nchw);
    const memory::desc dst_u(dst_dims, memory::data_type::f32, Tag::nchw);
    const memory::desc w_u(w_dims, memory::data_type::f32, w_tag);
    const memory::desc b_u(b_dims, memory::data_type::f32, Tag::x);
    // "any" lets the primitive choose (blocked layouts on AVX2/AVX-512); plain imposes caviar's.
    const auto pick = [&](const memory::dims& dims, const memory::desc& user) {
      return any ? memory::desc(dims, memory::data_type::f32, Tag::any) : user;
    };
    const memory::desc src_m = pick(src_dims, src_u), dst_m = pick(dst_dims, dst_u),
                       w_m = pick(w_dims, w_u), b_m = pick(b_dims, b_u);

    // User memories over the caviar buffers (no copy: an image's column is its NCHW tensor).
    float* x = d.x.data() + std::size_t(first) * l.in_size();
    float* dy = d.dy.data() + std::size_t(first) * l.out_size();
    const memory x_mem(src_u, eng, x), dy_mem(dst_u, eng, dy), w_mem(w_u, eng, d.w.data()),
        b_mem(b_u, eng, d.b.data()), y_mem(dst_u, eng, out_.y.data()),
        dx_mem(src_u, eng, out_.dx.data()), gw_mem(w_u, eng, out_.gw.data()),
        gb_mem(b_u, eng, out_.gb.data());

    const memory::dims strides{l.s.stride, l.s.stride}, pad{l.s.pad, l.s.pad};
    const Mds m{src_m, w_m, b_m, dst_m};
    const Mems u{x_mem, dy_mem, w_mem, b_mem, y_mem, dx_mem, gw_mem, gb_mem};
    if (l.transposed)
      create<dnnl::deconvolution_forward, dnnl::deconvolution_backward_data,
             dnnl::deconvolution_backward_weights>(eng, dnnl::algorithm::deconvolution_direct, m,
                                                   strides, pad, u);
    else
      create<dnnl::convolution_forward, dnnl::convolution_backward_data,
             dnnl::convolution_backward_weights>(eng, dnnl::algorithm::convolution_direct, m,
                                                 strides, pad, u);
  }

  void run(Op op, dnnl::stream& st) { calls_[op].run(st); }
  const Outputs& out() const { return out_; }
  const std::string& impl(Op op) const { return calls_[op].impl; }
  int reorders(Op op) const { return int(calls_[op].before.size() + calls_[op].after.size()); }

 private:
  struct Mds {
    memory::desc src, w, b, dst;  // what the primitives are asked for (maybe format_tag::any)
  };
  struct Mems {
    memory x, dy, w, b, y, dx, gw, gb;  // over caviar's buffers, in caviar's layouts
  };

  // The forward, backward-data and backward-weights primitives of a convolution (F, BD, BW) or of
  // a deconvolution, the backward ones created with the forward one as their hint, as oneDNN
  // requires.
  template <class F, class BD, class BW>
  void create(const dnnl::engine& eng, dnnl::algorithm alg, const Mds& m,
              const memory::dims& strides, const memory::dims& pad, const Mems& u) {
    // A scratchpad of the caller's per primitive, not the library's: with the library's
    // (--library-scratchpad), two threads running gemm-based convolutions at once crashed here
    // (oneDNN 2.6.3, check iv); caviar would keep one per thread's workspace.
    dnnl::primitive_attr attr;
    if (!g_library_scratchpad) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const typename F::primitive_desc fpd(
        typename F::desc(dnnl::prop_kind::forward_training, alg, m.src, m.w, m.b, m.dst, strides,
                         pad, pad),
        attr, eng);
    const typename BD::primitive_desc dpd(
        typename BD::desc(alg, m.src, m.w, m.dst, strides, pad, pad), attr, eng, fpd);
    const typename BW::primitive_desc wpd(
        typename BW::desc(alg, m.src, m.w, m.b, m.dst, strides, pad, pad), attr, eng, fpd);

    Call& f = calls_[kFwd];
    f.prim = F(fpd);
    f.bind(eng, DNNL_ARG_SRC, fpd.src_desc(), u.x, false);
    f.bind(eng, DNNL_ARG_WEIGHTS, fpd.weights_desc(), u.w, false);
    f.bind(eng, DNNL_ARG_BIAS, fpd.bias_desc(), u.b, false);
    f.bind(eng, DNNL_ARG_DST, fpd.dst_desc(), u.y, true);
    if (!g_library_scratchpad) f.args[DNNL_ARG_SCRATCHPAD] = memory(fpd.scratchpad_desc(), eng);
    f.impl = fpd.impl_info_str();
    Call& bd = calls_[kBwdData];
    bd.prim = BD(dpd);
    bd.bind(eng, DNNL_ARG_DIFF_DST, dpd.diff_dst_desc(), u.dy, false);
    bd.bind(eng, DNNL_ARG_WEIGHTS, dpd.weights_desc(), u.w, false);
    bd.bind(eng, DNNL_ARG_DIFF_SRC, dpd.diff_src_desc(), u.dx, true);
    if (!g_library_scratchpad) bd.args[DNNL_ARG_SCRATCHPAD] = memory(dpd.scratchpad_desc(), eng);
    bd.impl = dpd.impl_info_str();
    Call& bw = calls_[kBwdWeights];
    bw.prim = BW(wpd);
    bw.bind(eng, DNNL_ARG_SRC, wpd.src_desc(), u.x, false);
    bw.bind(eng, DNNL_ARG_DIFF_DST, wpd.diff_dst_desc(), u.dy, false);
    bw.bind(eng, DNNL_ARG_DIFF_WEIGHTS, wpd.diff_weights_desc(), u.gw, true);
    bw.bind(eng, DNNL_ARG_DIFF_BIAS, wpd.diff_bias_desc(), u.gb, true);
    if (!g_library_scratchpad) bw.args[DNNL_ARG_SCRATCHPAD] = memory(wpd.scratchpad_desc(), eng);
    bw.impl = wpd.impl_info_str();
  }
  Outputs out_;
  Call calls_[3];
};

// ---------------------------------------------------------------------------------------------
// Timing and comparison helpers.

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The median single-call time of f over at least min_s seconds and 5 calls, after one warm-up.
template <class F>
double time_median(F&& f, double min_s) {
  f();
  std::vector<double> t;
  double total = 0;
  while (total < min_s || t.size() < 5) {
    const double t0 = seconds_now();
    f();
    const double dt = seconds_now() - t0;
    t.push_back(dt);
    total += dt;
  }
  return median(std::move(t));
}

struct Diff {
  bool same_bits = true;
  double max_abs = 0, rel = 0;  // max |a - b|, and that over max |b|
};
Diff compare(const float* a, const float* b, std::size_t n) {
  Diff d;
  double ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    d.max_abs = std::max(d.max_abs, std::abs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::abs(double(b[i])));
  }
  d.same_bits = std::memcmp(a, b, n * sizeof(float)) == 0;
  d.rel = ref > 0 ? d.max_abs / ref : d.max_abs;
  return d;
}
Diff compare(const std::vector<float>& a, const std::vector<float>& b) {
  return compare(a.data(), b.data(), std::min(a.size(), b.size()));
}
Diff worst(Diff a, const Diff& b) {
  a.same_bits = a.same_bits && b.same_bits;
  a.max_abs = std::max(a.max_abs, b.max_abs);
  a.rel = std::max(a.rel, b.rel);
  return a;
}
void print_check(const char* what, const Diff& d) {
  std::printf("  %-72s %-3s  max|diff| %.3g\n", what, d.same_bits ? "yes" : "no", d.max_abs);
}

// The outputs an op writes, as (pointer, count) pairs to compare.
std::vector<std::pair<const std::vector<float>*, std::size_t>> written(const Outputs& o, Op op) {
  switch (op) {
    case kFwd:
      return {{&o.y, o.y.size()}};
    case kBwdData:
      return {{&o.dx, o.dx.size()}};
    default:
      return {{&o.gw, o.gw.size()}, {&o.gb, o.gb.size()}};
  }
}
Diff compare_op(const Outputs& a, const Outputs& b, Op op) {
  Diff d;
  const auto wa = written(a, op), wb = written(b, op);
  for (std::size_t i = 0; i < wa.size(); ++i) d = worst(d, compare(*wa[i].first, *wb[i].first));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  double min_ms = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc)
      rounds = std::atoi(argv[++i]);
    else if (a == "--min-ms" && i + 1 < argc)
      min_ms = std::atof(argv[++i]);
    else if (a == "--library-scratchpad")
      g_library_scratchpad = true;
    else {
      std::fprintf(stderr, "usage: %s [--rounds R] [--min-ms MS] [--library-scratchpad]\n",
                   argv[0]);
      return 2;
    }
  }
  const double min_s = min_ms * 1e-3;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash inside oneDNN must not lose the lines

  // The default Fashion-MNIST architecture (--channels 32,64): encoder conv1, conv2; decoder
  // deconv2, deconv1, the adjoints of conv2 and conv1 (deconv1 with 1 output channel, the
  // Bernoulli logits).
  const ConvShape c1{1, 28, 28, 32, 4, 2, 1}, c2{32, 14, 14, 64, 4, 2, 1};
  const std::vector<Layer> layers{{"enc conv1 1x28x28->32x14x14", c1, false},
                                  {"enc conv2 32x14x14->64x7x7", c2, false},
                                  {"dec deconv2 64x7x7->32x14x14", c2, true},
                                  {"dec deconv1 32x14x14->1x28x28", c1, true}};
  const int kThreads[2] = {1, 2};
  const int kN[2] = {kBlock, kMaxN};

  std::vector<LayerData> data;
  for (std::size_t i = 0; i < layers.size(); ++i)
    data.push_back(make_data(layers[i], 1234u + std::uint32_t(i)));

  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  const dnnl_version_t* v = dnnl_version();
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf("oneDNN %d.%d.%d (cpu runtime %s), OpenMP max threads %d, load average %.2f\n",
              v->major, v->minor, v->patch,
              DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP ? "OpenMP" : "other", omp_get_max_threads(),
              load[0]);

  // Every implementation on every block: caviar on [0, N) and on block 1 [25, 50); oneDNN the same
  // for each thread count and layout choice. Primitives are created with the thread count they
  // will run with, since oneDNN fixes its work split when a primitive is created.
  using Key = std::tuple<int, int, int>;  // layer, first image, N
  std::map<Key, std::unique_ptr<CaviarLayer>> cav;
  std::map<std::tuple<int, int, int, int, bool>, std::unique_ptr<DnnlLayer>> dn;  // + threads, any
  for (int li = 0; li < int(layers.size()); ++li)
    for (const auto& [first, n] :
         {std::pair{0, kBlock}, std::pair{kBlock, kBlock}, std::pair{0, kMaxN}}) {
      cav[{li, first, n}] = std::make_unique<CaviarLayer>(layers[li], data[li], first, n);
      for (int t : kThreads) {
        omp_set_num_threads(t);
        for (bool any : {false, true})
          dn[{li, first, n, t, any}] =
              std::make_unique<DnnlLayer>(eng, layers[li], data[li], first, n, any);
      }
    }
  auto run_dn = [&](DnnlLayer& d, int threads, Op op) {
    omp_set_num_threads(threads);
    d.run(op, st);
  };

  // Implementations chosen by oneDNN (at N = 50, 1 thread) and the reorders "any" costs.
  std::printf(
      "\noneDNN implementations (N = 50; plain = NCHW/OIHW imposed, any = format_tag::any"
      " + reorders from/to NCHW)\n");
  for (int li = 0; li < int(layers.size()); ++li)
    for (Op op : {kFwd, kBwdData, kBwdWeights})
      for (bool any : {false, true}) {
        const DnnlLayer& d = *dn[{li, 0, kMaxN, 1, any}];
        std::printf("  %-30s %-11s %-5s %-28s reorders %d\n", layers[li].name.c_str(), kOpName[op],
                    any ? "any" : "plain", d.impl(op).c_str(), d.reorders(op));
      }

  // ---- numerics and invariance (before the timing, on fresh outputs) ----
  for (auto& [k, c] : cav)
    for (Op op : {kFwd, kBwdData, kBwdWeights}) c->run(op);
  for (auto& [k, d] : dn)
    for (Op op : {kFwd, kBwdData, kBwdWeights}) run_dn(*d, std::get<3>(k), op);

  std::printf("\nNumerics: oneDNN against caviar, N = 50, 1 thread; max |a - b| / max |caviar|\n");
  std::printf("  %-30s %-11s %-12s %-12s\n", "layer", "op", "plain", "any");
  for (int li = 0; li < int(layers.size()); ++li)
    for (Op op : {kFwd, kBwdData, kBwdWeights}) {
      const Outputs& ref = cav[{li, 0, kMaxN}]->out();
      const Diff p = compare_op(dn[{li, 0, kMaxN, 1, false}]->out(), ref, op);
      const Diff a = compare_op(dn[{li, 0, kMaxN, 1, true}]->out(), ref, op);
      std::printf("  %-30s %-11s %-12.3g %-12.3g\n", layers[li].name.c_str(), kOpName[op], p.rel,
                  a.rel);
    }

  std::printf("\nInvariance (yes = identical bits in every layer, N and op listed)\n");
  {
    // (i) the same call again.
    Diff dc, dd[2][2];
    for (auto& [k, c] : cav)
      for (Op op : {kFwd, kBwdData, kBwdWeights}) {
        const Outputs before = c->out();
        c->run(op);
        dc = worst(dc, compare_op(c->out(), before, op));
      }
    for (auto& [k, d] : dn)
      for (Op op : {kFwd, kBwdData, kBwdWeights}) {
        const Outputs before = d->out();
        run_dn(*d, std::get<3>(k), op);
        Diff& w = dd[std::get<3>(k) - 1][std::get<4>(k)];
        w = worst(w, compare_op(d->out(), before, op));
      }
    print_check("(i) repeated call: caviar", dc);
    for (int t : kThreads)
      for (bool any : {false, true}) {
        const std::string s = "(i) repeated call: oneDNN " + std::string(any ? "any" : "plain") +
                              ", " + std::to_string(t) + " thread(s)";
        print_check(s.c_str(), dd[t - 1][any]);
      }

    // (ii) oneDNN 1 thread against 2 threads.
    for (bool any : {false, true})
      for (Op op : {kFwd, kBwdData, kBwdWeights}) {
        Diff w;
        for (int li = 0; li < int(layers.size()); ++li)
          for (int n : kN)
            w = worst(w,
                      compare_op(dn[{li, 0, n, 1, any}]->out(), dn[{li, 0, n, 2, any}]->out(), op));
        const std::string s =
            "(ii) 1 vs 2 threads: oneDNN " + std::string(any ? "any" : "plain") + " " + kOpName[op];
        print_check(s.c_str(), w);
      }
    // Per layer, where it differs.
    for (bool any : {false, true})
      for (int li = 0; li < int(layers.size()); ++li)
        for (int n : kN)
          for (Op op : {kFwd, kBwdData, kBwdWeights}) {
            const Diff w =
                compare_op(dn[{li, 0, n, 1, any}]->out(), dn[{li, 0, n, 2, any}]->out(), op);
            if (!w.same_bits)
              std::printf("      differs: %s %s N=%d %s (max|diff| %.3g, rel %.3g)\n",
                          any ? "any" : "plain", layers[li].name.c_str(), n, kOpName[op], w.max_abs,
                          w.rel);
          }

    // (iii) the batch of 50 against its two blocks of 25, image by image (forward and
    // backward-data are per image; the weight gradient is a sum over the block's images).
    auto split_check = [&](const Outputs& whole, const Outputs& b0, const Outputs& b1,
                           const Layer& l, Op op) {
      const bool f = op == kFwd;
      const std::size_t n = std::size_t(f ? l.out_size() : l.in_size()) * kBlock;
      const float* w = f ? whole.y.data() : whole.dx.data();
      return worst(compare(w, f ? b0.y.data() : b0.dx.data(), n),
                   compare(w + n, f ? b1.y.data() : b1.dx.data(), n));
    };
    // impl: -1 caviar, else oneDNN with that "any".
    auto split_report = [&](int impl, int t) {
      const std::string who = impl < 0 ? std::string("caviar")
                                       : "oneDNN " + std::string(impl ? "any" : "plain") + ", " +
                                             std::to_string(t) + " thread(s)";
      Diff w;
      for (int li = 0; li < int(layers.size()); ++li)
        for (Op op : {kFwd, kBwdData}) {
          const Diff d =
              impl < 0 ? split_check(cav[{li, 0, kMaxN}]->out(), cav[{li, 0, kBlock}]->out(),
                                     cav[{li, kBlock, kBlock}]->out(), layers[li], op)
                       : split_check(dn[{li, 0, kMaxN, t, impl == 1}]->out(),
                                     dn[{li, 0, kBlock, t, impl == 1}]->out(),
                                     dn[{li, kBlock, kBlock, t, impl == 1}]->out(), layers[li], op);
          if (!d.same_bits)
            std::printf("      differs: %s %s %s (max|diff| %.3g, rel %.3g)\n", who.c_str(),
                        layers[li].name.c_str(), kOpName[op], d.max_abs, d.rel);
          w = worst(w, d);
        }
      print_check(("(iii) batch of 50 vs 2 blocks of 25 (fwd, bwd_data): " + who).c_str(), w);
    };
    split_report(-1, 1);
    for (int t : kThreads)
      for (int impl : {0, 1}) split_report(impl, t);

    // (iv) caviar's driver runs the blocks of a step at once, one per OpenMP thread: the two
    // blocks of 25 on two threads at once (1-thread primitives, a stream each, called inside the
    // parallel region, where oneDNN does not start threads of its own) against one after the
    // other.
    for (bool any : {false, true}) {
      Diff w;
      for (int li = 0; li < int(layers.size()); ++li) {
        DnnlLayer* blk[2] = {dn[{li, 0, kBlock, 1, any}].get(),
                             dn[{li, kBlock, kBlock, 1, any}].get()};
        const Outputs seq[2] = {blk[0]->out(), blk[1]->out()};
        dnnl::stream sts[2] = {dnnl::stream(eng), dnnl::stream(eng)};
        omp_set_num_threads(1);
        for (int rep = 0; rep < 20; ++rep) {
#pragma omp parallel for num_threads(2) schedule(static, 1)
          for (int b = 0; b < 2; ++b)
            for (Op op : {kFwd, kBwdData, kBwdWeights}) blk[b]->run(op, sts[b]);
          for (int b = 0; b < 2; ++b)
            for (Op op : {kFwd, kBwdData, kBwdWeights})
              w = worst(w, compare_op(blk[b]->out(), seq[b], op));
        }
      }
      const std::string s = "(iv) 2 blocks at once on 2 OpenMP threads vs in turn: oneDNN " +
                            std::string(any ? "any" : "plain");
      print_check(s.c_str(), w);
    }
  }

  if (rounds < 1) return 0;  // --rounds 0: the checks only

  // ---- timing, interleaved ----
  // Per (layer, N, implementation, threads, op): one median per round.
  struct Row {
    int li, n, impl, threads;  // impl: 0 caviar, 1 oneDNN plain, 2 oneDNN any
    Op op;
  };
  std::vector<Row> rows;
  for (int li = 0; li < int(layers.size()); ++li)
    for (int n : kN) {
      for (Op op : {kFwd, kBwdData, kBwdWeights, kBwdAll}) rows.push_back({li, n, 0, 1, op});
      for (int t : kThreads)
        for (int impl : {1, 2})
          for (Op op : {kFwd, kBwdData, kBwdWeights}) rows.push_back({li, n, impl, t, op});
    }
  std::vector<std::vector<double>> times(rows.size());
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& w = rows[i];
      if (w.impl == 0) {
        CaviarLayer& c = *cav[{w.li, 0, w.n}];
        times[i].push_back(time_median([&] { c.run(w.op); }, min_s));
      } else {
        DnnlLayer& d = *dn[{w.li, 0, w.n, w.threads, w.impl == 2}];
        omp_set_num_threads(w.threads);
        times[i].push_back(time_median([&] { d.run(w.op, st); }, min_s));
      }
    }
    std::fprintf(stderr, "round %d/%d done\n", r + 1, rounds);
  }
  getloadavg(load, 3);

  auto find = [&](int li, int n, int impl, int t, Op op) -> const std::vector<double>* {
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (rows[i].li == li && rows[i].n == n && rows[i].impl == impl && rows[i].threads == t &&
          rows[i].op == op)
        return &times[i];
    return nullptr;
  };
  auto cell = [&](const std::vector<double>* t, double flop) {
    if (!t) return std::string("-");
    const auto [lo, hi] = std::minmax_element(t->begin(), t->end());
    const double m = median(*t);
    char buf[96];
    std::snprintf(buf, sizeof buf, "%7.1f [%5.1f-%5.1f] %5.1f", m * 1e6, *lo * 1e6, *hi * 1e6,
                  flop / m * 1e-9);
    return std::string(buf);
  };
  std::printf(
      "\nTiming: median over %d rounds of the per-round median call time, microseconds "
      "[min-max of the round medians], then GFLOP/s (2 x MACs / median time).\n"
      "caviar bwd_all = conv_backward/conv_transpose_backward with dL/dx, the call the "
      "VAE makes. Load average at the end %.2f.\n",
      rounds, load[0]);
  for (int t : kThreads) {
    std::printf("\n%d thread(s) for oneDNN (caviar always 1)\n", t);
    std::printf(
        "| layer | N | op | caviar us [range] GF/s | oneDNN plain us [range] GF/s | "
        "oneDNN any us [range] GF/s |\n|---|---|---|---|---|---|\n");
    for (int li = 0; li < int(layers.size()); ++li)
      for (int n : kN) {
        const double flop = 2 * layers[li].macs() * n;
        for (Op op : {kFwd, kBwdData, kBwdWeights, kBwdAll}) {
          const double f = op == kBwdAll ? 2 * flop : flop;
          std::printf("| %s | %d | %s | %s | %s | %s |\n", layers[li].name.c_str(), n, kOpName[op],
                      cell(find(li, n, 0, 1, op), f).c_str(),
                      cell(find(li, n, 1, t, op), f).c_str(),
                      cell(find(li, n, 2, t, op), f).c_str());
        }
      }
    // The four layers as the VAE calls them, per block: forward and backward, without dL/dx for
    // the encoder's first layer (its input is the data). caviar: conv_backward with or without
    // dx; oneDNN: plain, any, and the faster of the two for each layer and op.
    for (int n : kN) {
      double cv = 0, pl = 0, an = 0, best = 0;
      for (int li = 0; li < int(layers.size()); ++li) {
        const bool first = li == 0;
        cv += median(*find(li, n, 0, 1, kFwd)) +
              median(*find(li, n, 0, 1, first ? kBwdWeights : kBwdAll));
        for (Op op : {kFwd, kBwdData, kBwdWeights}) {
          if (first && op == kBwdData) continue;
          const double a = median(*find(li, n, 1, t, op)), b = median(*find(li, n, 2, t, op));
          pl += a;
          an += b;
          best += std::min(a, b);
        }
      }
      std::printf("| all 4 layers as the VAE calls them | %d | fwd+bwd | %.1f | %.1f | %.1f |\n", n,
                  cv * 1e6, pl * 1e6, an * 1e6);
      std::printf(
          "  N=%d, %d thread(s): oneDNN, the faster of plain and any per layer and op: "
          "%.1f us; caviar / that = %.2f\n",
          n, t, best * 1e6, cv / best);
    }
  }
  return 0;
}
