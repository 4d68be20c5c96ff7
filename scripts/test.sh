#!/usr/bin/env bash
# Install everything the test suite needs (system packages, the package with its extras) and run it.
# Usage: ./scripts/test.sh [pytest args]      (slow tests: ./scripts/test.sh -m slow)
#
# Works in an activated virtualenv (installs there), from a plain shell (installs into python3, or
# into ./.venv when python3 is the system's externally managed one), and in CI (.ci/run runs it).
# Without pytest args it also runs the FastRTC tests in their own environment (.venv-fastrtc);
# when that environment cannot be built they are reported as skipped with the reason, and the
# main suite runs regardless. SKIP_FASTRTC=1 leaves them out; SKIP_INSTALL=1 installs nothing
# (system packages, pip) and tests the environment as it is. The exit code is the main suite's, or
# the FastRTC tests' when only they failed.
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
  "$PY" -m pip install -q -e '.[embedded,omni,ray,test]' || { echo "test.sh: pip install failed (see above)" >&2; exit 2; }
fi

# --- FastRTC (optional): its own virtualenv, layered on this environment ------------------------
# FastRTC pins older starlette/pydantic/pillow than the server uses, so its packages go in
# .venv-fastrtc and win there; everything else comes from this environment through a .pth file
# (not --system-site-packages: from inside a virtualenv that would be the base Python's packages).
fastrtc_env() {
  local site
  if [ ! -x .venv-fastrtc/bin/python ]; then
    "$PY" -m venv .venv-fastrtc 2>&1 | tail -1
    [ -x .venv-fastrtc/bin/python ] || { echo "python -m venv failed (python3-venv missing?)"; return 1; }
  fi
  site="$(.venv-fastrtc/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || return 1
  # every package folder the main interpreter sees (a venv's own, and its base's when it has
  # --system-site-packages), processed as site dirs so their .pth files (editable installs) apply
  "$PY" -c 'import sys
paths = dict.fromkeys(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
print("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in paths))' > "$site/realtime_omni_main_env.pth" || return 1
  if ! .venv-fastrtc/bin/python -c 'import fastrtc, gradio' 2>/dev/null; then
    [ "${SKIP_INSTALL:-0}" != 1 ] || { echo "fastrtc is not installed there (SKIP_INSTALL=1)"; return 1; }
    .venv-fastrtc/bin/python -m pip install -q 'fastrtc>=0.0.30' 'gradio>=5' 2>&1 | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "pip install fastrtc gradio failed"; return 1; }
  fi
  .venv-fastrtc/bin/python -c 'import fastrtc, gradio, pytest, realtime_omni.app' 2>&1 | tail -1
  [ "${PIPESTATUS[0]}" -eq 0 ]
}

fastrtc_rc=0
fastrtc_note=""
if [ "${SKIP_FASTRTC:-0}" = 1 ] || [ $# -gt 0 ]; then
  fastrtc_note="FastRTC tests: not run (SKIP_FASTRTC=1 or pytest arguments given)"
else
  say "FastRTC environment (.venv-fastrtc)"
  if reason="$(fastrtc_env 2>&1)"; then
    .venv-fastrtc/bin/python -m pytest -q -p no:cacheprovider tests/integrations
    fastrtc_rc=$?
    case $fastrtc_rc in
      0) fastrtc_note="FastRTC tests: passed" ;;
      5) fastrtc_note="FastRTC tests: none collected"; fastrtc_rc=0 ;;
      *) fastrtc_note="FastRTC tests: FAILED (exit $fastrtc_rc)" ;;
    esac
  else
    fastrtc_note="FastRTC tests: SKIPPED, the optional environment could not be built: $(printf '%s' "$reason" | tail -1)"
  fi
  say "$fastrtc_note"
fi

# --- the main suite -------------------------------------------------------------------------
say "main suite"
"$PY" -m pytest "$@"
rc=$?
[ -n "$fastrtc_note" ] && say "$fastrtc_note"
[ $rc -eq 0 ] && rc=$fastrtc_rc
exit $rc
