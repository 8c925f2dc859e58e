"""The gpt-oss architecture in PyTorch, exactly as the engines compute it
(MODEL.md): attention sinks, alternating sliding-window and full layers, YaRN
rope, top-k routed experts with the swiglu limit. Experts can run through a
fake MXFP4 quantization (straight-through gradients) and dense weights through
bf16 rounding, for the quantization-aware finish; `quantized` exports the
packed blocks and scales.

The vocabulary is compact: row i of the embedding and lm_head stands for token
VOCAB[i]; the last row (OTHER) stands for every other token of o200k_harmony,
and its logit counts `others` tokens at once (log(others) added) so that the
softmax is the full vocabulary's.
"""

import math

import torch
import torch.nn.functional as F

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def demo_config(vocab_size=201088):
    """The demo model's config.json (Hugging Face layout)."""
    layers = 4
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "attention_bias": True, "attention_dropout": 0.0,
        "eos_token_id": 200002, "pad_token_id": 199999,
        "experts_per_token": 2, "num_experts_per_tok": 2, "num_local_experts": 8,
        "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": layers,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(layers)],
        "initial_context_length": 4096, "max_position_embeddings": 131072,
        "initializer_range": 0.02, "output_router_logits": False,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"]},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn",
                         "truncate": False},
        "rope_theta": 150000.0, "router_aux_loss_coef": 0.9, "sliding_window": 64,
        "swiglu_limit": 7.0, "tie_word_embeddings": False, "use_cache": True,
        "vocab_size": vocab_size,
    }


