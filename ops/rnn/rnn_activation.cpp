#include "ops/rnn/rnn_activation.h"

#include <cctype>

namespace kiln::ops::rnn {

Activation parse_activation(const NodeInfo& info, const std::string& name,
                            const std::vector<float>& alphas, size_t& ai,
                            const std::vector<float>& betas, size_t& bi) {
  struct Entry {
    const char* name;
    Activation::Kind kind;
    bool uses_alpha, uses_beta;
    float alpha, beta;
  };
  static const Entry table[] = {
      {"relu", Activation::Relu, false, false, 0, 0},
      {"tanh", Activation::Tanh, false, false, 0, 0},
      {"sigmoid", Activation::Sigmoid, false, false, 0, 0},
      {"affine", Activation::Affine, true, true, 0, 0},
      {"leakyrelu", Activation::LeakyRelu, true, false, 0.01f, 0},
      {"thresholdedrelu", Activation::ThresholdedRelu, true, false, 0, 0},
      {"scaledtanh", Activation::ScaledTanh, true, true, 0, 0},
      {"hardsigmoid", Activation::HardSigmoid, true, true, 0.2f, 0.5f},
      {"elu", Activation::Elu, true, false, 1.0f, 0},
      {"softsign", Activation::Softsign, false, false, 0, 0},
      {"softplus", Activation::Softplus, false, false, 0, 0},
  };
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Entry& e : table) {
    if (lower != e.name) continue;
    Activation act{e.kind, e.alpha, e.beta};
    if (e.uses_alpha && ai < alphas.size()) act.alpha = alphas[ai++];
    if (e.uses_beta && bi < betas.size()) act.beta = betas[bi++];
    return act;
  }
  info.fail("unknown activation '" + name + "'", ErrorKind::Unsupported);
}

}  // namespace kiln::ops::rnn
