// Traditional ML ops of the ai.onnx.ml domain: LabelEncoder (opsets 2-4), TreeEnsemble
// (opset 5), Binarizer and ArrayFeatureExtractor.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

// Any float or integer tensor as doubles.
std::vector<double> tensor_doubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  const Tensor c = t.contiguous();
  dispatch(NumericTypes{}, c.dtype(), [&]<typename T>() {
    const T* p = c.data<const T>();
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
    }
  });
  return out;
}

// ---- LabelEncoder ----

using LabelTypes = TypeList<float, double, int64_t, int32_t, int16_t, std::string>;

enum class KeyKind { String, Int, Float };

KeyKind kind_of(DataType dt) {
  if (dt == DataType::String) return KeyKind::String;
  return is_float_type(dt) ? KeyKind::Float : KeyKind::Int;
}

class LabelEncoder final : public Kernel {
 public:
  explicit LabelEncoder(const NodeInfo& info) {
    const Tensor keys = pick(info, "keys", /*with_tensor=*/info.opset() >= 4);
    values_ = pick(info, "values", info.opset() >= 4);
    if (!type_in(LabelTypes{}, keys.dtype()) || !type_in(LabelTypes{}, values_.dtype())) {
      info.fail("keys and values must be string, int16, int32, int64, float or double",
                ErrorKind::Unsupported);
    }
    if (keys.numel() != values_.numel()) info.fail("keys and values differ in length");
    key_kind_ = kind_of(keys.dtype());
    const int64_t n = keys.numel();
    if (key_kind_ == KeyKind::String) {
      const std::string* k = keys.data<const std::string>();
      for (int64_t i = 0; i < n; ++i) string_keys_[k[i]] = i;
    } else if (key_kind_ == KeyKind::Int) {
      const std::vector<int64_t> k =
          to_int64s(keys.dtype() == DataType::Int16 ? widen(keys) : keys);
      for (int64_t i = 0; i < n; ++i) int_keys_[k[static_cast<size_t>(i)]] = i;
    } else {
      const std::vector<double> k = tensor_doubles(keys);
      for (int64_t i = 0; i < n; ++i) {
        const double v = k[static_cast<size_t>(i)];
        if (std::isnan(v)) {
          nan_index_ = i;  // NaN keys match NaN inputs
        } else {
          float_keys_[v] = i;
        }
      }
    }
    default_ = default_value(info);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (!type_in(LabelTypes{}, x.dtype()) || kind_of(x.dtype()) != key_kind_) {
      ctx.fail("input type " + std::string(data_type_name(x.dtype())) +
               " does not match the type of the keys");
    }
    const int64_t n = x.numel();
    std::vector<int64_t> index(static_cast<size_t>(n), -1);
    if (key_kind_ == KeyKind::String) {
      const std::string* p = x.data<const std::string>();
      for (int64_t i = 0; i < n; ++i) {
        auto it = string_keys_.find(p[i]);
        if (it != string_keys_.end()) index[static_cast<size_t>(i)] = it->second;
      }
    } else if (key_kind_ == KeyKind::Int) {
      const std::vector<int64_t> v = to_int64s(x.dtype() == DataType::Int16 ? widen(x) : x);
      for (int64_t i = 0; i < n; ++i) {
        auto it = int_keys_.find(v[static_cast<size_t>(i)]);
        if (it != int_keys_.end()) index[static_cast<size_t>(i)] = it->second;
      }
    } else {
      const std::vector<double> v = tensor_doubles(x);
      for (int64_t i = 0; i < n; ++i) {
        const double d = v[static_cast<size_t>(i)];
        if (std::isnan(d)) {
          index[static_cast<size_t>(i)] = nan_index_;
          continue;
        }
        auto it = float_keys_.find(d);
        if (it != float_keys_.end()) index[static_cast<size_t>(i)] = it->second;
      }
    }
    Tensor& y = ctx.output(0, values_.dtype(), x.shape());
    dispatch(LabelTypes{}, values_.dtype(), [&]<typename T>() {
      const T* vals = values_.data<const T>();
      const T& def = default_.data<const T>()[0];
      T* out = y.data<T>();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = index[static_cast<size_t>(i)];
        out[i] = k >= 0 ? vals[k] : def;
      }
    });
  }

 private:
  static Tensor widen(const Tensor& t) {
    const std::vector<double> d = tensor_doubles(t);
    return Tensor::from_vector<int64_t>(t.shape(), std::vector<int64_t>(d.begin(), d.end()));
  }

  // keys_* / values_*: one of the typed lists, or (opset 4) a tensor.
  static Tensor pick(const NodeInfo& info, const std::string& what, bool with_tensor) {
    std::vector<Tensor> found;
    if (with_tensor) {
      if (const Tensor* t = info.attr_tensor(what + "_tensor")) found.push_back(t->contiguous());
    }
    if (info.has_attr(what + "_strings")) {
      auto v = info.attr_strings(what + "_strings");
      found.push_back(Tensor::from_vector<std::string>({static_cast<int64_t>(v.size())}, v));
    }
    if (info.has_attr(what + "_int64s")) {
      auto v = info.attr_ints(what + "_int64s");
      found.push_back(Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v));
    }
    if (info.has_attr(what + "_floats")) {
      auto v = info.attr_floats(what + "_floats");
      found.push_back(Tensor::from_vector<float>({static_cast<int64_t>(v.size())}, v));
    }
    if (found.size() != 1) info.fail("exactly one " + what + "_* attribute must be given");
    return found[0];
  }

  Tensor default_value(const NodeInfo& info) const {
    const DataType dt = values_.dtype();
    if (info.opset() >= 4) {
      if (const Tensor* t = info.attr_tensor("default_tensor")) {
        if (t->dtype() != dt || t->numel() != 1) {
          info.fail("default_tensor must hold one value of the values' type");
        }
        return t->contiguous();
      }
    }
    Tensor d = Tensor::zeros(dt, {1});
    dispatch(LabelTypes{}, dt, [&]<typename T>() {
      T* p = d.data<T>();
      if constexpr (std::is_same_v<T, std::string>) {
        p[0] = info.attr_string("default_string", "_Unused");
      } else if constexpr (std::is_integral_v<T>) {
        p[0] = static_cast<T>(info.attr_int("default_int64", -1));
      } else {
        p[0] = static_cast<T>(info.attr_float("default_float", -0.0f));
      }
    });
    return d;
  }

  KeyKind key_kind_ = KeyKind::String;
  std::unordered_map<std::string, int64_t> string_keys_;
  std::unordered_map<int64_t, int64_t> int_keys_;
  std::unordered_map<double, int64_t> float_keys_;
  int64_t nan_index_ = -1;
  Tensor values_, default_;
};