def rope_tables(cfg, positions, device):
    """cos, sin [T, D/2] of YaRN ("NTK by parts"), f32, as MODEL.md gives them."""
    d = cfg["head_dim"]
    theta = cfg["rope_theta"]
    rs = cfg["rope_scaling"]
    factor, l0 = rs["factor"], rs["original_max_position_embeddings"]
    j = torch.arange(d // 2, dtype=torch.float64)
    freq = theta ** (2 * j / d)
    low = (d / 2) * math.log(l0 / (rs["beta_fast"] * 2 * math.pi)) / math.log(theta)
    high = (d / 2) * math.log(l0 / (rs["beta_slow"] * 2 * math.pi)) / math.log(theta)
    ramp = ((j - low) / (high - low)).clamp(0, 1)
    mask = 1 - ramp
    inv_freq = (1 / (factor * freq)) * (1 - mask) + (1 / freq) * mask
    angles = positions.double()[:, None] * inv_freq[None, :]
    scale = 0.1 * math.log(factor) + 1
    return ((torch.cos(angles) * scale).float().to(device),
            (torch.sin(angles) * scale).float().to(device))


def rope(x, cos, sin):
    """x [B, T, heads, D]: rotate halves."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rmsnorm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def fake_bf16(w):
    return w + (w.bfloat16().float() - w).detach()


def mxfp4_quantize(w):
    """w [..., N] (N a multiple of 32, blocks along the last dim) -> (values
    the packed form decodes to, nibble codes [..., N], scale bytes [..., N/32])."""
    shape = w.shape
    blocks = w.detach().reshape(*shape[:-1], shape[-1] // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = blocks / torch.pow(2.0, exp)
    grid = torch.tensor(FP4_VALUES, device=w.device)
    mag = scaled.abs()
    idx = (mag[..., None] - grid).abs().argmin(-1)
    values = grid[idx] * torch.sign(scaled) * torch.pow(2.0, exp)
    codes = idx + 8 * (scaled < 0).long() * (idx > 0).long()
    return (values.reshape(shape), codes.reshape(shape),
            (exp.squeeze(-1) + 127).to(torch.uint8))


def fake_mxfp4(w):
    return w + (mxfp4_quantize(w)[0] - w).detach()


class GptOss(torch.nn.Module):
    def __init__(self, cfg, rows, others, generator):
        super().__init__()
        self.cfg = cfg
        self.others = others
        self.qat = False
        h, d = cfg["hidden_size"], cfg["head_dim"]
        nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        e, i = cfg["num_local_experts"], cfg["intermediate_size"]

        def param(*shape, std):
            return torch.nn.Parameter(torch.randn(*shape, generator=generator) * std)

        def zeros(*shape):
            return torch.nn.Parameter(torch.zeros(*shape))

        def ones(*shape):
            return torch.nn.Parameter(torch.ones(*shape))

        self.embed = param(rows, h, std=1.0)
        self.lm_head = param(rows, h, std=h ** -0.5)
        self.norm = ones(h)
        self.layers = torch.nn.ModuleList()
        for _ in range(cfg["num_hidden_layers"]):
            layer = torch.nn.Module()
            layer.input_norm = ones(h)
            layer.post_norm = ones(h)
            layer.q_w, layer.q_b = param(nh * d, h, std=h ** -0.5), zeros(nh * d)
            layer.k_w, layer.k_b = param(nkv * d, h, std=h ** -0.5), zeros(nkv * d)
            layer.v_w, layer.v_b = param(nkv * d, h, std=h ** -0.5), zeros(nkv * d)
            layer.o_w, layer.o_b = param(h, nh * d, std=(nh * d) ** -0.5 / 2), zeros(h)
            layer.sinks = zeros(nh)
            layer.router_w, layer.router_b = param(e, h, std=h ** -0.5), zeros(e)
            layer.gate_up_w, layer.gate_up_b = param(e, 2 * i, h, std=h ** -0.5), zeros(e, 2 * i)
            layer.down_w, layer.down_b = param(e, h, i, std=i ** -0.5 / 2), zeros(e, h)
            self.layers.append(layer)

    def dense(self, w):
        return fake_bf16(w) if self.qat else w

    def expert(self, w):
        return fake_mxfp4(fake_bf16(w)) if self.qat else w

    def attention(self, layer, index, x, cos, sin):
        cfg = self.cfg
        b, t, _ = x.shape
        nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        q = F.linear(x, self.dense(layer.q_w), self.dense(layer.q_b)).view(b, t, nh, d)
        k = F.linear(x, self.dense(layer.k_w), self.dense(layer.k_b)).view(b, t, nkv, d)
        v = F.linear(x, self.dense(layer.v_w), self.dense(layer.v_b)).view(b, t, nkv, d)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        group = nh // nkv
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        pos = torch.arange(t, device=x.device)
        allowed = pos[None, :] <= pos[:, None]
        if cfg["layer_types"][index] == "sliding_attention":
            allowed = allowed & (pos[None, :] > pos[:, None] - cfg["sliding_window"])
        scores = scores.masked_fill(~allowed, float("-inf"))
        sinks = self.dense(layer.sinks).view(1, nh, 1, 1).expand(b, nh, t, 1)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
        out = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, nh * d)
        return F.linear(out, self.dense(layer.o_w), self.dense(layer.o_b))

    def moe(self, layer, x):
        cfg = self.cfg
        shape = x.shape
        t = x.reshape(-1, shape[-1])
        logits = F.linear(t, self.dense(layer.router_w), self.dense(layer.router_b))
        top_v, top_i = logits.topk(cfg["num_experts_per_tok"], dim=-1)
        weights = torch.softmax(top_v, dim=-1)
        gate_up_w, down_w = self.expert(layer.gate_up_w), self.expert(layer.down_w)
        gate_up_b, down_b = self.dense(layer.gate_up_b), self.dense(layer.down_b)
        limit = cfg["swiglu_limit"]
        y = torch.zeros_like(t)
        for e in range(cfg["num_local_experts"]):
            token, slot = (top_i == e).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            h = F.linear(t[token], gate_up_w[e], gate_up_b[e])
            gate = h[:, 0::2].clamp(max=limit)
            up = h[:, 1::2].clamp(-limit, limit)
            act = gate * torch.sigmoid(1.702 * gate) * (up + 1)
            out = F.linear(act, down_w[e], down_b[e])
            y = y.index_add(0, token, out * weights[token, slot][:, None])
        return y.view(shape)

    def forward(self, ids):
        """ids [B, T] (compact rows) -> logits [B, T, rows], the OTHER row's
        raised by log(others)."""
        cfg = self.cfg
        eps = cfg["rms_norm_eps"]
        cos, sin = rope_tables(cfg, torch.arange(ids.shape[1]), ids.device)
        x = F.embedding(ids, self.dense(self.embed))
        for index, layer in enumerate(self.layers):
            x = x + self.attention(layer, index, rmsnorm(x, self.dense(layer.input_norm), eps),
                                   cos, sin)
            x = x + self.moe(layer, rmsnorm(x, self.dense(layer.post_norm), eps))
        logits = F.linear(rmsnorm(x, self.dense(self.norm), eps), self.dense(self.lm_head))
        other = torch.zeros(logits.shape[-1], device=logits.device)
        other[-1] = math.log(self.others)
        return logits + other
