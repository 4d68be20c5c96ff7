#!/usr/bin/env bash
# Install everything the test suite needs (system packages, the package with its extras) and run it.
# Usage: ./scripts/test.sh [pytest args]      (slow tests: ./scripts/test.sh -m slow)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -f .ci/apt-packages.txt ] && command -v apt-get >/dev/null; then
  mapfile -t pkgs < <(grep -v '^\s*#' .ci/apt-packages.txt | sed '/^\s*$/d')
  missing=()
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

python3 -m pip install -q -e '.[embedded,omni,test]'

# FastRTC pins older starlette/pydantic/pillow than the server uses, so its integration tests run in
# their own virtualenv layered on this environment (the main run then skips them).
if [ "${SKIP_FASTRTC:-0}" != 1 ] && [ $# -eq 0 ]; then
  [ -x .venv-fastrtc/bin/python ] || python3 -m venv --system-site-packages .venv-fastrtc
  .venv-fastrtc/bin/python -m pip install -q 'fastrtc>=0.0.30' 'gradio>=5'
  .venv-fastrtc/bin/python -m pytest -q -p no:cacheprovider tests/integrations
fi

exec python3 -m pytest "$@"