// ---- TreeEnsemble ----

enum class Mode : uint8_t { Leq, Lt, Gte, Gt, Eq, Neq, Member };

struct TreeNode {
  Mode mode;
  bool missing_true;
  bool true_leaf, false_leaf;
  int64_t feature;
  int64_t true_id, false_id;
  double split;
  int64_t set = -1;  // index into member sets for Mode::Member
};

// Inverse error function: Giles' single-precision approximation refined by two Newton steps.
double erfinv(double x) {
  if (x <= -1) return -std::numeric_limits<double>::infinity();
  if (x >= 1) return std::numeric_limits<double>::infinity();
  double w = -std::log((1.0 - x) * (1.0 + x)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                     -0.00417768164, 0.246640727, 1.50140941}) {
      p = c + p * w;
    }
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                     0.00943887047, 1.00167406, 2.83297682}) {
      p = c + p * w;
    }
  }
  double y = p * x;
  for (int i = 0; i < 2; ++i) {
    y -= (std::erf(y) - x) / (2.0 / std::sqrt(std::numbers::pi) * std::exp(-y * y));
  }
  return y;
}

class TreeEnsemble final : public Kernel {
 public:
  explicit TreeEnsemble(const NodeInfo& info)
      : aggregate_(info.attr_int("aggregate_function", 1)),
        post_(info.attr_int("post_transform", 0)),
        targets_(info.attr_int("n_targets")),
        roots_(info.attr_ints("tree_roots")),
        leaf_targets_(info.attr_ints("leaf_targetids")) {
    if (aggregate_ < 0 || aggregate_ > 3) info.fail("aggregate_function must be in [0, 3]");
    if (post_ < 0 || post_ > 4) info.fail("post_transform must be in [0, 4]");
    if (targets_ < 1 || targets_ > (int64_t{1} << 24)) info.fail("n_targets must be positive");
    const Tensor* weights = info.attr_tensor("leaf_weights");
    const Tensor* splits = info.attr_tensor("nodes_splits");
    const Tensor* modes = info.attr_tensor("nodes_modes");
    if (!weights || !splits || !modes) {
      info.fail("leaf_weights, nodes_splits and nodes_modes are required");
    }
    leaf_weights_ = tensor_doubles(*weights);
    const std::vector<double> split = tensor_doubles(*splits);
    const std::vector<double> mode = tensor_doubles(*modes);
    const auto features = info.attr_ints("nodes_featureids");
    const auto true_ids = info.attr_ints("nodes_truenodeids");
    const auto false_ids = info.attr_ints("nodes_falsenodeids");
    const auto true_leafs = info.attr_ints("nodes_trueleafs");
    const auto false_leafs = info.attr_ints("nodes_falseleafs");
    const auto missing = info.attr_ints("nodes_missing_value_tracks_true");
    const size_t n = features.size();
    if (split.size() != n || mode.size() != n || true_ids.size() != n || false_ids.size() != n ||
        true_leafs.size() != n || false_leafs.size() != n ||
        (!missing.empty() && missing.size() != n)) {
      info.fail("the nodes_* attributes differ in length");
    }
    if (leaf_targets_.size() != leaf_weights_.size()) {
      info.fail("leaf_targetids and leaf_weights differ in length");
    }
    for (int64_t t : leaf_targets_) {
      if (t < 0 || t >= targets_) info.fail("leaf_targetids out of range");
    }
    std::vector<double> members;
    if (const Tensor* m = info.attr_tensor("membership_values")) members = tensor_doubles(*m);
    size_t member_pos = 0;
    nodes_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      TreeNode& node = nodes_[i];
      if (!(mode[i] >= 0 && mode[i] <= 6)) info.fail("nodes_modes out of range");
      node.mode = static_cast<Mode>(static_cast<int>(mode[i]));
      node.missing_true = !missing.empty() && missing[i] != 0;
      node.true_leaf = true_leafs[i] != 0;
      node.false_leaf = false_leafs[i] != 0;
      node.feature = features[i];
      node.true_id = true_ids[i];
      node.false_id = false_ids[i];
      node.split = split[i];
      if (node.feature < 0) info.fail("nodes_featureids must not be negative");
      max_feature_ = std::max(max_feature_, node.feature);
      for (auto [id, leaf] :
           {std::pair{node.true_id, node.true_leaf}, {node.false_id, node.false_leaf}}) {
        const size_t limit = leaf ? leaf_weights_.size() : n;
        if (id < 0 || static_cast<size_t>(id) >= limit) info.fail("node or leaf id out of range");
      }
      if (node.mode == Mode::Member) {
        // Sets follow the order of the member nodes, each ended by a NaN (or the end).
        if (member_pos >= members.size()) info.fail("membership_values has too few sets");
        std::vector<double> set;
        while (member_pos < members.size() && !std::isnan(members[member_pos])) {
          set.push_back(members[member_pos++]);
        }
        ++member_pos;
        std::sort(set.begin(), set.end());
        node.set = static_cast<int64_t>(sets_.size());
        sets_.push_back(std::move(set));
      }
    }
    for (int64_t r : roots_) {
      if (r < 0 || static_cast<size_t>(r) >= n) info.fail("tree_roots out of range");
    }
    check_acyclic(info);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() != 2) ctx.fail("X must be [N, features], got " + x.describe());
    if (!nodes_.empty() && max_feature_ >= x.dim(1)) {
      ctx.fail("a node reads feature " + std::to_string(max_feature_) + " of " + x.describe());
    }
    if (!type_in(FloatTypes{}, x.dtype())) throw_unsupported_type(x.dtype(), "X");
    const int64_t rows = x.dim(0), features = x.dim(1);
    const std::vector<double> xv = tensor_doubles(x);
    std::vector<double> out(static_cast<size_t>(rows * targets_));
    // MIN and MAX start from the output type's extremes (what an unreached target keeps).
    const double extreme = x.dtype() == DataType::Double
                               ? std::numeric_limits<double>::max()
                               : static_cast<double>(std::numeric_limits<float>::max());
    const double init = aggregate_ == 2 ? extreme : aggregate_ == 3 ? -extreme : 0.0;
    parallel_for(rows, grain_for(static_cast<int64_t>(roots_.size()) * 32 + targets_),
                 [&](int64_t b, int64_t e) {
                   for (int64_t r = b; r < e; ++r) {
                     double* o = out.data() + r * targets_;
                     std::fill_n(o, targets_, init);
                     for (int64_t root : roots_) {
                       const int64_t leaf = walk(root, xv.data() + r * features);
                       double& acc = o[leaf_targets_[static_cast<size_t>(leaf)]];
                       const double w = leaf_weights_[static_cast<size_t>(leaf)];
                       acc = aggregate_ == 2   ? std::min(acc, w)
                             : aggregate_ == 3 ? std::max(acc, w)
                                               : acc + w;
                     }
                     if (aggregate_ == 0 && !roots_.empty()) {
                       for (int64_t t = 0; t < targets_; ++t)
                         o[t] /= static_cast<double>(roots_.size());
                     }
                     post_transform(o);
                   }
                 });
    Tensor& y = ctx.output(0, x.dtype(), {rows, targets_});
    dispatch(FloatTypes{}, x.dtype(), [&]<typename T>() {
      T* p = y.data<T>();
      for (size_t i = 0; i < out.size(); ++i)
        p[i] = from_compute<T>(static_cast<compute_t<T>>(out[i]));
    });
  }

 private:
  bool goes_true(const TreeNode& node, double v) const {
    if (std::isnan(v) && node.missing_true) return true;
    switch (node.mode) {
      case Mode::Leq:
        return v <= node.split;
      case Mode::Lt:
        return v < node.split;
      case Mode::Gte:
        return v >= node.split;
      case Mode::Gt:
        return v > node.split;
      case Mode::Eq:
        return v == node.split;
      case Mode::Neq:
        return v != node.split;
      case Mode::Member: {
        const auto& s = sets_[static_cast<size_t>(node.set)];
        return std::binary_search(s.begin(), s.end(), v);
      }
    }
    return false;
  }

  // The leaf a row reaches from `node` (the trees were checked to be acyclic).
  int64_t walk(int64_t node, const double* row) const {
    for (;;) {
      const TreeNode& nd = nodes_[static_cast<size_t>(node)];
      const bool t = goes_true(nd, row[nd.feature]);
      const int64_t next = t ? nd.true_id : nd.false_id;
      if (t ? nd.true_leaf : nd.false_leaf) return next;
      node = next;
    }
  }

  void check_acyclic(const NodeInfo& info) const {
    std::vector<uint8_t> state(nodes_.size(), 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<int64_t, int>> stack;
    for (int64_t root : roots_) {
      if (state[static_cast<size_t>(root)] == 2) continue;
      stack.push_back({root, 0});
      state[static_cast<size_t>(root)] = 1;
      while (!stack.empty()) {
        auto& [id, branch] = stack.back();
        const TreeNode& nd = nodes_[static_cast<size_t>(id)];
        if (branch == 2) {
          state[static_cast<size_t>(id)] = 2;
          stack.pop_back();
          continue;
        }
        const bool leaf = branch == 0 ? nd.true_leaf : nd.false_leaf;
        const int64_t next = branch == 0 ? nd.true_id : nd.false_id;
        ++branch;
        if (leaf) continue;
        if (state[static_cast<size_t>(next)] == 1) info.fail("the trees contain a cycle");
        if (state[static_cast<size_t>(next)] == 0) {
          state[static_cast<size_t>(next)] = 1;
          stack.push_back({next, 0});
        }
      }
    }
  }

  void post_transform(double* o) const {
    switch (post_) {
      case 1:
      case 3: {  // softmax; SOFTMAX_ZERO leaves zero scores at zero
        double mx = std::numeric_limits<double>::lowest(), sum = 0;
        for (int64_t t = 0; t < targets_; ++t) {
          if (post_ == 1 || o[t] != 0) mx = std::max(mx, o[t]);
        }
        for (int64_t t = 0; t < targets_; ++t) {
          o[t] = (post_ == 3 && o[t] == 0) ? 0 : std::exp(o[t] - mx);
          sum += o[t];
        }
        if (sum > 0) {
          for (int64_t t = 0; t < targets_; ++t) o[t] /= sum;
        }
        break;
      }
      case 2:
        for (int64_t t = 0; t < targets_; ++t) o[t] = 1.0 / (1.0 + std::exp(-o[t]));
        break;
      case 4:
        for (int64_t t = 0; t < targets_; ++t) o[t] = std::sqrt(2.0) * erfinv(2 * o[t] - 1);
        break;
      default:
        break;
    }
  }

  int64_t aggregate_, post_, targets_;
  std::vector<int64_t> roots_, leaf_targets_;
  std::vector<double> leaf_weights_;
  std::vector<TreeNode> nodes_;
  std::vector<std::vector<double>> sets_;
  int64_t max_feature_ = -1;
};

