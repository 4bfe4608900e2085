// TfIdfVectorizer: counts, per row of tokens, the n-grams of a fixed pool (with up to
// max_skip_count tokens skipped between items) and weights the counts (TF, IDF, TFIDF).
// The pool is a trie built once per node; rows are counted in parallel.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

template <typename Key>
class Trie {
 public:
  Trie() : nodes_(1) {}
  // The child of `node` for `key`, created when missing.
  int32_t child(int32_t node, const Key& key) {
    auto& children = nodes_[static_cast<size_t>(node)].children;
    auto it = children.find(key);
    if (it != children.end()) return it->second;
    const int32_t id = static_cast<int32_t>(nodes_.size());
    children.emplace(key, id);
    nodes_.emplace_back();
    return id;
  }
  int32_t find(int32_t node, const Key& key) const {
    const auto& children = nodes_[static_cast<size_t>(node)].children;
    auto it = children.find(key);
    return it == children.end() ? -1 : it->second;
  }
  bool has_children(int32_t node) const {
    return !nodes_[static_cast<size_t>(node)].children.empty();
  }
  // 1 + the n-gram's position in the pool, 0 for a prefix that is not itself in the pool.
  int64_t& gram(int32_t node) { return nodes_[static_cast<size_t>(node)].gram; }
  int64_t gram(int32_t node) const { return nodes_[static_cast<size_t>(node)].gram; }

 private:
  struct Node {
    std::unordered_map<Key, int32_t> children;
    int64_t gram = 0;
  };
  std::vector<Node> nodes_;
};

