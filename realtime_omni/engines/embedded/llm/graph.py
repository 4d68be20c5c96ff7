"""A llama decoder as an ONNX graph for ONNX Runtime, built from a GGUF file without torch.

One graph serves prefill and decode: it takes the new token ids and every layer's cached keys
and values, and returns the next-token logits (last position only) and the grown caches. The
caller keeps the caches, so a session's context survives between turns and a prompt that shares
a prefix with the previous one only computes the rest.

Linear layers are ``MatMulNBits`` (com.microsoft) on the file's own quantized blocks; the rest
is standard ONNX. Rotary embedding pairs adjacent dimensions, as llama.cpp does on GGUF weights
(its converter permutes the query/key rows for that).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .gguf_weights import BlockQuantized, GgufLlama
from .shape import past_name, present_name

OPSET = 17
MS_DOMAIN = "com.microsoft"
class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, outputs: int = 1,
           domain: str = "", **attrs) -> str | list[str]:
        names = [self.name(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, domain=domain or None, **attrs))
        return names[0] if outputs == 1 else names

    def linear(self, x: str, w: BlockQuantized, hint: str) -> str:
        packed = self.const(w.packed, hint + ".qweight")
        scales = self.const(w.scales, hint + ".scales")
        zeros = self.const(w.zero_points, hint + ".zeros")
        return self.op("MatMulNBits", [x, packed, scales, zeros], hint, domain=MS_DOMAIN,
                       K=w.k, N=w.n, bits=w.bits, block_size=32, accuracy_level=4)

    def rms_norm(self, x: str, weight: np.ndarray, eps: float, hint: str) -> str:
        return self.op("SimplifiedLayerNormalization", [x, self.const(weight, hint + ".w")], hint,
                       axis=-1, epsilon=eps, stash_type=1)


def build_graph(model: GgufLlama, max_positions: int) -> onnx.ModelProto:
    s = model.shape
    d = s.head_dim
    group = s.heads // s.kv_heads
    b = _Builder()

    ids = "input_ids"  # int64 [1, S]
    # positions P … P+S−1, P = cached length (layer 0's cache stands for all)
    past_len = b.op("Gather", [b.op("Shape", [past_name(0, "key")]), b.const(np.array(2, np.int64))])
    seq_len = b.op("Gather", [b.op("Shape", [ids]), b.const(np.array(1, np.int64))])
    total = b.op("Add", [past_len, seq_len])
    one = b.const(np.array(1, np.int64))
    positions = b.op("Range", [past_len, total, one])  # [S]
    # causal mask [S, T]: query i sees keys j ≤ P + i
    cols = b.op("Unsqueeze", [b.op("Range", [b.const(np.array(0, np.int64)), total, one]), b.const(np.array([0]))])
    rows = b.op("Unsqueeze", [positions, b.const(np.array([1]))])
    mask = b.op("Where", [b.op("Greater", [cols, rows]), b.const(np.array(-1e9, np.float32)),
                          b.const(np.array(0.0, np.float32))])

    # rotary tables for adjacent pairs: [positions, d/2] gathered to [S, d/2, 1]
    inv_freq = s.rope_base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)
    unsq_last = b.const(np.array([-1]))
    cos = b.op("Unsqueeze", [b.op("Gather", [b.const(np.cos(angles).astype(np.float32), "cos"), positions]), unsq_last])
    sin = b.op("Unsqueeze", [b.op("Gather", [b.const(np.sin(angles).astype(np.float32), "sin"), positions]), unsq_last])

    def rotate(x: str, heads: int) -> str:  # x: [1, heads, S, d]
        pairs = b.op("Reshape", [x, b.const(np.array([1, heads, -1, d // 2, 2], np.int64))])
        x0, x1 = b.op("Split", [pairs], outputs=2, axis=-1)
        r0 = b.op("Sub", [b.op("Mul", [x0, cos]), b.op("Mul", [x1, sin])])
        r1 = b.op("Add", [b.op("Mul", [x0, sin]), b.op("Mul", [x1, cos])])
        return b.op("Reshape", [b.op("Concat", [r0, r1], axis=-1), b.const(np.array([1, heads, -1, d], np.int64))])

    def heads_first(x: str, heads: int) -> str:  # [1, S, heads·d] → [1, heads, S, d]
        split = b.op("Reshape", [x, b.const(np.array([1, -1, heads, d], np.int64))])
        return b.op("Transpose", [split], perm=[0, 2, 1, 3])

    # token embeddings: Q8_0 in the file, float16 here (a gather reads one row per token)
    table = model.dense("token_embd.weight")
    h = b.op("Cast", [b.op("Gather", [b.const(table.astype(np.float16), "embed"), ids])], to=TensorProto.FLOAT)

    inputs = [helper.make_tensor_value_info(ids, TensorProto.INT64, [1, "S"])]
    outputs = []
    scale = b.const(np.array(1.0 / np.sqrt(d), np.float32))
    for i in range(s.layers):
        p = f"blk.{i}."
        x = b.rms_norm(h, model.vector(p + "attn_norm.weight"), s.rms_eps, p + "attn_norm")
        q = rotate(heads_first(b.linear(x, model.block_quantized(p + "attn_q.weight"), p + "q"), s.heads), s.heads)
        k = rotate(heads_first(b.linear(x, model.block_quantized(p + "attn_k.weight"), p + "k"), s.kv_heads), s.kv_heads)
        v = heads_first(b.linear(x, model.block_quantized(p + "attn_v.weight"), p + "v"), s.kv_heads)
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(past_name(i, kind), TensorProto.FLOAT, [1, s.kv_heads, "P", d]))
            outputs.append(helper.make_tensor_value_info(present_name(i, kind), TensorProto.FLOAT, [1, s.kv_heads, "T", d]))
        b.nodes.append(helper.make_node("Concat", [past_name(i, "key"), k], [present_name(i, "key")], axis=2))
        b.nodes.append(helper.make_node("Concat", [past_name(i, "value"), v], [present_name(i, "value")], axis=2))
        # grouped-query attention without copying the caches: queries [1, kv, group, S, d]
        # against keys [1, kv, 1, d, T], broadcast over the group
        q5 = b.op("Reshape", [b.op("Mul", [q, scale]), b.const(np.array([1, s.kv_heads, group, -1, d], np.int64))])
        k5 = b.op("Unsqueeze", [b.op("Transpose", [present_name(i, "key")], perm=[0, 1, 3, 2]), b.const(np.array([2]))])
        v5 = b.op("Unsqueeze", [present_name(i, "value"), b.const(np.array([2]))])
        weights = b.op("Softmax", [b.op("Add", [b.op("MatMul", [q5, k5]), mask])], axis=-1)
        attended = b.op("Reshape", [b.op("MatMul", [weights, v5]), b.const(np.array([1, s.heads, -1, d], np.int64))])
        merged = b.op("Reshape", [b.op("Transpose", [attended], perm=[0, 2, 1, 3]),
                                  b.const(np.array([1, -1, s.hidden], np.int64))])
        h = b.op("Add", [h, b.linear(merged, model.block_quantized(p + "attn_output.weight"), p + "o")])
        x = b.rms_norm(h, model.vector(p + "ffn_norm.weight"), s.rms_eps, p + "ffn_norm")
        gate = b.linear(x, model.block_quantized(p + "ffn_gate.weight"), p + "gate")
        up = b.linear(x, model.block_quantized(p + "ffn_up.weight"), p + "up")
        act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
        h = b.op("Add", [h, b.linear(act, model.block_quantized(p + "ffn_down.weight"), p + "down")])

    last = b.op("Slice", [h, b.const(np.array([-1])), b.const(np.array([np.iinfo(np.int64).max])),
                          b.const(np.array([1]))])
    last = b.rms_norm(last, model.vector("output_norm.weight"), s.rms_eps, "output_norm")
    head = model.block_quantized("output.weight" if model.has("output.weight") else "token_embd.weight")
    logits = b.linear(last, head, "lm_head")
    b.nodes.append(helper.make_node("Identity", [logits], ["logits"]))
    outputs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, s.vocab]))

    graph = helper.make_graph(b.nodes, "llama", inputs, outputs, b.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
                             ir_version=9, producer_name="realtime_omni")
