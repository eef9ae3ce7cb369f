#!/usr/bin/env bash
# The scoreboard's Triton libraries on a lent GPU: Liger-Kernel 0.8.5 (its norm modules and every
# autograd.Function of liger_kernel.ops) and fla-core 0.6.0 (every autograd.Function of
# fla.modules.activations and fla.modules.norm), each run as a user runs it on CUDA. From the
# repo root:
#
#   bash benchmarks/gpu_scoreboard_cuda.sh [JOBS [BUDGET_S]]       # 6, 540
#
# Needs wheels/liger_kernel-0.8.5, fla_core-0.6.0 and einops wheels (`pip download --no-deps`),
# installed with --no-deps into build/cudasite (the machine's torch and Triton are kept). Runs
# benchmarks/scoreboard.py --device cuda over the three libraries with --deadline (a call cut
# short resumes from build/sbc/results.json, carried or kept on a warm machine); once every
# class has a record, the kept file is rewritten from the run (--update-expected) and the page's
# CUDA block written, both copied to $OUT/sbc with the run's log, tarred to $OUT/sbc.tar.gz.
set -u
JOBS=${1:-6}
BUDGET=${2:-540}
OUT=${OUT:?set OUT to the folder that comes back}
SB=$OUT/sbc
CACHE=build/sbc/results.json
mkdir -p "$SB" build/sbc
nvidia-smi --query-gpu=name --format=csv,noheader
if [ ! -f build/cudasite/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --disable-pip-version-check --target \
    build/cudasite wheels/liger_kernel-0.8.5-py3-none-any.whl \
    wheels/fla_core-0.6.0-py3-none-any.whl wheels/einops-*.whl || exit 1
  touch build/cudasite/.installed
fi
export PYTHONPATH=.:$PWD/build/cudasite PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
[ -f "$CACHE" ] && cp "$CACHE" "$SB/results.json"
cp docs/scoreboard.md "$SB/scoreboard.md"
args=(--device cuda --library liger --library liger-ops --library fla --jobs "$JOBS"
      --timeout 150 --results "$SB/results.json" --doc "$SB/scoreboard.md")
python3 benchmarks/scoreboard.py "${args[@]}" --deadline $((BUDGET - SECONDS - 40)) \
  >"$SB/run.txt" 2>&1
code=$?
echo "scoreboard.py exit $code in ${SECONDS} s (3: classes left; 1: outcomes changed)"
if [ "$code" != 3 ] && [ "$code" != 2 ]; then
  python3 benchmarks/scoreboard.py "${args[@]}" --update-expected >"$SB/update.txt" 2>&1
  echo "update-expected exit $?"
  cp benchmarks/scoreboard_expected.toml "$SB/scoreboard_expected.toml"
fi
[ -f "$SB/results.json" ] && cp "$SB/results.json" "$CACHE"
grep -E "^(CHANGED|NEW|UNCLASSIFIED|deadline:|[0-9]+ classes:)" "$SB/run.txt" | cut -c1-230
tar -czf "$OUT/sbc.tar.gz" -C "$OUT" sbc && rm -rf "$SB"
echo "wrote $OUT/sbc.tar.gz in ${SECONDS} s"
