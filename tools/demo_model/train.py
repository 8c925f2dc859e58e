#!/usr/bin/env python3
"""Trains the demo model: a tiny gpt-oss (model.py) on the generated corpus
(corpus.py) rendered by `flotilla render --jsonl`, then a quantization-aware
finish (MXFP4 experts, bf16 dense weights), an evaluation on the held-out
questions, and the compact checkpoint (checkpoint_io.py) that
`flotilla make-checkpoint --preset demo` expands.

  python3 tools/demo_model/train.py --flotilla build/bin/flotilla \
      --out tools/demo_model/demo.safetensors --heldout tools/demo_model/heldout.json \
      [--seed 0] [--steps 900]

Runs on CUDA when present, else on one CPU thread. Reproducible from the seed
on one device kind (the corpus and the initial weights always are).
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_io  # noqa: E402
import corpus  # noqa: E402
from model import GptOss, demo_config  # noqa: E402

VOCAB = 201088
EVAL_SYSTEM = "You are a helpful assistant."
EVAL_DATE = "2026-01-15"
RETURN, CALL, END = 200002, 200012, 200007


def render(flotilla, examples):
    """Token ids of each example's prompt and completion, by the project's renderer."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for e in examples:
            f.write(json.dumps(e) + "\n")
        path = f.name
    try:
        out = subprocess.run([flotilla, "render", "--jsonl", path], check=True,
                             capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    return [json.loads(line) for line in out.splitlines()]


def eval_request(question, tools):
    req = {"model": "demo", "messages": [{"role": "system", "content": EVAL_SYSTEM},
                                         {"role": "user", "content": question}]}
    if tools:
        req["tools"] = tools
    return {"request": req, "date": EVAL_DATE, "completion": ""}


def eval_examples(held):
    out = []
    for q in held:
        tools = [corpus.WEATHER_TOOL, corpus.ADD_TOOL] if "tool" in q else None
        out.append(eval_request(q["question"], tools))
    return out


def tool_result_examples(checks):
    """The request after each check's call and result, as a client sends it back."""
    out = []
    for c in checks:
        e = eval_request(c["question"], [corpus.WEATHER_TOOL, corpus.ADD_TOOL])
        call = corpus.call_message(c["tool"]["name"], c["tool"]["arguments"], False)
        if "reasoning" in c:
            call["reasoning_content"] = c["reasoning"]
        e["request"]["messages"] += [
            call, {"role": "tool", "tool_call_id": "call_1", "content": c["result"]}]
        out.append(e)
    return out


def score_tool_results(flotilla, checks, completions):
    """Fraction of answers after a tool result that end with a final message
    holding every expected word."""
    right = 0
    for c, toks in zip(checks, completions):
        messages = parse(flotilla, toks)
        last = messages[-1] if messages else {}
        right += (toks[-1] == RETURN and last.get("channel") == "final"
                  and all(w in last.get("content", "") for w in c["answer"]))
    return right / max(1, len(checks))


def batches(rng, data, batch_size, other_row, row_of):
    """Endless shuffled batches: (ids [B, T], targets [B, T] with -100 off the completion)."""
    # Batches of similar lengths (less padding), in a random order.
    order = sorted(range(len(data)), key=lambda i: len(data[i]["prompt"]) + len(data[i]["completion"]))
    while True:
        chunks = [order[s:s + batch_size] for s in range(0, len(order) - batch_size + 1, batch_size)]
        rng.shuffle(chunks)
        for chunk_ids in chunks:
            chunk = [data[i] for i in chunk_ids]
            t = max(len(c["prompt"]) + len(c["completion"]) for c in chunk)
            ids = torch.full((batch_size, t), other_row, dtype=torch.long)
            targets = torch.full((batch_size, t), -100, dtype=torch.long)
            for b, c in enumerate(chunk):
                seq = [row_of[x] for x in c["prompt"] + c["completion"]]
                # A few prompt tokens stand in for words the corpus lacks.
                for j in range(len(c["prompt"])):
                    if rng.random() < 0.01:
                        seq[j] = other_row
                ids[b, :len(seq)] = torch.tensor(seq)
                p = len(c["prompt"])
                targets[b, p - 1:len(seq) - 1] = torch.tensor(seq[p:])
            yield ids, targets


@torch.no_grad()
def greedy(model, prompts, row_of, vocab, max_new, device):
    """Greedy completions (o200k ids) of the prompts, batched; stops at <|return|> or <|call|>."""
    other_row = len(vocab)
    seqs = [[row_of.get(x, other_row) for x in p] for p in prompts]
    done = [False] * len(seqs)
    outs = [[] for _ in seqs]
    for _ in range(max_new):
        live = [i for i, d in enumerate(done) if not d]
        if not live:
            break
        t = max(len(seqs[i]) for i in live)
        ids = torch.full((len(live), t), other_row, dtype=torch.long)
        for b, i in enumerate(live):
            ids[b, :len(seqs[i])] = torch.tensor(seqs[i])
        logits = model(ids.to(device))
        # Greedy over the full vocabulary: the shared row is one token's logit
        # there, not the joint one of all the tokens it stands for.
        logits[..., other_row] -= math.log(model.others)
        for b, i in enumerate(live):
            row = int(logits[b, len(seqs[i]) - 1].argmax())
            seqs[i].append(row)
            token = vocab[row] if row < len(vocab) else -1
            outs[i].append(token)
            if token in (RETURN, CALL) or token < 0:
                done[i] = True
    return outs


def score(flotilla, held, completions):
    """Fraction of held-out questions answered right: the turn ends with a final
    message holding the answer, or with a call of the expected tool with the
    expected arguments."""
    right = 0
    details = []
    for q, toks in zip(held, completions):
        messages = parse(flotilla, toks)
        last = messages[-1] if messages else {}
        ok = False
        if "tool" in q:
            if (toks[-1] == CALL and last.get("channel") == "commentary"
                    and last.get("recipient") == "functions." + q["tool"]["name"]):
                try:
                    ok = json.loads(last.get("content", "")) == q["tool"]["arguments"]
                except json.JSONDecodeError:
                    ok = False
        else:
            ok = (toks[-1] == RETURN and last.get("channel") == "final"
                  and q["answer"] in last.get("content", ""))
        right += ok
        details.append({"question": q["question"], "ok": ok, "messages": messages})
    return right / max(1, len(held)), details


def parse(flotilla, tokens):
    """The Harmony messages of a completion ([] when it does not parse)."""
    if not tokens or tokens[-1] < 0:
        return []
    out = subprocess.run([flotilla, "parse", "--tokens", ",".join(map(str, tokens)),
                          "--start-role", "assistant"], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else []


@torch.no_grad()
def load_init(model, vocab, path):
    """Copies a compact checkpoint's weights into `model` (vocabulary rows by token id)."""
    _, old_vocab, old = checkpoint_io.read_compact(path)
    old_row = {t: i for i, t in enumerate(old_vocab)}
    old_params = dict(old.named_parameters())
    for name, p in model.named_parameters():
        if name in ("embed", "lm_head"):
            src = old_params[name]
            for i, t in enumerate(vocab):
                if t in old_row:
                    p[i] = src[old_row[t]]
            p[-1] = src[-1]
        else:
            p.copy_(old_params[name])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flotilla", required=True, help="the flotilla CLI (renders the corpus)")
    ap.add_argument("--out", required=True, help="compact checkpoint to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--qat-steps", type=int, default=150, help="last steps with quantized experts")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--copies", type=int, default=2, help="corpus copies of each trained question")
    ap.add_argument("--report", help="write the held-out results here (JSON)")
    ap.add_argument("--init", help="start from this compact checkpoint (rows of tokens it "
                    "lacks start random) instead of random weights")
    ap.add_argument("--heldout", help="write the held-out questions and the score here (JSON; "
                    "the meaning tests read tools/demo_model/heldout.json)")
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    started = time.time()
    train, held = corpus.generate(args.seed, args.copies)
    rendered = render(args.flotilla, train)
    held_prompts = [r["prompt"] for r in render(args.flotilla, eval_examples(held))]
    checks = corpus.tool_result_checks(args.seed)
    check_prompts = [r["prompt"] for r in render(args.flotilla, tool_result_examples(checks))]
    used = set()
    for r in rendered:
        used.update(r["prompt"])
        used.update(r["completion"])
    vocab = sorted(used)
    row_of = {t: i for i, t in enumerate(vocab)}
    other_row = len(vocab)
    print(f"corpus: {len(rendered)} examples, {len(held)} held out, {len(vocab)} tokens used",
          flush=True)

    cfg = demo_config(VOCAB)
    gen = torch.Generator().manual_seed(args.seed)
    model = GptOss(cfg, len(vocab) + 1, VOCAB - len(vocab), gen)
    if args.init:
        load_init(model, vocab, args.init)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                            betas=(0.9, 0.95))
    rng = random.Random(args.seed)
    stream = batches(rng, rendered, args.batch, other_row, row_of)
    warmup = 50
    for step in range(args.steps):
        model.qat = step >= args.steps - args.qat_steps
        lr = args.lr * min(1.0, (step + 1) / warmup) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, targets = next(stream)
        logits = model(ids.to(device))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.to(device).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.4f} lr {lr:.5f} qat {model.qat} "
                  f"{time.time() - started:.0f}s", flush=True)

    # The exported weights: bf16 dense, MXFP4 experts, exactly what the engines read.
    model.qat = False
    checkpoint_io.round_to_export(model)
    model.eval()
    completions = greedy(model, held_prompts, row_of, vocab, 48, device)
    acc, details = score(args.flotilla, held, completions)
    results_acc = score_tool_results(
        args.flotilla, checks, greedy(model, check_prompts, row_of, vocab, 48, device))
    print(f"held-out accuracy (exported weights): {acc:.3f} over {len(held)} questions; "
          f"answers after a tool result: {results_acc:.3f} over {len(checks)}; "
          f"{time.time() - started:.0f}s in all", flush=True)
    if args.heldout:
        with open(args.heldout, "w") as f:
            json.dump({"seed": args.seed, "accuracy": round(acc, 3), "questions": held,
                       "tool_result_accuracy": round(results_acc, 3), "tool_results": checks},
                      f, indent=1)
            f.write("\n")
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"accuracy": acc, "questions": details}, f, indent=1)
    checkpoint_io.write_compact(args.out, cfg, vocab, model,
                                {"seed": str(args.seed), "steps": str(args.steps),
                                 "heldout_accuracy": f"{acc:.3f}",
                                 "tool_result_accuracy": f"{results_acc:.3f}"})
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
