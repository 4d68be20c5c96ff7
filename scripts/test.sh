#!/usr/bin/env bash
# Install everything the test suite needs (system packages, the package with its extras) and run it.
# Usage: ./scripts/test.sh [pytest args]      (slow tests: ./scripts/test.sh -m slow)
#
# Works in an activated virtualenv (installs there), from a plain shell (installs into python3, or
# into ./.venv when python3 is the system's externally managed one), and in CI (.ci/run runs it).
# Without pytest args it also runs the FastRTC, pipecat and LiveKit tests, each in its own
# environment (.venv-fastrtc, .venv-pipecat, .venv-livekit); when one cannot be built its tests are
# reported as skipped with the reason, and the main suite runs regardless. SKIP_FASTRTC=1,
# SKIP_PIPECAT=1 and SKIP_LIVEKIT=1 leave them out;
# SKIP_INSTALL=1 installs nothing (system packages, pip) and tests the environments as they are.
# The exit code is the main suite's, or else the first failing optional environment's.
set -uo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n== %s\n' "$*"; }

# --- system packages (Chromium, redis-server) -------------------------------------------------
if [ "${SKIP_INSTALL:-0}" != 1 ] && [ -f .ci/apt-packages.txt ] && command -v apt-get >/dev/null && command -v dpkg >/dev/null; then
  mapfile -t pkgs < <(grep -v '^\s*#' .ci/apt-packages.txt | sed '/^\s*$/d')
  missing=()
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
          --no-install-recommends "${missing[@]}"; }; then
      say "could not install ${missing[*]}: the tests that need them are skipped"
    fi
  fi
fi

# --- the interpreter: the active virtualenv, else python3 (else ./.venv if python3 is managed) ---
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  PY="$(command -v python3)"
  managed="$("$PY" -c 'import sys, sysconfig, os
print(int(sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))')"
  if [ "$managed" = 1 ]; then  # pip may not install into the system Python (PEP 668)
    [ -x .venv/bin/python ] || "$PY" -m venv .venv || { echo "test.sh: cannot create .venv (python3-venv missing?)" >&2; exit 2; }
    PY="$PWD/.venv/bin/python"
  fi
fi
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  say "installing the package and its test extras with $PY"
  "$PY" -m pip install -q -e '.[embedded,denoise,omni,ray,test]' || { echo "test.sh: pip install failed (see above)" >&2; exit 2; }
fi

# --- optional environments: a virtualenv per framework, layered on this environment ------------
# A framework's own packages go in its virtualenv and win there (FastRTC pins older starlette,
# pydantic and pillow than the server uses; pipecat pins protobuf 6); everything else comes from
# this environment through a .pth file (not --system-site-packages: from inside a virtualenv that
# would be the base Python's packages).
layered_venv() {  # DIR
  local site
  if [ ! -x "$1/bin/python" ]; then
    "$PY" -m venv "$1" 2>&1 | tail -1
    [ -x "$1/bin/python" ] || { echo "python -m venv failed (python3-venv missing?)"; return 1; }
  fi
  site="$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || return 1
  # every package folder the main interpreter sees (a venv's own, and its base's when it has
  # --system-site-packages), processed as site dirs so their .pth files (editable installs) apply
  "$PY" -c 'import sys
paths = dict.fromkeys(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
print("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in paths))' > "$site/realtime_omni_main_env.pth"
}

# framework_env VENV CHECK PACKAGES...: a layered venv where `python -c CHECK` works, installing
# PACKAGES there when it does not (never with SKIP_INSTALL=1)
framework_env() {
  local venv=$1 check=$2
  shift 2
  layered_venv "$venv" || return 1
  if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    [ "${SKIP_INSTALL:-0}" != 1 ] || { echo "$* not installed there (SKIP_INSTALL=1)"; return 1; }
    "$venv/bin/python" -m pip install -q "$@" 2>&1 | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "pip install $* failed"; return 1; }
  fi
  "$venv/bin/python" -c "$check; import pytest, realtime_omni.app" 2>&1 | tail -1
  [ "${PIPESTATUS[0]}" -eq 0 ]
}

fastrtc_env() {
  framework_env .venv-fastrtc 'import fastrtc, gradio' 'fastrtc>=0.0.30' 'gradio>=5'
}

# pipecat's OpenAI realtime service as an unmodified client (its "openai" extra; 2.0 drops APIs the
# tests use)
pipecat_env() {
  framework_env .venv-pipecat 'import pipecat.services.openai.realtime.llm' 'pipecat-ai[openai]>=1.14,<2'
}

# LiveKit Agents' OpenAI realtime plugin: its RealtimeModel is a plain WebSocket client, no LiveKit
# server needed
livekit_env() {
  framework_env .venv-livekit 'import livekit.plugins.openai.realtime' 'livekit-agents>=1.8,<2' \
    'livekit-plugins-openai>=1.8,<2'
}

# run_optional NAME VENV SKIP TESTS: sets optional_rc and optional_note (a line for the summary)
run_optional() {
  local name=$1 venv=$2 skip=$3 tests=$4 reason
  optional_rc=0
  if [ "$skip" = 1 ] || [ $# -gt 4 ]; then
    optional_note="$name tests: not run (SKIP_${name^^}=1 or pytest arguments given)"
    return
  fi
  say "$name environment ($venv)"
  if reason="$("${name,,}_env" 2>&1)"; then
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "$tests"
    optional_rc=$?
    case $optional_rc in
      0) optional_note="$name tests: passed" ;;
      5) optional_note="$name tests: none collected"; optional_rc=0 ;;
      *) optional_note="$name tests: FAILED (exit $optional_rc)" ;;
    esac
  else
    optional_note="$name tests: SKIPPED, the optional environment could not be built: $(printf '%s' "$reason" | tail -1)"
  fi
  say "$optional_note"
}

run_optional FastRTC .venv-fastrtc "${SKIP_FASTRTC:-0}" tests/integrations/test_fastrtc_handler.py "$@"
fastrtc_rc=$optional_rc fastrtc_note=$optional_note
run_optional Pipecat .venv-pipecat "${SKIP_PIPECAT:-0}" tests/integrations/test_pipecat_realtime.py "$@"
pipecat_rc=$optional_rc pipecat_note=$optional_note
run_optional LiveKit .venv-livekit "${SKIP_LIVEKIT:-0}" tests/integrations/test_livekit_realtime.py "$@"
livekit_rc=$optional_rc livekit_note=$optional_note

# --- the main suite -------------------------------------------------------------------------
say "main suite"
"$PY" -m pytest "$@"
rc=$?
say "$fastrtc_note"
say "$pipecat_note"
say "$livekit_note"
[ $rc -eq 0 ] && rc=$fastrtc_rc
[ $rc -eq 0 ] && rc=$pipecat_rc
[ $rc -eq 0 ] && rc=$livekit_rc
exit $rc