// ---- Binarizer ----

class Binarizer final : public Kernel {
 public:
  explicit Binarizer(const NodeInfo& info) : threshold_(info.attr_float("threshold", 0.0f)) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output_reusing(0, 0, x.dtype(), x.shape());
    dispatch(TypeList<float, double, int64_t, int32_t>{}, x.dtype(), [&]<typename T>() {
      const double th = threshold_;
      unary_loop<T, T>(x, y, [th](T v) { return static_cast<double>(v) > th ? T(1) : T(0); });
    });
  }

 private:
  float threshold_;
};

// ---- ArrayFeatureExtractor ----

class ArrayFeatureExtractor final : public Kernel {
 public:
  explicit ArrayFeatureExtractor(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& idx_t = ctx.input(1);
    if (x.rank() < 1) ctx.fail("X must have at least one dimension");
    if (idx_t.dtype() != DataType::Int64) ctx.fail("Y must be int64, got " + idx_t.describe());
    const std::vector<int64_t> idx = to_int64s(idx_t);
    const int64_t f = x.dim(x.rank() - 1);
    for (int64_t i : idx) {
      if (i < 0 || i >= f) {
        ctx.fail("index " + std::to_string(i) + " out of range for " + std::to_string(f) +
                 " features");
      }
    }
    const int64_t k = static_cast<int64_t>(idx.size());
    Shape shape = x.rank() == 1 ? Shape{1, k} : x.shape();
    shape.back() = k;
    Tensor& y = ctx.output(0, x.dtype(), shape);
    const int64_t rows = f == 0 ? 0 : x.numel() / f;
    dispatch(TypeList<float, double, int64_t, int32_t, std::string>{}, x.dtype(),
             [&]<typename T>() {
               const T* in = x.data<const T>();
               T* out = y.data<T>();
               for (int64_t r = 0; r < rows; ++r) {
                 for (int64_t j = 0; j < k; ++j)
                   out[r * k + j] = in[r * f + idx[static_cast<size_t>(j)]];
               }
             });
    ctx.count_copy(y.nbytes());
  }
};

