"""Small models whose run time is mostly the engine's fixed cost per node, built with the onnx
helper (no downloads, no weights files), for tools/bench/compare_ort.py (cases add-chain and
small-if).

    /path/to/venv/bin/python tools/export/make_small_models.py OUT_DIR

writes OUT_DIR/add_chain.onnx, OUT_DIR/if_chain.onnx and OUT_DIR/small_if.onnx:

- add_chain: x float32[1,1,16] through 1,000 Adds, each with its own random [1,1,16] constant
  (varying along the last axis, so no engine fuses the chain into one per-channel affine op).
- if_chain: x float32[1,16] through 200 Ifs on a flag input, each branch one Add or Sub of a
  [1,16] constant: the cost of dispatching an If and running a one-node branch.
- small_if: a voice-activity-like block repeated 4 times on x float32[1,16] and an LSTM state:
  MatMul + Add + Relu, then an If on the sign of the block's sum whose then-branch holds a
  second If on its mean (branches of 2-3 small ops each), then a one-step LSTM (hidden 16)
  whose hidden state feeds the next block; a MatMul + Softmax head at the end. 46 nodes in
  the main graph and 10 in each block's nested graphs (26 run per call); opset 17.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 16
OPSET = 17


def _const(rng, name, shape, scale=0.5):
    return numpy_helper.from_array((scale * rng.standard_normal(shape)).astype(np.float32), name)


def add_chain(length=1000, width=WIDTH):
    rng = np.random.default_rng(1000)
    nodes, inits = [], []
    prev = "x"
    for i in range(length):
        c = f"c{i}"
        inits.append(_const(rng, c, (1, 1, width), 0.01))
        out = "y" if i + 1 == length else f"t{i}"
        nodes.append(helper.make_node("Add", [prev, c], [out], name=f"add{i}"))
        prev = out
    graph = helper.make_graph(
        nodes, "add_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             producer_name="kiln make_small_models.py")


def if_chain(length=200, width=WIDTH):
    rng = np.random.default_rng(200)
    nodes, inits = [], []
    prev = "x"
    for i in range(length):
        c = f"c{i}"
        inits.append(_const(rng, c, (1, width), 0.01))
        out = "y" if i + 1 == length else f"t{i}"
        then_b = _branch(f"then{i}", [helper.make_node("Add", [prev, c], [f"a{i}"], name=f"add{i}")],
                         f"a{i}")
        else_b = _branch(f"else{i}", [helper.make_node("Sub", [prev, c], [f"s{i}"], name=f"sub{i}")],
                         f"s{i}")
        nodes.append(helper.make_node("If", ["flag"], [out], then_branch=then_b, else_branch=else_b,
                                      name=f"if{i}"))
        prev = out
    graph = helper.make_graph(
        nodes, "if_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width]),
                            helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             producer_name="kiln make_small_models.py")


def _branch(name, nodes, out):
    return helper.make_graph(nodes, name, [],
                             [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def small_if(blocks=4, width=WIDTH):
    rng = np.random.default_rng(17)
    nodes, inits = [], []
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    inits.append(numpy_helper.from_array(np.array(0.05, np.float32), "tenth"))
    inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    h = "h0"
    inits.append(numpy_helper.from_array(np.zeros((1, 1, width), np.float32), h))
    c_state = "c0"
    inits.append(numpy_helper.from_array(np.zeros((1, 1, width), np.float32), c_state))
    x = "x"
    for b in range(blocks):
        p = f"b{b}_"
        inits += [_const(rng, p + "w", (width, width), 0.3), _const(rng, p + "bias", (width,), 0.1),
                  _const(rng, p + "lstm_w", (1, 4 * width, width), 0.2),
                  _const(rng, p + "lstm_r", (1, 4 * width, width), 0.2),
                  _const(rng, p + "lstm_b", (1, 8 * width), 0.1)]
        nodes += [
            helper.make_node("Squeeze", [h, "axis0"], [p + "h2"], name=p + "squeeze_h"),
            helper.make_node("Add", [x, p + "h2"], [p + "in"], name=p + "mix"),
            helper.make_node("MatMul", [p + "in", p + "w"], [p + "mm"], name=p + "matmul"),
            helper.make_node("Add", [p + "mm", p + "bias"], [p + "lin"], name=p + "bias_add"),
            helper.make_node("Relu", [p + "lin"], [p + "a"], name=p + "relu"),
            helper.make_node("ReduceSum", [p + "a"], [p + "sum"], keepdims=0, name=p + "sum"),
            helper.make_node("Greater", [p + "sum", "tenth"], [p + "c1"], name=p + "gt1"),
        ]
        inner_then = _branch(p + "inner_then", [
            helper.make_node("Sigmoid", [p + "a"], [p + "sg"], name=p + "sigmoid"),
            helper.make_node("Mul", [p + "sg", p + "a"], [p + "it"], name=p + "silu")], p + "it")
        inner_else = _branch(p + "inner_else", [
            helper.make_node("Tanh", [p + "a"], [p + "th"], name=p + "tanh"),
            helper.make_node("Add", [p + "th", "half"], [p + "ie"], name=p + "tanh_add")], p + "ie")
        outer_then = _branch(p + "outer_then", [
            helper.make_node("ReduceMean", [p + "a"], [p + "mean"], keepdims=0, name=p + "mean"),
            helper.make_node("Greater", [p + "mean", "tenth"], [p + "c2"], name=p + "gt2"),
            helper.make_node("If", [p + "c2"], [p + "inner"], then_branch=inner_then,
                             else_branch=inner_else, name=p + "inner_if"),
            helper.make_node("Add", [p + "inner", p + "a"], [p + "ot"], name=p + "residual")],
            p + "ot")
        outer_else = _branch(p + "outer_else", [
            helper.make_node("Mul", [p + "a", "half"], [p + "scaled"], name=p + "scale"),
            helper.make_node("Sub", [p + "scaled", x], [p + "oe"], name=p + "sub")], p + "oe")
        nodes += [
            helper.make_node("If", [p + "c1"], [p + "sel"], then_branch=outer_then,
                             else_branch=outer_else, name=p + "outer_if"),
            helper.make_node("Unsqueeze", [p + "sel", "axis0"], [p + "seq"], name=p + "unsqueeze"),
            helper.make_node("LSTM", [p + "seq", p + "lstm_w", p + "lstm_r", p + "lstm_b", "",
                                      h, c_state],
                             [p + "y", p + "h", p + "c"], hidden_size=width, name=p + "lstm"),
            helper.make_node("Reshape", [p + "y", p + "shape"], [p + "out"], name=p + "reshape"),
        ]
        inits.append(numpy_helper.from_array(np.array([1, width], np.int64), p + "shape"))
        x, h, c_state = p + "out", p + "h", p + "c"
    inits += [_const(rng, "head_w", (width, 2), 0.5)]
    nodes += [helper.make_node("MatMul", [x, "head_w"], ["logits"], name="head"),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax")]
    graph = helper.make_graph(
        nodes, "small_if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             producer_name="kiln make_small_models.py")


def write(out_dir):
    """Writes both models into out_dir; returns {case: path}."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for case, make in (("add-chain", add_chain), ("if-chain", if_chain), ("small-if", small_if)):
        model = make()
        onnx.checker.check_model(model, full_check=True)
        path = os.path.join(out_dir, case.replace("-", "_") + ".onnx")
        onnx.save(model, path)
        paths[case] = path
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    for case, path in write(sys.argv[1]).items():
        print(f"{case}: {path}")
