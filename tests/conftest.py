"""Shared fixtures. The expensive ones run once per session: the real export command for `resnet18_export` (random
weights), `lite0_int8_export` (EfficientNet-Lite0's trained weights, fp32 and int8) and `aoti_export`, and one plain
TorchServe serving resnet18 (`resnet18_server`) for every test that needs a server but no special setting.

`make test` runs the suite on two pytest-xdist workers. Each test module runs whole on one worker, and modules that
use a session fixture named in SHARED_BY_GROUP run on the same one, so a server or a long export is made once
(pytest_xdist_make_scheduler); an export both workers need is made once for the run (`made_once`)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAT = ROOT / "examples" / "cat.jpg"
# Two workers, each with its exports and servers, ask for more threads than the cores: threads that spin while
# they wait then take CPU from the others. Passive waiting (set before torch is imported here or in any process a
# test starts; ONNX Runtime's sessions follow it, runtime/onnxruntime.py; no effect on results) measured 97 s ->
# 65 s of wall for two export modules side by side (2-core AVX2 EPYC, docs/testing.md). A value already set
# is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The servers the tests start choose their form as a user's do, measured at load (runtime/form_choice.py, kept for
# later starts); each answer names its form and is held to that form run in-process (tests/answers.py).
sys.path.insert(0, str(ROOT))
# Session fixtures whose users run on one worker: each of these is made by that worker alone.
SHARED_BY_GROUP = ("lite0_int8_export", "aoti_export", "controlflow_export", "resnet18_server",
                   "resnet18_inprocess_bench")


def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scheduling by scope, where a scope is a test module or, for modules that use the same fixture
    of SHARED_BY_GROUP, all of them. (Its own `loadgroup` marks are lost under pytest 9, whose node ids it can
    no longer rewrite.)"""
    from xdist.scheduler import LoadScopeScheduling
    groups = module_groups(Path(config.rootpath))
    config.option.loadscopereorder = False  # scopes go out in collection order: heaviest first (below)

    class ByModuleAndSharedFixture(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return groups.get(module, module)

    return ByModuleAndSharedFixture(config, log)


# The heaviest scopes (a module, or a SHARED_BY_GROUP group), heaviest first: handed out first, so that the run
# does not end with one worker alone on a long module (the docker image's build and runs, then the shared server,
# the detectors' exports and servers, which need no resnet18 while the other worker makes it, the rollouts on every
# engine, ...). A worker is handed its next scope when two tests of its current one are left, so a long scope near
# the end would keep the other worker idle: every scope of minutes is named here, the rest are short.
HEAVIEST_FIRST = ("tests/docker/test_image.py", "resnet18_server", "tests/e2e/test_detection.py",
                  "tests/e2e/test_rollout.py", "lite0_int8_export", "tests/e2e/test_zoo.py",
                  "tests/e2e/test_rollout_evidence.py", "tests/test_cpu_independence.py",
                  "tests/e2e/test_own_models.py", "tests/docker/test_entrypoint.py",
                  "resnet18_inprocess_bench", "tests/e2e/test_kserve.py", "tests/e2e/test_ray_two_node.py",
                  "controlflow_export", "tests/e2e/test_faults.py", "tests/e2e/test_soak.py", "tests/test_types.py")


def pytest_collection_modifyitems(config, items) -> None:
    """Items of the heaviest scopes first (stable: each module keeps its own order). Every worker sorts the same
    way, so their collections stay identical, as xdist requires."""
    groups = module_groups(Path(config.rootpath))
    unknown = [scope for scope in HEAVIEST_FIRST if scope not in groups.values()
               and (scope in groups or not (Path(config.rootpath) / scope).is_file())]
    if unknown:  # a renamed module, or one merged into a group, would silently lose its place
        raise pytest.UsageError(f"HEAVIEST_FIRST names no scope (a test module outside the groups, or a shared "
                                f"fixture of SHARED_BY_GROUP): {', '.join(unknown)}")
    rank = {scope: position for position, scope in enumerate(HEAVIEST_FIRST)}

    def scope_rank(item) -> int:
        module = item.nodeid.split("::")[0]
        return rank.get(groups.get(module, module), len(HEAVIEST_FIRST))
    items.sort(key=scope_rank)


@functools.cache  # read by the scheduler and by the collection's ordering
def module_groups(root: Path) -> dict[str, str]:
    """{test module path: the shared fixture its group is named after}, modules naming the same fixture merged."""
    merged = {}  # module or fixture -> the key it was merged into

    def find(key: str) -> str:
        while merged.setdefault(key, key) != key:
            key = merged[key]
        return key
    for path in sorted((root / "tests").rglob("test_*.py")):
        module, text = str(path.relative_to(root)), path.read_text()
        for fixture in SHARED_BY_GROUP:
            if fixture in text:
                merged[find(module)] = find(fixture)
    return {key: find(key) for key in merged if key.endswith(".py") and find(key) != key}


def made_once(tmp_path_factory, name: str, make) -> dict:
    """make(folder) -> dict of paths and strings, run once for the whole test run: under pytest-xdist the first
    worker to ask makes it (under a file lock, in the run's common temporary folder) and the others read its record."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make(tmp_path_factory.mktemp(name))
    from filelock import FileLock
    common = tmp_path_factory.getbasetemp().parent
    record = common / f"{name}.json"
    with FileLock(str(record) + ".lock"):
        if not record.exists():
            made = make(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=common)))
            record.write_text(json.dumps({key: [isinstance(value, Path), str(value)] for key, value in made.items()}))
    return {key: Path(value) if is_path else value for key, (is_path, value) in json.loads(record.read_text()).items()}


def run_export(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m export ...` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "export", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def export_in_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m export ...` run in this process, as the command line runs it (export.cli.main) but without a second
    torch import: its exit code and what it printed. For fixtures whose module changes no global state of ours."""
    from export.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit:  # argparse's own errors
            code = exit.code
    return subprocess.CompletedProcess(["python", "-m", "export", *args], code, out.getvalue(), err.getvalue())


def run_measure(*args: str, cwd: Path = ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m measure ...` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "measure", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="session")
def resnet18_export(tmp_path_factory) -> dict:
    """resnet18, random weights: every artifact, the manifest and model-store/resnet18.mar."""
    def make(base: Path) -> dict:
        out, store = base / "artifacts", base / "model-store"
        result = run_export("resnet", "--arch", "resnet18", "--weights", "random", "--out", str(out),
                            "--model-store", str(store), "--max-batch-delay", "40")
        assert result.returncode == 0, result.stdout + result.stderr
        return {"out": out, "model_store": store, "archive": store / "resnet18.mar", "model_name": "resnet18",
                "stdout": result.stdout, "stderr": result.stderr}
    return made_once(tmp_path_factory, "resnet18", make)


@pytest.fixture(scope="session")
def resnet18_unpacked(resnet18_export, tmp_path_factory) -> Path:
    """resnet18.mar unpacked as TorchServe unpacks it: the folder the handler runs in."""
    import zipfile
    folder = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(resnet18_export["archive"]) as archive:
        archive.extractall(folder)
    return folder


LITE0_FORMATS = "traced,scripted,onnx-traced,onnx-scripted"
# For exports whose tests never read the forms' latency (for information only, never read back; measured about a
# second a form, warm-up included): tests/export/package/test_report.py is the test of the latency table.
NO_LATENCY = ("--no-benchmark",)


@pytest.fixture(scope="session")
def lite0_int8_export(tmp_path_factory) -> dict:
    """efficientnet-lite0, the packaged ImageNet weights, --precision fp32,int8 (gated, with its fp32
    fallback): the TorchScript and legacy ONNX artifacts (torch.export's two, about 40 s, are left to the zoo's
    lite0 and test_export_resnet), the manifest and model-store/efficientnet-lite0.mar."""
    from contract.records import Manifest
    base = tmp_path_factory.mktemp("lite0-int8")
    out, store = base / "artifacts", base / "model-store"
    result = run_export("efficientnet", "--arch", "lite0", "--precision", "fp32,int8", "--out", str(out),
                        "--formats", LITE0_FORMATS, "--model-store", str(store), *NO_LATENCY, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"out": out, "store": store, "archive": store / "efficientnet-lite0.mar", "model_name": "efficientnet-lite0",
            "stdout": result.stdout, "manifest": Manifest.read(out)}


@pytest.fixture(scope="session")
def aoti_export(tmp_path_factory) -> dict:
    """A small user model with torch.export's own artifacts only (--formats exported,aotinductor): the
    ExportedProgram and an AOTInductor package compiled for this CPU (~15 s)."""
    from contract.records import Manifest
    out = tmp_path_factory.mktemp("aoti") / "plain"
    result = run_export("module", str(ROOT / "tests" / "export" / "user_models" / "models_for_tests.py") + ":plain",
                        "--input-shape", "1,3,16,16", "--out", str(out), "--formats", "exported,aotinductor")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"out": out, "stdout": result.stdout, "manifest": Manifest.read(out)}


@pytest.fixture(scope="session")
def resnet18_server(resnet18_export, tmp_path_factory):
    """TorchServe with this machine's serving policy and nothing else special, serving resnet18.mar on free loopback
    ports, ready once it answered a real prediction; stopped (whole process group) when the session ends. A test that
    needs another setting (batching, token auth, a worker killed or hung) starts its own server."""
    from serving.torchserve import server
    run_dir = tmp_path_factory.mktemp("resnet18-server")
    settings = server.on_free_ports(resnet18_export["model_store"], run_dir)
    settings.model_name = resnet18_export["model_name"]
    with server.running(settings, CAT):
        yield settings
    survivors = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.strip()
    assert not survivors, f"TorchServe processes survived stop(): {survivors}"


@pytest.fixture(scope="session")
def resnet18_inprocess_bench(resnet18_export, tmp_path_factory) -> dict:
    """`python -m measure inprocess` on the session's resnet18 export, at the smallest settings that still time every
    artifact (batches 1 and 2, one thread, one run in each of two rounds): its folder (bench.md, .json, .png) and what
    it printed."""
    out = tmp_path_factory.mktemp("inprocess-bench")
    done = run_measure("inprocess", str(resnet18_export["out"]), "--batches", "1,2", "--threads", "1", "--repeats",
                       "1", "--rounds", "2", "--warmup", "1", "--min-seconds", "0", "--gemm-size", "256",
                       "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return {"out": out, "stdout": done.stdout}


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a module's tests: small convolutions and gathers (MTCNN's) run faster than handed
    between two, and the other test worker keeps the second core."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def mtcnn_detector():
    """MTCNN with facenet-pytorch's trained networks (its tests skip where the wheel is not installed)."""
    from models import mtcnn
    return mtcnn.trained_detector()