// ---- Shape rules ----

// The type of LabelEncoder's one values_* attribute (see LabelEncoder::pick).
DataType picked_type(const ShapeContext& c, const std::string& what) {
  std::vector<DataType> found;
  const ir::Attribute* t = c.opset() >= 4 ? c.node().attr(what + "_tensor") : nullptr;
  if (t) found.push_back(t->t.dtype());
  if (c.has_attr((what + "_strings").c_str())) found.push_back(DataType::String);
  if (c.has_attr((what + "_int64s").c_str())) found.push_back(DataType::Int64);
  if (c.has_attr((what + "_floats").c_str())) found.push_back(DataType::Float);
  if (found.size() != 1) unknown("exactly one " + what + "_* attribute must be given");
  return found[0];
}

// Each input element mapped to a value: the input's shape, the values' type.
void label_encoder_shape(ShapeContext& c) {
  const DataType keys = picked_type(c, "keys"), values = picked_type(c, "values");
  if (!type_in(LabelTypes{}, keys) || !type_in(LabelTypes{}, values) ||
      !type_in(LabelTypes{}, c.dtype(0)) || kind_of(c.dtype(0)) != kind_of(keys)) {
    unknown("types LabelEncoder does not take");
  }
  c.set(0, values, c.shape(0));
}

