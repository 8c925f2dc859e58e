#!/usr/bin/env python3
"""Checks that the C++ CPU engine reads the demo model as PyTorch computes it:
the greedy completions of the held-out questions from the compact checkpoint
in PyTorch (model.py) and from `flotilla generate --model synthetic:demo`
(the built-in copy, expanded) must be the same tokens.

  python3 tools/demo_model/verify.py --flotilla build/bin/flotilla \
      --checkpoint tools/demo_model/demo.safetensors [--questions 20]
"""

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_io  # noqa: E402
import train  # noqa: E402


def engine_greedy(flotilla, prompt, max_new):
    out = subprocess.run([flotilla, "generate", "--model", "synthetic:demo", "--prompt-ids",
                          ",".join(map(str, prompt)), "--temperature", "0", "--max-tokens",
                          str(max_new), "--stop-token-ids", f"{train.RETURN},{train.CALL}",
                          "--threads", "1", "--json"], check=True, capture_output=True, text=True)
    reply = json.loads(out.stdout)
    # The stop token ends the completion but is not among its tokens.
    return reply["tokens"] + ([reply["stop_token"]] if reply.get("stop_token") is not None else [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flotilla", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--heldout", default=os.path.join(os.path.dirname(__file__), "heldout.json"))
    ap.add_argument("--questions", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    _, vocab, model = checkpoint_io.read_compact(args.checkpoint)
    model.eval()
    row_of = {t: i for i, t in enumerate(vocab)}
    with open(args.heldout) as f:
        held = json.load(f)["questions"][:args.questions]
    prompts = [r["prompt"] for r in train.render(args.flotilla, train.eval_examples(held))]
    ours = train.greedy(model, prompts, row_of, vocab, 64, "cpu")
    same = 0
    for q, p, t in zip(held, prompts, ours):
        theirs = engine_greedy(args.flotilla, p, 64)
        same += theirs == t
        if theirs != t:
            print(f"differs: {q['question']}\n  torch  {t}\n  engine {theirs}")
    print(f"{same}/{len(held)} greedy completions identical")
    sys.exit(0 if same == len(held) else 1)


if __name__ == "__main__":
    main()
