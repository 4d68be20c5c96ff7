#!/usr/bin/env bash
# Builds the folders a GPU call carries (docs/gpu-machine.md), all ignored by git:
#   .whl_tf      transformers 5.24 repacked as transformers.tar.xz, plus regex
#   .whl_server  the server's and the benchmarks' own dependencies as cp312 wheels
#   .whl_min     the few of those the in-process runs need (pydantic, soxr, llguidance, ...)
#   .omni_cfg    the real-size model configs and the spoken question (turn.npy, Piper, 24 kHz)
# Run here from the repository root (needs PyPI and the project installed); then pass
# carry [".whl_tf", ".whl_min", ".omni_cfg"] (qwen3, codec) or [".whl_tf", ".whl_server",
# ".omni_cfg"] (talker: through the server) on a device call.
set -euo pipefail
cd "$(dirname "$0")/.."
dl=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_31_x86_64)

if [ ! -f .whl_tf/transformers.tar.xz ]; then
  rm -rf .whl_tf /tmp/tf_whl /tmp/tf_unpacked && mkdir -p .whl_tf /tmp/tf_whl /tmp/tf_unpacked
  "${dl[@]}" -d /tmp/tf_whl transformers==5.24.0
  "${dl[@]}" -d .whl_tf 'regex>=2025.10.22'
  python3 -m zipfile -e /tmp/tf_whl/transformers-*.whl /tmp/tf_unpacked
  tar -cJf .whl_tf/transformers.tar.xz -C /tmp/tf_unpacked .
fi

if [ ! -f .whl_server/llguidance-1.9.1-cp39-abi3-manylinux_2_31_x86_64.whl ]; then
  mkdir -p .whl_server
  "${dl[@]}" -d .whl_server fastapi annotated-doc opentelemetry-api starlette uvicorn websockets \
    pydantic pydantic-core pydantic-settings python-dotenv typing-inspection annotated-types \
    openai httpx2 httpcore2 truststore 'idna>=3.18' h11 anyio certifi jiter distro sniffio soxr av \
    aiortc aioice pylibsrtp pyee cryptography cffi pycparser google-crc32c dnspython ifaddr pyopenssl \
    typing_extensions jsonschema attrs jsonschema-specifications referencing rpds-py \
    prometheus-client importlib-metadata zipp orjson llguidance==1.9.1
  # pip download resolves pydantic-core against pydantic only with dependencies: fetch the pair
  core=$(python3 - <<'EOF'
import glob, re, zipfile
whl = glob.glob(".whl_server/pydantic-[0-9]*.whl")[0]
meta = zipfile.ZipFile(whl).read(next(n for n in zipfile.ZipFile(whl).namelist() if n.endswith("METADATA"))).decode()
print(re.search(r"Requires-Dist: pydantic-core==([\d.]+)", meta).group(1))
EOF
)
  rm -f .whl_server/pydantic_core-*.whl
  "${dl[@]}" -d .whl_server "pydantic-core==$core"
fi

if [ ! -f .omni_cfg/turn.npy ]; then
  mkdir -p .omni_cfg
  cp -r ../shared/model_configs/Qwen2.5-Omni-7B ../shared/model_configs/Qwen3-Omni-30B-A3B-Instruct .omni_cfg/
  python3 - <<'EOF'
import sys
import numpy as np
sys.path.insert(0, "benchmarks")
from omni_server import QUESTION, speech
np.save(".omni_cfg/turn.npy", speech(None))
EOF
fi
# the in-process runs (omni_capacity.py: qwen3, codec) import realtime_omni's omni engine, which
# needs these beside torch and transformers; carried instead of .whl_server (the 64 MiB limit)
rm -rf .whl_min && mkdir -p .whl_min
for p in annotated_types llguidance pydantic-2 pydantic_core soxr typing_inspection typing_extensions; do
  cp .whl_server/"$p"*.whl .whl_min/
done
# yappi: only for scripts/gpu-next.sh host-profile (not a project dependency)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl_min yappi || echo "yappi not downloaded: host-profile will not run" >&2
du -sh .whl_tf .whl_server .whl_min .omni_cfg
