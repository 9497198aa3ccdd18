"""cluster.yaml deploys: its set-up commands, read from the file, pass with the CPU variant of their
extras, and its head deploys the app from a Serve config file that builds.

The import check is the one scripts/setup.sh runs (`scripts/check_imports.py "$EXTRAS"`). It is run
here for the extras this venv carries; for every extra named (aws included, which CI's venv lacks)
each module it checks must come from a package those extras declare, so a node never fails its
set-up on a module nothing installed there (the dev tools were, before issue 33).
"""

import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)
CLUSTER = yaml.safe_load((ROOT / "cluster.yaml").read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def setup_command_extras() -> list[str]:
    """The extras cluster.yaml's set-up runs scripts/setup.sh with, as the file says."""
    runs = [c for c in CLUSTER["setup_commands"] if "scripts/setup.sh" in c]
    assert len(runs) == 1, CLUSTER["setup_commands"]
    words = shlex.split(runs[0].split("&&")[-1])
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    assert words[len(env)] == "scripts/setup.sh", words
    return check.parse_extras(env["STREAM2LLM_EXTRAS"])


def cpu_variant(extras: list[str]) -> list[str]:
    return ["cpu" if e == "gpu" else e for e in extras]


def declared_closure(extras: list[str]) -> set[str]:
    """Distributions `stream2llm[extras]` pulls in, walked through installed metadata (a package not
    installed here ends its branch)."""
    todo = list(PROJECT["dependencies"]) + [r for e in extras for r in PROJECT["optional-dependencies"][e]]
    seen: set[str] = set()
    while todo:
        req = Requirement(todo.pop())
        name = _canonical(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for sub in map(Requirement, requires):
            wanted = req.extras or {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(str(sub))
    return seen


def test_setup_sh_runs_the_import_check_of_its_own_extras():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'scripts/check_imports.py "$EXTRAS"' in text and "EXTRAS=${STREAM2LLM_EXTRAS:-" in text
    assert "import pytest_asyncio" not in text  # no dev import outside the extras' check


def test_every_checked_module_comes_from_a_declared_package():
    providers = metadata.packages_distributions()
    extras = cpu_variant(setup_command_extras())
    closure = declared_closure(extras)
    for module in check.modules_for(extras):
        top = module.split(".")[0]
        dists = {_canonical(d) for d in providers.get(top, [])} or {_canonical(top)}  # not installed here
        assert dists & closure, f"{module} (from {dists}) is not installed by stream2llm[{','.join(extras)}]"
    dev_only = set(check.MODULES["dev"]) - set(check.modules_for([e for e in extras]))
    assert {"pytest_asyncio", "hypothesis", "schemathesis"} <= dev_only


def test_the_cluster_setup_check_passes_with_the_cpu_extras():
    """scripts/check_imports.py, in a process of its own as setup.sh runs it, for cluster.yaml's
    extras with cpu for gpu; aws is left to the test above: CI's venv does not install boto3."""
    extras = [e for e in cpu_variant(setup_command_extras()) if e != "aws"]
    assert "cpu" in extras and "data" in extras
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_imports.py"), ",".join(extras)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_import_check_names_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setitem(check.MODULES, "aws", ["no_such_module_xyz"])
    monkeypatch.setitem(check.COMMANDS, "aws", [["no-such-tool", "--version"]])
    (tmp_path / "no-such-tool").write_text("#!/bin/sh\nexit 3\n")
    (tmp_path / "no-such-tool").chmod(0o755)
    problems = check.failures(["aws"], tmp_path)
    assert len(problems) == 2 and "no_such_module_xyz" in problems[0] and "exit 3" in problems[1]
    with pytest.raises(SystemExit, match="unknown extra"):
        check.parse_extras("gpu,nope")


def test_aws_provider_dependency_is_an_exact_pin_in_the_extra_the_cluster_installs():
    assert "aws" in setup_command_extras() and CLUSTER["provider"]["type"] == "aws"
    pins = [Requirement(r) for r in PROJECT["optional-dependencies"]["aws"]]
    assert [p.name for p in pins] == ["boto3"] and str(pins[0].specifier).startswith("==")


def test_head_deploys_the_serve_config_file_and_it_builds():
    from ray.serve.schema import ServeDeploySchema

    from pipeline.app import app_builder
    from pipeline.config import AppConfig

    deploys = [c for c in CLUSTER["head_start_ray_commands"] if "serve deploy" in c]
    assert len(deploys) == 1
    path = re.search(r"serve deploy (\S+)", deploys[0]).group(1).rstrip("';")
    schema = ServeDeploySchema.model_validate(yaml.safe_load((ROOT / path).read_text()))
    (app,) = schema.applications
    assert app.import_path == "pipeline.app:app_builder"
    config = AppConfig.model_validate({**AppConfig().model_dump(), **app.args})  # what app_builder does
    types = CLUSTER["available_node_types"]
    gpu = types["gpu_worker"]
    assert config.replicas.use_gpu and config.replicas.max_replicas == gpu["max_workers"]
    assert CLUSTER["max_workers"] == sum(t["max_workers"] for t in types.values())  # every type can reach its max
    assert config.model.platform == "cuda" and gpu["resources"]["GPU"] >= 1
    # the ingress replicas ask for a resource only the CPU worker type has, and a CPU each: they fill
    # those nodes, whose number the autoscaler raises as Serve adds ingress replicas
    (cpu_type,) = [n for n, t in types.items() if set(config.ingress.resources) <= set(t.get("resources", {}))]
    assert cpu_type != CLUSTER["head_node_type"] and "GPU" not in types[cpu_type]["resources"]
    assert config.replicas.ingress_num_cpus >= 1 and types[cpu_type]["min_workers"] >= 1
    # the retriever pool (detached actors: their node never goes idle) stays off the GPU workers
    assert config.retrievers.resources and set(config.retrievers.resources) <= set(types[cpu_type]["resources"])
    app_builder(dict(app.args))  # builds the Serve application (no Ray needed)
    with pytest.raises(Exception, match="not_a_field"):
        app_builder({**app.args, "not_a_field": 1})
