#!/usr/bin/env bash
# The GPU check (bench/gpu/gpu_check.py) under `timeout 480`, with a Python that has what it needs.
#
#   bench/gpu/gpu_check.sh [ARGS...]              on a machine with one NVIDIA GPU (ARGS go to gpu_check.py)
#   bench/gpu/gpu_check.sh --device cpu --tiny    the same code path on a small model, on a CPU
#   bench/gpu/gpu_check.sh --download-wheels DIR [--installed FILE]
#                                                where pip reaches a registry: the wheels the check needs,
#                                                for Python $GPU_CHECK_PY_VERSION (3.12) on x86-64 Linux,
#                                                less what FILE lists (the GPU machine's `pip list
#                                                --format=freeze`, or one name per line)
#   bench/gpu/gpu_check.sh --wheels DIR [ARGS...] on a machine with no registry: install from DIR only
#
# Which Python: $GPU_CHECK_PYTHON when set; else .venv/bin/python, then python3, whichever imports
# the stages' packages (and sees a GPU, unless --device cpu); else python3 plus what it lacks,
# installed with --no-deps into .gpu-check/site (put first on PYTHONPATH) at requirements.txt's
# versions. The machine's own torch, torchvision, torchaudio and triton are pinned as they are, so
# pip never replaces a CUDA torch. With no torch at all, the repo's venv is made (make .venv/.installed).
# Setting Python up is not timed; the check itself is, and must end within 480 s.
set -euo pipefail
cd "$(dirname "$0")/../.."

SITE=.gpu-check/site
NEEDED="torch transformers tokenizers safetensors datasets speculators"
# What the stages import besides torch, at the versions the repository is tested with.
WANT=$(grep -E '^(transformers|tokenizers|safetensors|numpy|datasets|speculators)==' requirements.txt | tr '\n' ' ')
PY_VERSION=${GPU_CHECK_PY_VERSION:-3.12}
PLATFORM_FLAGS="--only-binary=:all: --implementation cp --python-version $PY_VERSION --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
# The CUDA stack a GPU machine already has and must keep: never downloaded. (torchvision and
# torchaudio are, unless --installed lists them: speculators' metadata asks for them.)
KEEP_RE='^(torch|triton|pytorch-triton|nvidia-.*|cuda-.*)$'

say() { echo "gpu_check.sh: $*" >&2; }

