#!/usr/bin/env bash
# The newest releases the package accepts: a separate venv (.venv-newest) takes the newest
# Triton and transformers that pyproject.toml's ranges allow (what `pip install opforge[models]`
# gives a user today), then `opforge verify --quick` runs every kernel against its float64
# reference and the transformers patch tests run. torch is the newest CPU build this machine
# holds (OPFORGE_NEWEST_TORCH; a newer torch here is a several-GB CUDA build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-newest"
TORCH="${OPFORGE_NEWEST_TORCH:-torch==2.13.0}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade --upgrade-strategy eager \
  "$TORCH" -e "$ROOT[test,models]"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
print("newest releases:", ", ".join(f"{p} {m.version(p)}" for p in ("torch", "triton", "transformers")))
PY
cd "$ROOT"
export TRITON_INTERPRET=1
"$VENV/bin/opforge" verify --quick
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/models/test_patch.py
