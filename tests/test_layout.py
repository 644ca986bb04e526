"""The package layout: one `arbor` namespace, layers that import downward only, no cycles,
no Triton on the torch path, and Hugging Face's `kernels` importable from anywhere."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("runtime", "radix", "grammar", "kernels", "frontend_lang")
# Which subpackages each may import (module level or not); anything else is an upward import.
ALLOWED = {
    "radix": {"radix"},
    "kernels": {"kernels"},
    "grammar": {"grammar"},
    "runtime": {"runtime", "radix", "grammar", "kernels"},
    "frontend_lang": {"frontend_lang", "runtime"},
}


def _modules() -> dict[str, Path]:
    """arbor module name -> file, for every module of the five subpackages."""
    out = {}
    for sub in SUBPACKAGES:
        for path in (ROOT / sub).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out["arbor." + ".".join(parts)] = path
    return out


def _imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n == "arbor" or n.startswith("arbor.")}


def test_pyproject_lists_every_package_and_top_folders_are_namespaces():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"arbor": "."}
    found = {"arbor"} | {
        "arbor." + ".".join(d.relative_to(ROOT).parts)
        for sub in SUBPACKAGES
        for d in [ROOT / sub, *(ROOT / sub).rglob("*")]
        if d.is_dir() and any(d.glob("*.py"))
    }
    assert set(config["packages"]) == found
    # A top-level folder with an __init__.py would shadow an installed distribution of the
    # same name (Hugging Face's `kernels`) whenever the repository root is on sys.path.
    assert not [s for s in SUBPACKAGES if (ROOT / s / "__init__.py").exists()]


def test_layers_import_downward_only():
    bad = []
    for name, path in _modules().items():
        layer = name.split(".")[1]
        for imported in _imports(path, module_level_only=False):
            target = imported.split(".")[1] if "." in imported else "arbor"
            if target not in ALLOWED[layer] and imported in _modules() | {"arbor": None}:
                bad.append(f"{name} imports {imported}")
    assert not bad, "\n".join(bad)


def test_no_module_level_import_cycles():
    modules = _modules()
    graph = {
        name: {m for m in _imports(path, module_level_only=True) if m in modules and m != name}
        for name, path in modules.items()
    }
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def _run(code: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_torch_path_never_loads_triton(tiny_model):
    # torch's own dynamo may import triton; Arbor's Triton kernels must stay unloaded.
    code = (
        "import sys\n"
        "from arbor.runtime.config import ServerArgs\n"
        "from arbor.runtime.scheduler.scheduler import Scheduler\n"
        "args = ServerArgs.from_flags(device='cpu', attention_backend='torch', dtype='float32')\n"
        f"Scheduler(args, {str(tiny_model('llama'))!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('arbor.kernels.')))"
    )
    assert _run(code, ROOT) == "['arbor.kernels.cpu_ops', 'arbor.kernels.reference']"


@pytest.mark.parametrize("cwd", ["root", "elsewhere"])
def test_hugging_face_kernels_imports_from_any_directory(cwd, tmp_path):
    code = (
        "import kernels, transformers, arbor, arbor.kernels.reference\n"
        "from arbor.__main__ import main\n"
        "print(kernels.__file__)"
    )
    where = _run(code, ROOT if cwd == "root" else tmp_path)
    assert "site-packages" in where and not where.startswith(str(ROOT / "kernels"))


def test_the_distribution_installs_only_the_arbor_name():
    import sysconfig
    from importlib.metadata import distributions

    # The installed record, not a stray arbor.egg-info that a build may leave in the checkout.
    [dist] = [d for d in distributions(path=[sysconfig.get_paths()["purelib"]]) if d.metadata["Name"] == "arbor"]
    assert dist.read_text("top_level.txt").split() == ["arbor"]
    assert not [f for f in dist.files or [] if f.parts[0] in SUBPACKAGES]
