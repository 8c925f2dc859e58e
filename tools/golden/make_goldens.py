#!/usr/bin/env python3
"""Records golden outputs of Hugging Face transformers' GptOssForCausalLM on a
checkpoint written by `flotilla make-checkpoint`, for the engine's tests.

For each checkpoint directory it
  1. loads the model with Mxfp4Config(dequantize=True) in float32, eager
     attention, and checks that every parameter equals the file's values:
     bf16 tensors bit for bit, MXFP4 experts against an independent decode
     written here from MODEL.md (E2M1 nibbles, low nibble first, scale
     2^(byte-127)); any difference aborts, since goldens from a model that
     does not hold our weights would be worthless;
  2. for each prompt, writes the logits of every prompt position as raw
     little-endian float32 [T, V] (logits_i.f32) and a 24-token greedy
     continuation (argmax at each step, recomputed over the whole sequence,
     no end-of-sequence stopping; cross-checked against model.generate);
     the prompt logits are also compared with an independent float32 forward
     pass written here from MODEL.md (printed, not stored);
  3. for one prompt, writes the logits of the full prompt+continuation
     sequence (full_logits_i.f32) for KV-cache tests;
  4. writes golden.json next to the checkpoint files:
     {"prompts", "greedy", "logits_files", "vocab_size", "source", ...}.

Usage: make_goldens.py --ckpt DIR --prompt-lengths 1,9,23,40 [--seed N]
       [--device cpu|cuda] [--full-sequence-prompt I] [--steps 24]
"""
import argparse
import json
import os
import random
import sys

import torch
import transformers
from safetensors import safe_open
from transformers import GptOssForCausalLM, Mxfp4Config

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def read_tensors(ckpt):
    """name -> tensor, from model.safetensors or the files of the index."""
    index = os.path.join(ckpt, "model.safetensors.index.json")
    if os.path.exists(os.path.join(ckpt, "model.safetensors")):
        files = {"model.safetensors"}
    else:
        with open(index) as f:
            files = set(json.load(f)["weight_map"].values())
    out = {}
    for name in sorted(files):
        with safe_open(os.path.join(ckpt, name), framework="pt") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key)
    return out


def decode_mxfp4(blocks, scales):
    """[..., R, G, 16] u8 blocks and [..., R, G] u8 scales -> [..., R, G*32] f32."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    b = blocks.to(torch.int64)
    nib = torch.stack([b & 0xF, b >> 4], dim=-1)  # element 2j: low nibble, 2j+1: high
    vals = lut[nib].reshape(*blocks.shape[:-1], 32)
    scale = torch.pow(2.0, scales.to(torch.float32) - 127.0).unsqueeze(-1)
    return (vals * scale).reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def verify_weights(model, tensors):
    """Every parameter of the model must equal the checkpoint's values."""
    state = model.state_dict()
    checked, problems = 0, []
    for key, param in state.items():
        p = param.detach().to("cpu", torch.float32)
        if key in tensors:
            want = tensors[key].to(torch.float32)
        elif key.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            want = decode_mxfp4(tensors[key + "_blocks"], tensors[key + "_scales"])
            # transformers keeps experts as [E, in, out]; the file has [E, out, in].
            want = want.transpose(1, 2)
        else:
            problems.append(f"{key}: not in the checkpoint")
            continue
        if tuple(p.shape) != tuple(want.shape):
            problems.append(f"{key}: shape {tuple(p.shape)} vs file {tuple(want.shape)}")
            continue
        diff = (p - want).abs().max().item() if p.numel() else 0.0
        if diff != 0.0:
            problems.append(f"{key}: max |difference| {diff}")
        checked += 1
    return checked, problems


