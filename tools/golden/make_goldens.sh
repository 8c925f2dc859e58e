#!/usr/bin/env bash
# Writes the golden fixtures of tests/data/golden/: two tiny synthetic
# checkpoints (different shapes; one sharded with an index) and, for each,
# what transformers computes on them (see make_goldens.py). Needs python3 with
# torch, transformers (with gpt-oss support) and safetensors.
#   tools/golden/make_goldens.sh OUT_DIR [FLOTILLA_BIN]
# FLOTILLA_BIN defaults to build/bin/flotilla. DEVICE=cuda runs transformers
# on the GPU (default cpu).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: make_goldens.sh OUT_DIR [FLOTILLA_BIN]}"
flotilla="${2:-$here/../../build/bin/flotilla}"
python="${PYTHON:-python3}"
device="${DEVICE:-cpu}"

# max_position_embeddings = factor * original_max_position_embeddings, as in the
# published configs: some transformers versions derive the YaRN factor from
# that ratio instead of reading rope_scaling.factor.
# name | make-checkpoint arguments | prompt lengths | prompt seed | full-sequence prompt
fixtures=(
  "tiny_e8|--seed 1 --set max_position_embeddings=131072 --set vocab_size=512 --set eos_token_id=510 --set pad_token_id=511|1,9,23,40|11|2"
  "tiny_e16_sharded|--seed 2 --shards 3 --sinks-dtype f32 --set max_position_embeddings=131072 --set vocab_size=768 --set hidden_size=96 --set intermediate_size=64 --set num_local_experts=16 --set num_experts_per_tok=2 --set num_hidden_layers=5 --set num_attention_heads=4 --set num_key_value_heads=2 --set head_dim=32 --set sliding_window=8 --set rope_theta=10000 --set eos_token_id=766 --set pad_token_id=767|3,12,30,45|22|2"
)

for f in "${fixtures[@]}"; do
  IFS='|' read -r name ckpt_args lengths seed full <<<"$f"
  dir="$out/$name"
  rm -rf "$dir"
  # shellcheck disable=SC2086  # ckpt_args is a list of words
  "$flotilla" make-checkpoint --out "$dir" $ckpt_args
  "$python" "$here/make_goldens.py" --ckpt "$dir" --prompt-lengths "$lengths" --seed "$seed" \
    --device "$device" --full-sequence-prompt "$full"
done
du -sh "$out"
