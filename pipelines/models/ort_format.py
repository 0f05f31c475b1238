"""ONNX Runtime's own model format (``.ort``, a flatbuffer) read back into an ONNX ``ModelProto``.

Moonshine's publisher ships its English weights only as ``.ort`` files (inside ``moonshine-cpp``),
and an ``.ort`` file is loaded as it was saved: ONNX Runtime does not optimise it again. Those files
keep each int8 weight as ``Cast`` -> ``Mul`` (its scale) ahead of its ``MatMul``, so every decoder
step turns 41 MB of int8 back into floats (about 85 of its 100 ms a token on two cores). Read back
into ONNX, the model is an ordinary graph: ``fold_constants`` does that arithmetic once, and the
runtime then optimises the graph like any other.

The flatbuffer's Python bindings come with the ``onnxruntime`` wheel itself
(``onnxruntime.tools.ort_format_model``); the schema's enums (tensor types, attribute types) use
ONNX's numbering, so values pass across unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _fbs() -> Any:
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py import fbs

    return fbs


def _text(b: bytes | None) -> str:
    return b.decode() if b else ""


def _tensor(t: Any) -> Any:
    from onnx import TensorProto

    p = TensorProto()
    p.name = _text(t.Name())
    p.data_type = t.DataType()
    if not t.DimsIsNone():
        p.dims.extend(int(d) for d in t.DimsAsNumpy())
    if not t.RawDataIsNone():
        p.raw_data = t.RawDataAsNumpy().tobytes()
    elif t.ExternalDataOffset() > 0:  # (ORT 1.19+ may keep large tensors outside the table; these files do not)
        raise ValueError(f"tensor {p.name!r} keeps its data outside the flatbuffer: not supported")
    for i in range(t.StringDataLength()):
        p.string_data.append(t.StringData(i))
    return p


def _value_info(name: str, types: dict[str, Any]) -> Any:
    import onnx

    fbs = _fbs()
    info = onnx.ValueInfoProto()
    info.name = name
    type_info = types.get(name)
    if type_info is None or type_info.ValueType() != fbs.TypeInfoValue.TypeInfoValue.tensor_type:
        return info
    table = type_info.Value()
    tensor_type = fbs.TensorTypeAndShape.TensorTypeAndShape()
    tensor_type.Init(table.Bytes, table.Pos)
    info.type.tensor_type.elem_type = tensor_type.ElemType()
    shape = tensor_type.Shape()
    if shape is not None:
        out = info.type.tensor_type.shape
        out.SetInParent()
        for i in range(shape.DimLength()):
            value, dim = shape.Dim(i).Value(), out.dim.add()
            if value is None:
                continue
            if value.DimType() == fbs.DimensionValueType.DimensionValueType.VALUE:
                dim.dim_value = value.DimValue()
            elif value.DimParam():
                dim.dim_param = _text(value.DimParam())
    return info


def _attribute(a: Any) -> Any:
    from onnx import AttributeProto, helper

    kind, name = a.Type(), _text(a.Name())
    if kind == AttributeProto.FLOAT:
        return helper.make_attribute(name, a.F())
    if kind == AttributeProto.INT:
        return helper.make_attribute(name, a.I())
    if kind == AttributeProto.STRING:
        return helper.make_attribute(name, a.S())
    if kind == AttributeProto.TENSOR:
        return helper.make_attribute(name, _tensor(a.T()))
    if kind == AttributeProto.GRAPH:
        return helper.make_attribute(name, _graph(a.G(), name))
    if kind == AttributeProto.FLOATS:
        return helper.make_attribute(name, [float(x) for x in a.FloatsAsNumpy()] if a.FloatsLength() else [], attr_type=AttributeProto.FLOATS)
    if kind == AttributeProto.INTS:
        return helper.make_attribute(name, [int(x) for x in a.IntsAsNumpy()] if a.IntsLength() else [], attr_type=AttributeProto.INTS)
    if kind == AttributeProto.STRINGS:
        return helper.make_attribute(name, [a.Strings(i) for i in range(a.StringsLength())], attr_type=AttributeProto.STRINGS)
    raise ValueError(f"attribute {name!r} of type {kind}: not supported")


def _graph(g: Any, name: str) -> Any:
    import onnx

    types = {_text(g.NodeArgs(i).Name()): g.NodeArgs(i).Type() for i in range(g.NodeArgsLength())}
    out = onnx.GraphProto()
    out.name = name
    out.initializer.extend(_tensor(g.Initializers(i)) for i in range(g.InitializersLength()))
    constants = {t.name for t in out.initializer}
    out.input.extend(_value_info(n, types) for n in (_text(g.Inputs(i)) for i in range(g.InputsLength())) if n not in constants)
    out.output.extend(_value_info(_text(g.Outputs(i)), types) for i in range(g.OutputsLength()))
    for node in sorted((g.Nodes(i) for i in range(g.NodesLength())), key=lambda n: n.Index()):
        p = out.node.add()
        p.op_type, p.domain, p.name = _text(node.OpType()), _text(node.Domain()), _text(node.Name())
        p.input.extend(_text(node.Inputs(i)) for i in range(node.InputsLength()))
        p.output.extend(_text(node.Outputs(i)) for i in range(node.OutputsLength()))
        p.attribute.extend(_attribute(node.Attributes(i)) for i in range(node.AttributesLength()))
    return out


def read(path: Path) -> Any:
    """An ``.ort`` file as an ONNX ``ModelProto`` (the same graph, nodes, weights and opsets)."""
    from onnx import helper

    fbs = _fbs()
    buffer = bytearray(path.read_bytes())
    if not fbs.InferenceSession.InferenceSession.InferenceSessionBufferHasIdentifier(buffer, 0):
        raise ValueError(f"{path} is not an ORT format model")
    model = fbs.InferenceSession.InferenceSession.GetRootAsInferenceSession(buffer, 0).Model()
    opsets = [helper.make_opsetid(_text(model.OpsetImport(i).Domain()), model.OpsetImport(i).Version()) for i in range(model.OpsetImportLength())]
    return helper.make_model(_graph(model.Graph(), "main"), opset_imports=opsets, ir_version=model.IrVersion(), producer_name="realtime-omni")


# the arithmetic that turns a stored int8 weight back into floats
_FOLDABLE: dict[str, Callable[..., Any]] = {
    "Cast": lambda x, to: x.astype(to),
    "Mul": np.multiply,
    "Add": np.add,
    "Sub": np.subtract,
    "Div": np.divide,
}


def fold_constants(model: Any) -> int:
    """Compute, once, every top-level ``Cast``/``Mul``/``Add``/``Sub``/``Div`` whose inputs are all
    weights, and keep the results as weights; drop the weights nothing reads any more. Returns the
    number of nodes folded."""
    from onnx import helper, numpy_helper

    graph = model.graph
    values = {t.name: t for t in graph.initializer}
    arrays: dict[str, np.ndarray] = {}
    kept, folded = [], 0
    for node in graph.node:
        op = _FOLDABLE.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if op is None or not node.input or not all(i in values for i in node.input) or len(node.output) != 1:
            kept.append(node)
            continue
        args = [arrays.get(i) if i in arrays else numpy_helper.to_array(values[i]) for i in node.input]
        if node.op_type == "Cast":
            to = helper.tensor_dtype_to_np_dtype(next(a.i for a in node.attribute if a.name == "to"))
            result = np.asarray(op(args[0], to))
        else:
            result = np.asarray(op(*args)).astype(np.result_type(*args))
        name = node.output[0]
        arrays[name] = result
        values[name] = numpy_helper.from_array(result, name)
        folded += 1
    used = _names_read(kept) | {o.name for o in graph.output}
    del graph.node[:]
    graph.node.extend(kept)
    weights = [values[n] for n in values if n in used]
    del graph.initializer[:]
    graph.initializer.extend(weights)
    return folded


def _names_read(nodes: Any) -> set[str]:
    """Every value name the nodes read, their subgraphs' nodes included (outer-scope references)."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for a in node.attribute:
            if a.HasField("g"):
                names |= _names_read(a.g.node)
            for g in a.graphs:
                names |= _names_read(g.node)
    return names