def rms_norm(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def yarn_cos_sin(cfg, positions):
    """RoPE tables exactly as MODEL.md states them (YaRN, NTK by parts)."""
    d = cfg["head_dim"]
    theta = cfg["rope_theta"]
    rs = cfg.get("rope_scaling") or {}
    j = torch.arange(d // 2, dtype=torch.float64)
    freq = theta ** (2 * j / d)
    if rs.get("rope_type", rs.get("type")) == "yarn":
        import math
        factor, l0 = rs["factor"], rs["original_max_position_embeddings"]
        low = (d / 2) * math.log(l0 / (rs.get("beta_fast", 32) * 2 * math.pi)) / math.log(theta)
        high = (d / 2) * math.log(l0 / (rs.get("beta_slow", 1) * 2 * math.pi)) / math.log(theta)
        if high == low:
            high += 0.001
        ramp = ((j - low) / (high - low)).clamp(0, 1)
        mask = 1 - ramp
        inv = (1 / (factor * freq)) * (1 - mask) + (1 / freq) * mask
        conc = 0.1 * math.log(factor) + 1
    else:
        inv, conc = 1 / freq, 1.0
    inv = inv.to(torch.float32)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang) * conc, torch.sin(ang) * conc


def rope(x, cos, sin):  # x [T, heads, D]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def reference_forward(cfg, w, ids):
    """An independent float32 forward pass written from MODEL.md alone, reading
    the file's tensors (experts through decode_mxfp4). Returns logits [T, V]."""
    H, NH, NKV, D = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    K, eps, limit = cfg["num_experts_per_tok"], cfg["rms_norm_eps"], cfg["swiglu_limit"]
    T = len(ids)
    f = lambda name: w[name].to(torch.float32)
    x = f("model.embed_tokens.weight")[torch.tensor(ids)]
    cos, sin = yarn_cos_sin(cfg, torch.arange(T))
    i_idx = torch.arange(T)[:, None]
    j_idx = torch.arange(T)[None, :]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t = rms_norm(x, f(p + "input_layernorm.weight"), eps)
        q = (t @ f(p + "self_attn.q_proj.weight").T + f(p + "self_attn.q_proj.bias")).view(T, NH, D)
        k = (t @ f(p + "self_attn.k_proj.weight").T + f(p + "self_attn.k_proj.bias")).view(T, NKV, D)
        v = (t @ f(p + "self_attn.v_proj.weight").T + f(p + "self_attn.v_proj.bias")).view(T, NKV, D)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        allowed = j_idx <= i_idx
        if cfg["layer_types"][l] == "sliding_attention":
            allowed = allowed & (j_idx > i_idx - cfg["sliding_window"])
        sinks = f(p + "self_attn.sinks")
        heads = []
        for h in range(NH):
            kv = h // (NH // NKV)
            sc = (q[:, h] @ k[:, kv].T) / (D ** 0.5)
            sc = sc.masked_fill(~allowed, float("-inf"))
            sc = torch.cat([sc, sinks[h].expand(T, 1)], dim=1)
            prob = torch.softmax(sc, dim=1)[:, :T]
            heads.append(prob @ v[:, kv])
        a = torch.stack(heads, dim=1).reshape(T, NH * D)
        x = x + a @ f(p + "self_attn.o_proj.weight").T + f(p + "self_attn.o_proj.bias")
        t = rms_norm(x, f(p + "post_attention_layernorm.weight"), eps)
        r = t @ f(p + "mlp.router.weight").T + f(p + "mlp.router.bias")
        top_v, top_i = torch.topk(r, K, dim=-1)
        gates = torch.softmax(top_v, dim=-1)
        pe = p + "mlp.experts."
        wgu = decode_mxfp4(w[pe + "gate_up_proj_blocks"], w[pe + "gate_up_proj_scales"])
        wd = decode_mxfp4(w[pe + "down_proj_blocks"], w[pe + "down_proj_scales"])
        bgu, bd = f(pe + "gate_up_proj_bias"), f(pe + "down_proj_bias")
        y = torch.zeros_like(x)
        for ti in range(T):
            for kk in range(K):
                e = int(top_i[ti, kk])
                gu = wgu[e] @ t[ti] + bgu[e]
                gate, up = gu[0::2].clamp(max=limit), gu[1::2].clamp(-limit, limit)
                out = gate * torch.sigmoid(1.702 * gate) * (up + 1)
                y[ti] += gates[ti, kk] * (wd[e] @ out + bd[e])
        x = x + y
    x = rms_norm(x, f("model.norm.weight"), eps)
    head = "lm_head.weight" if "lm_head.weight" in w else "model.embed_tokens.weight"
    return x @ f(head).T


def diagnostics(model, ids, device):
    """Residual-stream rms per layer and router spread, to show the model is sane."""
    with torch.no_grad():
        out = model(torch.tensor([ids], device=device), output_hidden_states=True,
                    output_router_logits=True)
    rms = [round(h[0].pow(2).mean().sqrt().item(), 3) for h in out.hidden_states]
    k = model.config.num_experts_per_tok
    routers = []
    for r in out.router_logits or []:
        r = r.reshape(-1, r.shape[-1])[-len(ids):]
        top = torch.topk(r, k, dim=-1).indices.sort(dim=-1).values
        routers.append({"distinct_topk_sets": len({tuple(t.tolist()) for t in top}),
                        "experts_used": len(set(top.flatten().tolist())),
                        "logit_std": round(r.std().item(), 3)})
    logits = out.logits[0].float()
    return {"hidden_rms_per_layer": rms, "router": routers,
            "logit_std": round(logits.std().item(), 3)}


def greedy(model, prompt, steps, device):
    """Argmax continuation, each step recomputed over the whole sequence."""
    seq = list(prompt)
    margins = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([seq], device=device)).logits[0, -1].float()
            top2 = torch.topk(logits, 2)
            margins.append((top2.values[0] - top2.values[1]).item())
            seq.append(int(top2.indices[0]))
    return seq[len(prompt):], min(margins)