download_wheels() {  # DIR [FILE]: resolve the closure for the target platform, fetch what it lacks
  local dir=$1 installed=${2:-} report cons
  mkdir -p "$dir"
  report=$(mktemp) cons=$(mktemp)
  python3 - "$installed" "$WANT" > "$cons" <<'EOF'
import re, sys
installed, want = sys.argv[1], {w.split("==")[0].lower() for w in sys.argv[2].split()}
for line in (open(installed).read().splitlines() if installed else []):
    name = re.split(r"[=<>@ ]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
    if "==" in line and name not in want:  # the machine's versions, except where ours are asked for
        print(line.strip())
EOF
  # --target: pip takes platform options only for an install elsewhere; --dry-run installs nothing.
  # The machine's versions first, so that fewer wheels travel; where one of them does not fit ours
  # (datasets 5.1.0 wants fsspec<=2026.7.0, say), the closure is resolved without them.
  # shellcheck disable=SC2086
  python3 -m pip install --dry-run --ignore-installed --target "$dir/.resolve" --quiet --report "$report" \
      $PLATFORM_FLAGS -c "$cons" $WANT 2>/dev/null \
    || { say "the machine's versions do not all fit requirements.txt's: resolving without them";
         python3 -m pip install --dry-run --ignore-installed --target "$dir/.resolve" --quiet --report "$report" \
           $PLATFORM_FLAGS $WANT; }
  python3 - "$report" "$installed" "$KEEP_RE" > "$dir/wheels.txt" <<'EOF'
import json, re, sys
report, installed, keep = sys.argv[1], sys.argv[2], re.compile(sys.argv[3])
norm = lambda n: n.lower().replace("_", "-")
have = set()
for line in (open(installed).read().splitlines() if installed else []):
    name, _, version = line.strip().partition("==")
    have.add((norm(name), version) if version else norm(name))
for item in json.load(open(report))["install"]:
    name, version = norm(item["metadata"]["name"]), item["metadata"]["version"]
    if keep.match(name) or name in have or (name, version) in have:
        continue
    print(f"{name}=={version}")
EOF
  rm -rf "$report" "$cons" "$dir/.resolve"
  # shellcheck disable=SC2086,SC2046
  python3 -m pip download --no-deps --quiet $PLATFORM_FLAGS -d "$dir" $(cat "$dir/wheels.txt")
  say "$(wc -l < "$dir/wheels.txt") wheels in $dir ($(du -sh "$dir" | cut -f1)); listed in $dir/wheels.txt"
}

imports_all() {  # PYTHON [cuda]: it imports the stages' packages (and sees a GPU)
  local check="import $(echo "$NEEDED" | tr ' ' ',')"
  [ "${2:-}" = cuda ] && check="$check; assert torch.cuda.is_available()"
  "$1" -c "$check" 2>/dev/null
}

install_missing() {  # [DIR]: what python3 lacks, into $SITE, from DIR or the registry
  local dir=${1:-} pins report src=()
  [ -n "$dir" ] && src=(--no-index --find-links "$dir")
  pins=$(mktemp) report=$(mktemp)
  python3 -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|torchvision|torchaudio|triton)==' > "$pins" || true
  say "keeping $(tr '\n' ' ' < "$pins")"
  # shellcheck disable=SC2086
  python3 -m pip install --dry-run --quiet --report "$report" "${src[@]}" -c "$pins" $WANT
  mapfile -t todo < <(python3 -c 'import json,sys; [print(i["metadata"]["name"] + "==" + i["metadata"]["version"]) for i in json.load(open(sys.argv[1]))["install"]]' "$report")
  rm -f "$pins" "$report"
  mkdir -p "$SITE"
  if [ "${#todo[@]}" -gt 0 ]; then
    say "installing into $SITE: ${todo[*]}"
    python3 -m pip install --quiet --no-deps --no-compile --upgrade --target "$SITE" "${src[@]}" "${todo[@]}"
  fi
  # speculators' metadata asks for torchvision and torchaudio but it imports neither; transformers
  # imports torchvision when present, and one built for another torch (a CPU torch, say) breaks that
  # import. The Makefile removes them from the venv for the same reason.
  rm -rf "$SITE"/torchvision* "$SITE"/torchaudio*
}

# --- arguments ---------------------------------------------------------------------------------
WHEELS="" ARGS=() DEVICE=cuda WORK=""
while [ $# -gt 0 ]; do
  case $1 in
    --download-wheels) [ "${3:-}" = --installed ] && { download_wheels "$2" "$4"; exit; }; download_wheels "$2"; exit ;;
    --wheels) WHEELS=$2; shift 2; continue ;;
    --device) DEVICE=$2 ;;
    --device=*) DEVICE=${1#--device=} ;;
    --work-dir) WORK=$2 ;;
  esac
  ARGS+=("$1"); shift
done
NEED=cuda; [ "$DEVICE" = cpu ] && NEED=""

# --- which Python ------------------------------------------------------------------------------
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  PY=$GPU_CHECK_PYTHON
elif [ -x .venv/bin/python ] && imports_all .venv/bin/python $NEED; then
  PY=.venv/bin/python
elif imports_all python3 $NEED; then
  PY=python3
elif python3 -c "import torch" 2>/dev/null; then
  PY=python3
  export PYTHONPATH="$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}"
  imports_all python3 $NEED || install_missing "$WHEELS"
else
  say "python3 has no torch: making the repository's venv (make .venv/.installed)"
  make -s .venv/.installed
  PY=.venv/bin/python
fi
imports_all "$PY" $NEED || { say "$PY cannot import $NEEDED${NEED:+ or sees no GPU}"; exit 1; }
say "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"

# --- the check, timed --------------------------------------------------------------------------
if [ -z "$WORK" ]; then
  WORK=$(mktemp -d -t eagle3web-gpu-check-XXXXXX)
  ARGS+=(--work-dir "$WORK")
fi
rc=0
timeout --kill-after 10 480 "$PY" bench/gpu/gpu_check.py "${ARGS[@]}" || rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  say "the check ran past 480 s; the stages it finished were:"
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); r["timed_out"]=True; print(json.dumps(r))' "$WORK/gpu_check.json"
fi
exit "$rc"