class TfIdfVectorizer final : public Kernel {
 public:
  explicit TfIdfVectorizer(const NodeInfo& info)
      : min_n_(info.attr_int("min_gram_length")),
        max_n_(info.attr_int("max_gram_length")),
        max_skip_(info.attr_int("max_skip_count")),
        indexes_(info.attr_ints("ngram_indexes")),
        weights_(info.attr_floats("weights")) {
    const std::string mode = info.attr_string("mode");
    if (mode == "TF") {
      mode_ = Mode::Tf;
    } else if (mode == "IDF") {
      mode_ = Mode::Idf;
    } else if (mode == "TFIDF") {
      mode_ = Mode::TfIdf;
    } else {
      info.fail("mode must be TF, IDF or TFIDF, got '" + mode + "'");
    }
    if (min_n_ < 1 || max_n_ < min_n_ || max_skip_ < 0 || max_skip_ > (1 << 20)) {
      info.fail("need 1 <= min_gram_length <= max_gram_length and max_skip_count >= 0");
    }
    const auto ints = info.attr_ints("pool_int64s");
    const auto strings = info.attr_strings("pool_strings");
    if (!ints.empty() && !strings.empty()) {
      info.fail("only one of pool_int64s and pool_strings may be given");
    }
    strings_ = !strings.empty();
    const int64_t pool = static_cast<int64_t>(strings_ ? strings.size() : ints.size());
    const auto counts = info.attr_ints("ngram_counts");
    int64_t output = 0;
    for (int64_t v : indexes_) {
      if (v < 0 || v >= (int64_t{1} << 31)) info.fail("ngram_indexes out of range");
      output = std::max(output, v + 1);
    }
    output_size_ = output;
    if (!weights_.empty() && static_cast<int64_t>(weights_.size()) < output_size_) {
      info.fail("weights must have one value per output column");
    }
    // The pool holds the n-grams of size k+1 from ngram_counts[k] on; every n-gram gets the
    // next id (whatever its size), only sizes in [min, max] are looked up.
    int64_t gram_id = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      const int64_t begin = counts[k];
      const int64_t end = k + 1 < counts.size() ? counts[k + 1] : pool;
      if (begin < 0 || end < begin || end > pool) info.fail("ngram_counts out of range");
      const int64_t n = static_cast<int64_t>(k) + 1;
      const int64_t grams = (end - begin) / n;
      if (gram_id + grams > static_cast<int64_t>(indexes_.size())) {
        info.fail("ngram_indexes has fewer entries than the pool has n-grams");
      }
      if (n >= min_n_ && n <= max_n_) {
        for (int64_t g = 0; g < grams; ++g) {
          int32_t node = 0;
          for (int64_t j = 0; j < n; ++j) {
            const size_t at = static_cast<size_t>(begin + g * n + j);
            node = strings_ ? str_trie_.child(node, strings[at]) : int_trie_.child(node, ints[at]);
          }
          (strings_ ? str_trie_.gram(node) : int_trie_.gram(node)) = gram_id + g + 1;
        }
      }
      gram_id += grams;
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() > 2) ctx.fail("input must be [C] or [B, C], got " + x.describe());
    const int64_t rows = x.rank() == 2 ? x.dim(0) : 1;
    const int64_t cols = x.rank() == 0 ? 1 : x.dim(x.rank() - 1);
    Tensor& y = ctx.output(0, DataType::Float,
                           x.rank() == 2 ? Shape{rows, output_size_} : Shape{output_size_});
    float* out = y.data<float>();
    std::fill_n(out, y.numel(), 0.0f);
    const bool empty_pool = !str_trie_.has_children(0) && !int_trie_.has_children(0);
    if (x.dtype() == DataType::String) {
      if (!strings_ && !empty_pool) ctx.fail("string input needs pool_strings");
      count_rows(str_trie_, x.data<const std::string>(), rows, cols, out);
    } else if (x.dtype() == DataType::Int64 || x.dtype() == DataType::Int32) {
      if (strings_) ctx.fail("integer input needs pool_int64s");
      const std::vector<int64_t> v = to_int64s(x);
      count_rows(int_trie_, v.data(), rows, cols, out);
    } else {
      throw_unsupported_type(x.dtype(), "input");
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* row = out + r * output_size_;
      for (int64_t i = 0; i < output_size_; ++i) {
        const float w = weights_.empty() ? 1.0f : weights_[static_cast<size_t>(i)];
        if (mode_ == Mode::Idf) {
          row[i] = row[i] > 0 ? w : 0.0f;
        } else if (mode_ == Mode::TfIdf) {
          row[i] *= w;
        }
      }
    }
  }

 private:
  template <typename Key>
  void count_rows(const Trie<Key>& trie, const Key* x, int64_t rows, int64_t cols,
                  float* out) const {
    parallel_for(rows, grain_for(cols * (max_skip_ + 1) * max_n_ * 8), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) count_row(trie, x + r * cols, cols, out + r * output_size_);
    });
  }

  template <typename Key>
  void count_row(const Trie<Key>& trie, const Key* x, int64_t cols, float* out) const {
    if (!trie.has_children(0)) return;
    for (int64_t skip = 1; skip <= max_skip_ + 1; ++skip) {
      // Unigrams do not depend on the skip distance: they are counted on the first pass.
      const int64_t first_n = skip == 1 ? min_n_ : std::max<int64_t>(min_n_, 2);
      if (first_n > max_n_) break;
      for (int64_t start = 0; start < cols; ++start) {
        if (start + skip * (first_n - 1) >= cols) break;
        int32_t node = 0;
        for (int64_t n = 1, item = start; n <= max_n_ && item < cols; ++n, item += skip) {
          node = trie.find(node, x[item]);
          if (node < 0) break;
          const int64_t g = trie.gram(node);
          if (n >= first_n && g != 0) out[indexes_[static_cast<size_t>(g - 1)]] += 1.0f;
        }
      }
    }
  }

  enum class Mode { Tf, Idf, TfIdf };
  Mode mode_ = Mode::Tf;
  int64_t min_n_, max_n_, max_skip_;
  std::vector<int64_t> indexes_;
  std::vector<float> weights_;
  bool strings_ = false;
  int64_t output_size_ = 0;
  Trie<int64_t> int_trie_;
  Trie<std::string> str_trie_;
};

// [B, largest ngram index + 1] for a [B, C] input, else one row.
void tfidf_shape(ShapeContext& c) {
  const size_t rank = c.shape(0).size();
  if (rank > 2) unknown("input must be [C] or [B, C]");
  int64_t output = 0;
  for (int64_t v : c.attr_ints("ngram_indexes")) {
    if (v < 0 || v >= (int64_t{1} << 31)) unknown("ngram_indexes out of range");
    output = std::max(output, v + 1);
  }
  c.set(0, DataType::Float, rank == 2 ? Shape{c.shape(0)[0], output} : Shape{output});
}

}  // namespace

KILN_REGISTER_OP({.op = "TfIdfVectorizer",
                  .since = 9,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "int32, int64, string input; float output",
                  .shape = tfidf_shape,
                  .create = make<TfIdfVectorizer>});

}  // namespace kiln::ops
