#!/usr/bin/env bash
# The real-library scoreboard in full at the tool's default shape, on a lent machine's CPU
# cores, in calls of at most 10 minutes that resume one another. From the repo root:
#
#   bash benchmarks/gpu_scoreboard.sh [JOBS [BUDGET_S [SCOREBOARD_ARGS…]]]  # 14, 530
#
# 1. Installs wheels from wheels/sb/ (transformers, timm and what they import; no torch, no
#    numpy) with --no-deps --target build/sbsite, first on PYTHONPATH: the machine's own
#    python3 and its torch run everything, and torch is never replaced (checked after the
#    install). transformers and timm always (pinned: they shadow the machine's own); any other
#    wheel only where the machine lacks that package or has an older one.
# 2. Runs benchmarks/scoreboard.py --device cpu --jobs JOBS over every library that imports
#    there, with --deadline so that this call ends before BUDGET_S seconds: no class starts
#    after the deadline, one still running is killed and left for the next call. Its records
#    go to $OUT/sb/results.json, starting from build/sb/results.json where a former call left
#    one (carried, or kept on a warm machine); the cache's fingerprint (the tool's source, the
#    libraries' versions, shape/device/dtype/timeout) takes them only from the same setup.
# 3. Once every class has a record: the totals to a copy of docs/scoreboard.md and the kept
#    file rewritten from the run (--update-expected, on a copy of the repo's), both in $OUT/sb.
# 4. Tars $OUT/sb to $OUT/sb.tar.gz and prints a summary: classes done and left, outcomes.
#
# A trial: SCOREBOARD_PYTHON=PATH skips the install and runs with that Python; arguments after
# BUDGET_S go to scoreboard.py (e.g. --only PATTERN), and then the kept file is not rewritten.
set -u
JOBS=${1:-14}
BUDGET=${2:-530}
EXTRA=("${@:3}")
OUT=${OUT:?set OUT to the folder that comes back}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
SB=$OUT/sb
CACHE=build/sb/results.json
mkdir -p "$SB" build/sb

PY=${SCOREBOARD_PYTHON:-}
if [ -z "$PY" ]; then
  PY=python3
  before=$("$PY" -c "import torch; print(torch.__version__)")
  if [ ! -f build/sbsite/.installed ]; then  # a warm machine keeps it from a former call
    mapfile -t wheels < <("$PY" - <<'EOF'
from importlib import metadata
from pathlib import Path
from packaging.version import Version
for wheel in sorted(Path("wheels/sb").glob("*.whl")):
    name, version = wheel.name.split("-")[:2]
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if name in ("transformers", "timm") or have is None or Version(have) < Version(version):
        print(wheel)
EOF
)
    echo "installing ${#wheels[@]} wheels: ${wheels[*]##*/}"
    "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
      --disable-pip-version-check --target build/sbsite "${wheels[@]}" || exit 1
    touch build/sbsite/.installed
  fi
  export PYTHONPATH=.:$PWD/build/sbsite${PYTHONPATH#.}
  after=$("$PY" -c "import torch; print(torch.__version__)")
  echo "torch $before without the wheels, $after with them"
  [ "$before" = "$after" ] || { echo "the wheels changed torch: stopping"; exit 1; }
fi
"$PY" - <<'EOF'
from importlib import metadata, util
import platform
print("python", platform.python_version(), "·", ", ".join(
    f"{d} {metadata.version(d) if util.find_spec(m) else 'absent'}"
    for d, m in (("torch", "torch"), ("transformers", "transformers"), ("timm", "timm"),
                 ("numba", "numba"), ("torchvision", "torchvision"))))
EOF

[ -f "$CACHE" ] && cp "$CACHE" "$SB/results.json"
cp docs/scoreboard.md "$SB/scoreboard.md"
# The budget less what has run so far and ~45 s for the rewrite of the kept file (its own
# enumeration of every library) and the archive.
deadline=$((BUDGET - SECONDS - 45))
args=(--device cpu --jobs "$JOBS" --results "$SB/results.json" --doc "$SB/scoreboard.md"
      "${EXTRA[@]}")
stamp=$(date -u +%H%M%S)
"$PY" benchmarks/scoreboard.py "${args[@]}" --deadline "$deadline" >"$SB/run-$stamp.txt" 2>&1
code=$?
echo "scoreboard.py exit $code in ${SECONDS} s so far (3: classes left; 1: outcomes changed)"
if [ "$code" != 3 ] && [ "$code" != 2 ] && [ ${#EXTRA[@]} = 0 ]; then
  # Complete: the kept file rewritten from the run (every record cached, so no class runs).
  cp benchmarks/scoreboard_expected.toml "$SB/scoreboard_expected.kept.toml"
  "$PY" benchmarks/scoreboard.py "${args[@]}" --update-expected >"$SB/update.txt" 2>&1
  echo "update-expected exit $?"
  cp benchmarks/scoreboard_expected.toml "$SB/scoreboard_expected.toml"
fi
[ -f "$SB/results.json" ] && cp "$SB/results.json" "$CACHE"

grep -E "^(CHANGED|NEW|UNCLASSIFIED|deadline:|[0-9]+ classes:)" "$SB/run-$stamp.txt" | tail -n 40
"$PY" - "$SB/results.json" <<'EOF'
import json, sys
from collections import Counter
try:
    cache = json.load(open(sys.argv[1]))
except FileNotFoundError:
    sys.exit("no records yet")
records = cache["records"].values()
print(f"records: {len(records)} · calls so far: {len(cache.get('calls', []))} · outcomes:",
      dict(Counter(r["outcome"] for r in records).most_common()))
print("per library:", dict(Counter(r["library"] for r in records).most_common()))
print(f"sum of per-class seconds {sum(r['seconds'] for r in records):.0f}, "
      f"slowest {max((r['seconds'] for r in records), default=0):.0f}")
EOF
tar -czf "$OUT/sb.tar.gz" -C "$OUT" sb && rm -rf "$SB"
echo "wrote $OUT/sb.tar.gz in ${SECONDS} s"