def generate_check(model, prompt, steps, device):
    """The same continuation through model.generate (KV cache), for a cross-check."""
    gen_config = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=steps, min_new_tokens=0, eos_token_id=None,
        pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None else 0)
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        # An explicit mask: otherwise generate() masks prompt tokens equal to pad_token_id.
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen_config)
    return out[0, len(prompt):].tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--prompt-lengths", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--full-sequence-prompt", type=int, default=-1)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = args.device if args.device != "cuda" or torch.cuda.is_available() else "cpu"

    model = GptOssForCausalLM.from_pretrained(
        args.ckpt, quantization_config=Mxfp4Config(dequantize=True), torch_dtype=torch.float32,
        attn_implementation="eager")
    model = model.to(device=device, dtype=torch.float32).eval()
    tensors = read_tensors(args.ckpt)
    checked, problems = verify_weights(model, tensors)
    print(f"{args.ckpt}: {checked} parameters equal the checkpoint"
          f" (experts against our own MXFP4 decode)", flush=True)
    if problems:
        print("weights do not match the checkpoint:\n  " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(3)

    with open(os.path.join(args.ckpt, "config.json")) as f:
        cfg = json.load(f)
    vocab = model.config.vocab_size
    rng = random.Random(args.seed)
    lengths = [int(x) for x in args.prompt_lengths.split(",")]
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    golden = {"prompts": prompts, "greedy": [], "logits_files": [], "vocab_size": vocab,
              "source": f"transformers {transformers.__version__}, torch "
                        f"{torch.__version__.split('+')[0]}, float32, {device}"}
    min_margins = []
    ref_diffs = []  # transformers vs the MODEL.md reference, per prompt
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            logits = model(torch.tensor([prompt], device=device)).logits[0]
        logits = logits.to("cpu", torch.float32).contiguous()
        assert logits.shape == (len(prompt), vocab)
        name = f"logits_{i}.f32"
        logits.numpy().astype("<f4").tofile(os.path.join(args.ckpt, name))
        golden["logits_files"].append(name)
        try:
            ref = reference_forward(cfg, tensors, prompt)
            ref_diffs.append((ref - logits).abs().max().item())
        except Exception as e:  # advisory, like the generate() cross-check
            ref_diffs.append(f"reference failed: {e!r}")
        cont, margin = greedy(model, prompt, args.steps, device)
        golden["greedy"].append(cont)
        min_margins.append(round(margin, 4))
        try:
            via_generate = generate_check(model, prompt, args.steps, device)
        except Exception as e:  # the cross-check is advisory; the goldens do not depend on it
            print(f"note: model.generate failed: {e}", flush=True)
            via_generate = cont
        if via_generate != cont:
            print(f"note: prompt {i}: model.generate (KV cache) gives {via_generate}, "
                  f"full recompute gives {cont}", flush=True)
    golden["greedy_min_top2_margin"] = min_margins

    f = args.full_sequence_prompt
    if 0 <= f < len(prompts):
        seq = prompts[f] + golden["greedy"][f]
        with torch.no_grad():
            logits = model(torch.tensor([seq], device=device)).logits[0]
        name = f"full_logits_{f}.f32"
        logits.to("cpu", torch.float32).contiguous().numpy().astype("<f4").tofile(
            os.path.join(args.ckpt, name))
        golden["full_sequence"] = {"prompt_index": f, "tokens": seq, "logits_file": name}

    with open(os.path.join(args.ckpt, "golden.json"), "w") as out:
        json.dump(golden, out)
        out.write("\n")
    diag = diagnostics(model, prompts[-1], device)
    print(json.dumps({"checkpoint": os.path.basename(os.path.normpath(args.ckpt)),
                      "prompt_lengths": lengths, "greedy": golden["greedy"],
                      "greedy_min_top2_margin": min_margins, "source": golden["source"],
                      "max_abs_diff_vs_model_md_reference": ref_diffs,
                      **diag}), flush=True)


if __name__ == "__main__":
    main()