def split_if(model: Any) -> tuple[Any, Any]:
    """A model whose top level is a single ``If`` on a boolean input (HF Optimum's merged decoder:
    ``use_cache_branch``) as two models: the ``else`` branch's and the ``then`` branch's, each with
    the inputs and weights it reads and the ``If``'s outputs. Each is then optimised as a whole, and
    a step pays for no branch it does not take."""
    import onnx
    from onnx import helper

    graph = model.graph
    (node,) = [n for n in graph.node if n.op_type == "If"]
    if len(graph.node) != 1:
        raise ValueError("more than one node besides the If at the top level: fold the weights first")
    branches = {a.name: a.g for a in node.attribute}
    weights = {t.name: t for t in graph.initializer}
    inputs = {i.name: i for i in graph.input}
    outputs = {o.name: o for o in graph.output}
    made = []
    for branch in ("else_branch", "then_branch"):
        g = branches[branch]
        read = _names_read(g.node)
        produced = {o for n in g.node for o in n.output} | {t.name for t in g.initializer}
        outer = read - produced - {""}
        missing = outer - weights.keys() - inputs.keys()
        if missing:
            raise ValueError(f"{branch} reads values from nowhere: {sorted(missing)[:5]}")
        part = onnx.GraphProto()
        part.name = branch
        part.node.extend(g.node)
        part.initializer.extend(g.initializer)
        part.initializer.extend(weights[n] for n in sorted(outer & weights.keys()))
        part.input.extend(inputs[i.name] for i in graph.input if i.name in outer)
        for inner, name in zip(g.output, node.output):
            if inner.name != name:
                part.node.append(helper.make_node("Identity", [inner.name], [name]))
            part.output.append(outputs[name])
        made.append(helper.make_model(part, opset_imports=model.opset_import, ir_version=model.ir_version, producer_name="realtime-omni"))
    return made[0], made[1]
