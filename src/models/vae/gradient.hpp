#pragma once
// The VAE as a model of the engine's gradient driver (engine/gradient.hpp): a block's objective
// is the sum of its rows' ELBOs (Kingma & Welling 2014, eq. 10) and its gradient that of minus
// it, by the reparameterisation trick with S samples per row whose noise is keyed by (seed, row,
// step) (fill_noise); there is no global term (weight decay is the optimiser's). Every rank holds
// every row (D x N, float32), since a minibatch's blocks may hold any rows. A convolutional
// network's batch norm makes rows of one minibatch interact: it is then a staged model
// (engine/gradient.hpp's StagedGradientModel), and keeps batch norm's running statistics. No MPI
// and no files.
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/state.hpp"
#include "models/vae/vae.hpp"

namespace caviar::vae {

class GradientFit {
 public:
  static constexpr bool kGlobalTerm = false;
  struct Workspace {
    Network<float> net;
    Mat<float> x, eps;
    // A Bayesian decoder's draw of the weights for step `sampled_step` and its noise.
    std::vector<float> sampled, weight_eps;
    std::int64_t sampled_step = -1;
  };

  // data: D x N, all rows; params: the initial parameters (layout.n_params).
  GradientFit(const Layout& layout, const Mat<float>& data, ParamVec params, int samples,
              std::uint64_t seed)
      : layout_(&layout),
        data_(&data),
        params_(std::move(params)),
        samples_(samples),
        seed_(seed) {}

  Workspace make_workspace() const { return {Network<float>(*layout_), {}, {}, {}, {}, -1}; }
  ParamVec& params() { return params_; }
  // Batch norm's running statistics (empty without batch norm).
  const std::vector<double>& running() const { return running_; }

  // A convolutional network normalises over the whole global minibatch, so its pass runs in
  // stages around reductions (Network::stage; engine/gradient.hpp); none for the MLP.
  int reductions() const { return Network<float>::reductions(*layout_); }
  std::size_t reduction_size(int k) const { return Network<float>::reduction_size(*layout_, k); }
  double stage(Workspace& ws, int k, std::span<const std::int64_t> rows, std::int64_t step,
               std::span<const double> combined, std::span<double> local, float* grad) const {
    if (k == 0) load_block(ws, rows, step);
    return ws.net.stage(params_.data(), k, ws.x, ws.eps, samples_, combined, local, grad);
  }
  // Called once per reduction in training, identically on every rank: the running statistics
  // follow the minibatch's.
  void combine(int k, std::span<const double> blocks, std::int64_t n_blocks,
               std::vector<double>& out) {
    Network<float>::combine(*layout_, k, blocks, n_blocks, out, running_.data());
  }

  double block(Workspace& ws, std::span<const std::int64_t> rows, std::int64_t step,
               float* grad) const {
    load_block(ws, rows, step);
    if (!layout_->arch.bayesian_decoder)
      return ws.net.run(params_.data(), ws.x, ws.eps, samples_, grad);
    // One draw of the decoder's weights per step, the same in every workspace (keyed by step).
    if (ws.sampled_step != step) {
      sample_decoder(*layout_, params_.data(), seed_, static_cast<std::uint32_t>(step), ws.sampled,
                     ws.weight_eps);
      ws.sampled_step = step;
    }
    const double f = ws.net.run(ws.sampled.data(), ws.x, ws.eps, samples_, grad);
    const double frac = static_cast<double>(rows.size()) / static_cast<double>(data_->cols());
    const double kl =
        decoder_kl_backward(*layout_, params_.data(), ws.weight_eps.data(), frac, grad);
    return f - frac * kl;
  }
  // The weights' KL(q(w) || p(w)) at the current parameters (0 without a Bayesian decoder).
  double decoder_kl() const {
    if (!layout_->arch.bayesian_decoder) return 0;
    return decoder_kl_backward<float>(*layout_, params_.data(), nullptr, 0.0, nullptr);
  }
  double global_term(float*) const { return 0; }

  // The parameter buffer as one array (float32 values: exact as doubles).
  void save(engine::StateWriter& w) const {
    w.array("params", std::vector<double>(params_.begin(), params_.end()),
            {static_cast<std::uint64_t>(params_.size())});
    if (!running_.empty())
      w.array("running", running_, {static_cast<std::uint64_t>(running_.size())});
  }
  void load(const engine::StateReader& r) {
    const std::vector<double> p = r.array("params", {static_cast<std::uint64_t>(params_.size())});
    std::copy(p.begin(), p.end(), params_.begin());
    if (!running_.empty())
      running_ = r.array("running", {static_cast<std::uint64_t>(running_.size())});
  }

 private:
  void load_block(Workspace& ws, std::span<const std::int64_t> rows, std::int64_t step) const {
    const auto rn = static_cast<std::int64_t>(rows.size());
    ws.x.resize(layout_->input_dim(), rn);
    for (std::int64_t c = 0; c < rn; ++c) ws.x.col(c) = data_->col(rows[c]);
    fill_noise(ws.eps, rows.data(), rn, samples_, layout_->latent(), seed_,
               static_cast<std::uint32_t>(step));
  }

  const Layout* layout_;
  const Mat<float>* data_;
  ParamVec params_;
  int samples_;
  std::uint64_t seed_;
  std::vector<double> running_ = initial_running(*layout_);
};

}  // namespace caviar::vae
