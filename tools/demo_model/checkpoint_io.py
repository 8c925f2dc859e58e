"""The demo model's compact checkpoint: one safetensors file holding the
Hugging Face tensors of gpt-oss except that `model.embed_tokens.weight` and
`lm_head.weight` have one row per token of `vocab_ids` (I32, ascending) plus a
last row shared by every other token of the vocabulary. Its `__metadata__`
holds "format": "flotilla-demo-v1" and "config": the config.json text.
`flotilla make-checkpoint --preset demo` (tools/checkpoint/demo_checkpoint.*)
expands it into the standard layout with the full vocabulary.
"""

import json
import struct

import torch

from model import mxfp4_quantize

FORMAT = "flotilla-demo-v1"


@torch.no_grad()
def round_to_export(model):
    """Rounds the weights in place to what the checkpoint holds: bf16 dense
    weights, experts bf16 then MXFP4."""
    for name, p in model.named_parameters():
        p.copy_(p.bfloat16().float())
        if name.endswith("gate_up_w") or name.endswith("down_w"):
            p.copy_(mxfp4_quantize(p)[0])


def bf16_bytes(t):
    return t.detach().cpu().float().bfloat16().view(torch.int16).numpy().tobytes()


def mxfp4_tensors(prefix, w):
    """blocks [E, rows, N/32, 16] and scales [E, rows, N/32] of w [E, rows, N]."""
    _, codes, scales = mxfp4_quantize(w.detach().cpu().float())
    e, rows, n = codes.shape
    pairs = codes.reshape(e, rows, n // 32, 16, 2)
    blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)
    return [(prefix + "_blocks", "U8", list(blocks.shape), blocks.numpy().tobytes()),
            (prefix + "_scales", "U8", list(scales.shape), scales.numpy().tobytes())]


def tensors(model, vocab):
    out = [("vocab_ids", "I32", [len(vocab)],
            torch.tensor(vocab, dtype=torch.int32).numpy().tobytes())]

    def bf16(name, t):
        out.append((name, "BF16", list(t.shape), bf16_bytes(t)))

    bf16("model.embed_tokens.weight", model.embed)
    bf16("lm_head.weight", model.lm_head)
    bf16("model.norm.weight", model.norm)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        bf16(p + "input_layernorm.weight", layer.input_norm)
        bf16(p + "post_attention_layernorm.weight", layer.post_norm)
        for proj in "qkvo":
            bf16(p + f"self_attn.{proj}_proj.weight", getattr(layer, proj + "_w"))
            bf16(p + f"self_attn.{proj}_proj.bias", getattr(layer, proj + "_b"))
        bf16(p + "self_attn.sinks", layer.sinks)
        bf16(p + "mlp.router.weight", layer.router_w)
        bf16(p + "mlp.router.bias", layer.router_b)
        out.extend(mxfp4_tensors(p + "mlp.experts.gate_up_proj", layer.gate_up_w))
        bf16(p + "mlp.experts.gate_up_proj_bias", layer.gate_up_b)
        out.extend(mxfp4_tensors(p + "mlp.experts.down_proj", layer.down_w))
        bf16(p + "mlp.experts.down_proj_bias", layer.down_b)
    return out


def write_compact(path, cfg, vocab, model, extra_metadata):
    items = tensors(model, vocab)
    header = {"__metadata__": {"format": FORMAT, "config": json.dumps(cfg, sort_keys=True),
                               **extra_metadata}}
    offset = 0
    for name, dtype, shape, data in items:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in items:
            f.write(data)


def read_compact(path):
    """(config, vocab, model) of a compact checkpoint, the weights as stored."""
    from model import GptOss  # noqa: E402  (torch-only reader, for verify.py)
    import numpy as np
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__")
    assert meta.get("format") == FORMAT, f"{path}: not a {FORMAT} checkpoint"
    cfg = json.loads(meta["config"])
    base = 8 + n

    def array(name):
        h = header[name]
        b, e = h["data_offsets"]
        dtype = {"BF16": np.int16, "U8": np.uint8, "I32": np.int32}[h["dtype"]]
        a = np.frombuffer(raw[base + b:base + e], dtype=dtype).reshape(h["shape"])
        if h["dtype"] == "BF16":
            return torch.from_numpy(a.copy()).view(torch.bfloat16).float()
        return torch.from_numpy(a.copy())

    vocab = array("vocab_ids").tolist()
    model = GptOss(cfg, len(vocab) + 1, cfg["vocab_size"] - len(vocab), torch.Generator())
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    values = torch.cat([grid, -grid])

    def mxfp4(prefix):
        blocks, scales = array(prefix + "_blocks").long(), array(prefix + "_scales").long()
        codes = torch.stack([blocks & 15, blocks >> 4], dim=-1).reshape(*blocks.shape[:-1], 32)
        w = values[codes] * torch.pow(2.0, (scales - 127).float())[..., None]
        return w.reshape(*w.shape[:-2], -1)

    with torch.no_grad():
        model.embed.copy_(array("model.embed_tokens.weight"))
        model.lm_head.copy_(array("lm_head.weight"))
        model.norm.copy_(array("model.norm.weight"))
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            layer.input_norm.copy_(array(p + "input_layernorm.weight"))
            layer.post_norm.copy_(array(p + "post_attention_layernorm.weight"))
            for proj in "qkvo":
                getattr(layer, proj + "_w").copy_(array(p + f"self_attn.{proj}_proj.weight"))
                getattr(layer, proj + "_b").copy_(array(p + f"self_attn.{proj}_proj.bias"))
            layer.sinks.copy_(array(p + "self_attn.sinks"))
            layer.router_w.copy_(array(p + "mlp.router.weight"))
            layer.router_b.copy_(array(p + "mlp.router.bias"))
            layer.gate_up_w.copy_(mxfp4(p + "mlp.experts.gate_up_proj"))
            layer.gate_up_b.copy_(array(p + "mlp.experts.gate_up_proj_bias"))
            layer.down_w.copy_(mxfp4(p + "mlp.experts.down_proj"))
            layer.down_b.copy_(array(p + "mlp.experts.down_proj_bias"))
    return cfg, vocab, model
