#!/usr/bin/env bash
# Extract Megatron-LM core_v0.16.1's megatron/ tree and pretrain_gpt.py (the release matching megatron-core 0.16.1) for the
# real validate_args check, from a local git clone or mirror of Megatron-LM. Nothing is fetched from the
# network and nothing is written into this repository.
#
#   tests/tools/prepare_megatron_lm.sh DEST          # then: export ORCH_MEGATRON_LM=DEST
#
# Source: $MEGATRON_LM_GIT (a clone or bare mirror holding the tag), else the first of the candidates
# below that exists. megatron/core is removed from DEST (the installed megatron-core is used). When the
# Python running orch ($PYTHON, default .venv/bin/python or python3) lacks six or regex, which
# megatron/training imports, they are installed into DEST/_deps (pip --target), never into a venv.
set -euo pipefail
TAG=core_v0.16.1
DEST=${1:?usage: $0 DEST}
CANDIDATES=("${MEGATRON_LM_GIT:-}" "$HOME/src/Megatron-LM" "/work/.mirror/NVIDIA+Megatron-LM/repo")
SRC=""
for c in "${CANDIDATES[@]}"; do
  if [[ -n "$c" ]] && git -C "$c" rev-parse --verify --quiet "$TAG^{commit}" >/dev/null 2>&1; then SRC=$c; break; fi
done
if [[ -z "$SRC" ]]; then
  echo "no Megatron-LM clone with tag $TAG found; set MEGATRON_LM_GIT to one" \
       "(git clone https://github.com/NVIDIA/Megatron-LM)" >&2
  exit 3
fi
mkdir -p "$DEST"
rm -rf "$DEST/megatron"
# megatron/ and the GPT entry script with what it imports (program.kind megatron-lm's checkout for the tests)
git -C "$SRC" archive "$TAG" megatron pretrain_gpt.py gpt_builders.py model_provider.py | tar -x -C "$DEST"
rm -rf "$DEST/megatron/core"
HERE=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
[[ -x "$PY" ]] || PY=python3
if ! "$PY" -c "import six, regex" 2>/dev/null; then
  "$PY" -m pip install --quiet --target "$DEST/_deps" six regex
fi
echo "Megatron-LM $TAG megatron/ tree in $DEST (from $SRC)"
echo "export ORCH_MEGATRON_LM=$DEST"