// [N, n_targets].
void tree_ensemble_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const int64_t targets = c.attr_int("n_targets", 0);
  int64_t max_feature = -1;
  for (int64_t f : c.attr_ints("nodes_featureids")) max_feature = std::max(max_feature, f);
  if (x.size() != 2 || max_feature >= x[1] || targets < 1) unknown("X does not fit the trees");
  c.set(0, c.dtype(0), {x[0], targets});
}

// X with its last dimension replaced by the selected features (a vector becomes one row).
void array_feature_extractor_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  const std::vector<int64_t>& idx = c.data(1);
  if (x.empty() || c.dtype(1) != DataType::Int64) unknown("X or Y does not fit");
  for (int64_t i : idx) {
    if (i < 0 || i >= x.back()) unknown("index out of range");
  }
  const auto k = static_cast<int64_t>(idx.size());
  Shape shape = x.size() == 1 ? Shape{1, k} : x;
  shape.back() = k;
  c.set(0, c.dtype(0), shape);
}

}  // namespace

KILN_REGISTER_OP({.domain = "ai.onnx.ml",
                  .op = "LabelEncoder",
                  .since = 2,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "string, int16, int32, int64, float, double",
                  .shape = label_encoder_shape,
                  .create = make<LabelEncoder>});
KILN_REGISTER_OP({.domain = "ai.onnx.ml",
                  .op = "TreeEnsemble",
                  .since = 5,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, float16",
                  .shape = tree_ensemble_shape,
                  .create = make<TreeEnsemble>});
KILN_REGISTER_OP({.domain = "ai.onnx.ml",
                  .op = "Binarizer",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "float, double, int64, int32",
                  .shape = same_shape,
                  .create = make<Binarizer>});
KILN_REGISTER_OP({.domain = "ai.onnx.ml",
                  .op = "ArrayFeatureExtractor",
                  .since = 1,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float, double, int64, int32, string",
                  .shape = array_feature_extractor_shape,
                  .create = make<ArrayFeatureExtractor>});

}  // namespace kiln::ops
