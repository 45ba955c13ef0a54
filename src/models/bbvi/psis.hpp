#pragma once
// Did the variational fit work? The Pareto k-hat diagnostic (Yao, Vehtari, Simpson & Gelman 2018):
// the shape of a generalised Pareto distribution fitted to the largest importance ratios
// p(theta, y) / q(theta) of draws from q. Readings (Vehtari et al. 2024): k-hat < 0.5
// q is close to the posterior; 0.5-0.7 usable for many purposes; > 0.7 the importance ratios
// have too heavy a tail to trust q, or importance sampling from it.
#include <span>

namespace caviar::bbvi {

// k-hat from S log importance ratios (any additive constant): the generalised Pareto fit of
// Zhang & Stephens (2009) to the M = min(S / 5, 3 sqrt(S)) largest ratios, with the weakly
// informative prior of Vehtari et al. (2024) pulling k towards 0.5 by 10 pseudo
// observations. Non-finite ratios are ignored; NaN if fewer than 5 tail points remain, +inf if
// the largest ratios exceed the fifth largest by more than e^700 (no representable tail).
double pareto_k_hat(std::span<const double> log_ratios);

}  // namespace caviar::bbvi
