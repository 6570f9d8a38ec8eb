"""One import root: the sibling folders install as coevo.* and nothing else reaches the top level."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_subpackages_import_after_install(tmp_path):
    # run from an unrelated directory so the repository root is not on sys.path
    code = ("import coevo.trainers, coevo.buffers, coevo.kernels, coevo.harness, coevo.agent; "
            "print(coevo.kernels.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).parent == ROOT / "kernels"
    # a package of the same name installed from elsewhere (Hugging Face's kernels) is not a leak
    probe = ("import importlib.util as u, os; print([n for n in ('trainers', 'buffers', 'kernels') "
             "if u.find_spec(n) and str(u.find_spec(n).origin).startswith(os.path.join(%r, n))])" % str(ROOT))
    leaked = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert leaked.stdout.strip() == "[]", leaked.stdout + leaked.stderr


def test_run_from_the_root_an_installed_kernels_package_is_not_shadowed():
    """`python train.py` / `python -m pytest` put the root first on sys.path, where its kernels/
    folder would win `import kernels` over Hugging Face's package (transformers >= 5.25 imports it
    while loading any model); importing coevo moves the root behind site-packages."""
    code = ("import sys, importlib.util as u; import coevo; "
            "print(sys.path[-1] in ('', '.', %r), u.find_spec('kernels').origin)" % str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    last_is_root, origin = out.stdout.split()
    assert last_is_root == "True"
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        return  # Hugging Face's kernels is not installed (transformers < 5.25): nothing to shadow
    assert not origin.startswith(str(ROOT / "kernels")), origin  # installed: it, not the folder, is found
    load = "import coevo; from transformers import LlamaConfig, LlamaForCausalLM; print('ok')"
    done = subprocess.run([sys.executable, "-c", load], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_every_package_directory_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    listed = set(config["packages"])
    found = set()
    for top, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([top, *rel.parts]))
    assert found == listed


@pytest.mark.slow
def test_wheel_installs_only_under_coevo(tmp_path):
    # build from a copy of the tracked files: setuptools reuses an in-tree build/ folder, and a
    # stale one from before a package move once hid a missing package here (CI's fresh clone caught it)
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, source / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
                   check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    wheel = next(tmp_path.glob("coevo-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"coevo", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    for sub in ("trainers", "buffers", "kernels", "harness/library", "safety/sandbox"):
        assert f"coevo/{sub}/__init__.py" in names


def test_the_bootstrap_constraints_pin_every_dependency_within_its_range():
    """scripts/constraints.txt (the tested versions the bootstrap installs without a GPU) must satisfy
    pyproject's ranges, or a fresh clone's install fails; and it must pin every direct dependency but
    torch and triton, or a new release can change what CI tests (the deepspeed extra included: the
    bootstrap installs it without a GPU, at the version it names; the envs extra, which it installs too)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "scripts" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for spec in project["dependencies"] + extras["dev"] + extras["deepspeed"] + extras["envs"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        if name in ("torch", "triton") or (req.marker and not req.marker.evaluate()):
            continue
        assert name in pins, f"{req.name} is not pinned in scripts/constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{req.name}=={pins[name]} is outside {req.specifier}"
    assert "torch" not in pins and "triton" not in pins
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert f'"deepspeed=={pins["deepspeed"]}"' in bootstrap  # the version it installs is the pinned one
