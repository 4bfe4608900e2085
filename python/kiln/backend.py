"""The ONNX Python backend interface (onnx.backend.base), run by kiln, as onnxruntime.backend.

    import kiln.backend as backend
    rep = backend.prepare(model_proto)          # or a path, or serialized bytes
    outputs = rep.run([x])                      # inputs in the graph's order
    outputs = backend.run_node(node, [x, y])    # one node, in a model made for it

The ONNX project's own conformance harness runs against it:
``onnx.backend.test.BackendTest(kiln.backend, __name__)`` (see python/tests/test_backend.py).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from . import InferenceSession, SessionOptions

# The ai.onnx opset run_node's models import when not told otherwise: the installed onnx's
# newest, within what kiln implements.
_KILN_MAX_OPSET = 28


class KilnBackendRep(BackendRep):
    """A prepared model: a kiln session run with inputs in the graph's order."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> list:
        """``inputs``: a list in the graph's input order, a dict by name, or one array."""
        if isinstance(inputs, dict):
            feed = inputs
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            names = [i.name for i in self.session.get_inputs()]
            names += [i.name for i in self.session.get_overridable_initializers()]
            if len(inputs) > len(names):
                raise ValueError(f"{len(inputs)} inputs given, the model takes at most "
                                 f"{len(names)}: {names}")
            feed = dict(zip(names, inputs))
        return self.session.run(None, feed)


def _options(kwargs: dict[str, Any]) -> SessionOptions:
    """SessionOptions with the attributes named in kwargs (as onnxruntime.backend does)."""
    options = SessionOptions()
    for key, value in kwargs.items():
        if hasattr(options, key):
            setattr(options, key, value)
    return options


class KilnBackend(Backend):
    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> KilnBackendRep:
        """``model``: an onnx.ModelProto, a path, serialized bytes or an InferenceSession."""
        if not cls.supports_device(device):
            raise RuntimeError(f"kiln runs on the CPU, not on {device}")
        if isinstance(model, InferenceSession):
            return KilnBackendRep(model)
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        return KilnBackendRep(InferenceSession(model, _options(kwargs)))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> list:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple]] | None = None,
                 **kwargs: Any) -> list:
        """Runs one node on ``inputs`` (arrays in the node's input order) in a model made for
        it. ``outputs_info``: (dtype, shape) per output; by default ONNX's shape inference
        gives the output types. ``opset_version`` in kwargs picks the opset."""
        opset = kwargs.pop("opset_version", min(onnx.defs.onnx_opset_version(), _KILN_MAX_OPSET))
        arrays = [np.asarray(x) for x in inputs]
        graph_inputs = [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
            for name, x in zip(node.input, arrays) if name]
        if outputs_info is not None:
            graph_outputs = [
                helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(t)),
                                              shape)
                for name, (t, shape) in zip(node.output, outputs_info)]
        else:
            graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output]
        graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        if outputs_info is None:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
            declared = {v.name: v for v in inferred.graph.value_info}
            declared.update({v.name: v for v in inferred.graph.output if v.type.WhichOneof("value")})
            model.graph.ClearField("output")
            model.graph.output.extend(declared[name] for name in node.output if name)
        feed = {name: x for name, x in zip(node.input, arrays) if name}
        session = InferenceSession(model.SerializeToString(), _options(kwargs))
        return session.run(None, feed)


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
run_node = KilnBackend.run_node
supports_device = KilnBackend.supports_device
is_compatible = KilnBackend.is_compatible
