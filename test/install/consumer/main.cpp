// Loads a classifier with an installed kiln and runs it: the output must be one probability
// distribution per image. Built by test/install/install_test.sh with CMake and pkg-config.
#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include <kiln/kiln.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln-consumer MODELS_DIR/tiny-cnn/model.onnx\n");
    return 2;
  }
  try {
    kiln::Session session(argv[1]);
    const int64_t batch = 2;
    std::vector<float> pixels(batch * 3 * 32 * 32);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i % 17) / 17.0f;
    auto outputs =
        session.run({{"image", kiln::Tensor::from_vector<float>({batch, 3, 32, 32}, pixels)}});
    const kiln::Tensor& probs = outputs.at(0).value.tensor();
    if (probs.shape() != kiln::Shape{batch, 10}) {
      std::fprintf(stderr, "unexpected output %s\n", probs.describe().c_str());
      return 1;
    }
    const std::vector<float> p = probs.to_vector<float>();
    for (int64_t b = 0; b < batch; ++b) {
      double sum = 0;
      for (int64_t k = 0; k < 10; ++k) sum += p[static_cast<size_t>(b * 10 + k)];
      if (std::fabs(sum - 1.0) > 1e-4) {
        std::fprintf(stderr, "row %lld sums to %f\n", static_cast<long long>(b), sum);
        return 1;
      }
    }
    std::printf("kiln %s: %s -> %s\n", kiln::version(), session.inputs()[0].describe().c_str(),
                probs.describe().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-consumer: %s\n", e.what());
    return 2;
  }
}
