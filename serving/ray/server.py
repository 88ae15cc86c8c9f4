"""The Ray Serve server process: `python -m serving.ray.server RUN_DIR/ray-settings.json` (started by the engine,
in a session of its own). It starts a head node of its own (`ray start --head`, its processes in this session)
or joins the cluster at settings.address, deploys one Serve application per archive at /predictions/NAME with
the replicas of its policy as the run config holds it (and beside it, once it is deployed, its gate: a spare
replica for a rollout's candidate, serving/ray/deployment.py), and stays until SIGTERM: then it removes its
applications, and ends its own head node.
An application that cannot be deployed (an archive failing its sha256 check) stops the start with its reason
(logged after REFUSAL, exit 1).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from contract.errors import INTERRUPTIONS, VisionExportError
from handlers.policy import this_machine_resources
from serving.auth import KEYS_ENV
from serving.processes import sigterm_interrupts
from serving.ray import cluster, signals
from serving.ray.config import NAMESPACE, REFUSAL, RaySettings, deployment_options, gate_app, head_cpus
from serving.settings import ServingError, free_port

logger = logging.getLogger("serving.ray")

# One proxy, on the head node: nodes on one machine would contend for the same port, and a cluster's
# users reach the head (or a load balancer in front of the nodes' proxies, docs/scaling.md).
PROXY_LOCATION = "HeadOnly"
WATCH_INTERVAL_S = 1.0
# The driver's slowest imports (Serve's, which our deployment's module brings), done while the head starts.
DRIVER_IMPORTS = ("ray.serve", "serving.ray.deployment")


def start_head(settings: RaySettings):
    """Our own head node's `ray start`, launched (its processes in this process's session); (that process, the
    address its GCS will answer at): wait_for_head waits for it, meanwhile the driver prepares the deployments."""
    port = settings.gcs_port or free_port()
    command = cluster.node_command(settings.temp_dir(), head_cpus(settings.policies, this_machine_resources().cores),
                                   head_port=port)
    return cluster.start_node(command, settings.log_dir / "ray-head.log"), f"{settings.host}:{port}"


def wait_for_head(settings: RaySettings, node, address: str) -> None:
    """Return once our head node is up, its GCS answering and its raylet registered (ServingError with its log's
    end if `ray start` exits)."""
    cluster.wait_for_gcs(address, node, settings.log_dir / "ray-head.log")
    cluster.wait_for_live_node(address, node, settings.log_dir / "ray-head.log")
    settings.address_file.write_text(address)
    logger.info("started a Ray head node at %s (temp dir %s)", address, settings.temp_dir())


def prepare(settings: RaySettings) -> dict[str, Path]:
    """{name: its archive} with every archive verified, and Serve's and our deployment's imports done: the driver's
    own work, done while a head node of ours starts (its processes on the other cores) instead of after it."""
    from handlers.opening import device_of
    for module in DRIVER_IMPORTS:
        importlib.import_module(module)
    archives = {}
    for name in settings.models:
        archives[name] = settings.archive(name).absolute()  # a rollout's default version, else NAME.mar
        verify_archive(archives[name], device_of(settings.policies[name].device), settings.run_dir.absolute())
    return archives


def deploy(settings: RaySettings, archives: dict[str, Path]) -> None:
    """One application per archive (prepare verified them); each call returns once its replicas run (serve.run
    waits for them), or raises ServingError with Serve's reason when it cannot deploy (a replica's constructor
    failing, e.g. the sha256)."""
    from ray import serve

    from serving.ray.versions import RayVersions
    serve.start(http_options={"host": settings.host, "port": settings.http_port, "location": PROXY_LOCATION})
    folder = signals.metrics_folder(settings.run_dir)  # every replica on this machine writes its metrics there

    def options_of(policy) -> dict:
        return with_key_file(signals.with_metrics_env(deployment_options(policy), folder), settings)
    # up before the models: live at once, ready once every application runs (a client that saw the first answer
    # must find the health address there already); a rollout's steps come to its version routes
    versions = RayVersions(settings, options_of)
    signals.start(settings.host, settings.signals_port, list(settings.models), folder, settings.temp_dir(), versions)
    logger.info("metrics: %s/metrics (health: %s/health/live, %s/health/ready)", settings.signals_url,
                settings.signals_url, settings.signals_url)
    for name in settings.models:
        versions.deploy(name, archives[name])
    for name in settings.models:  # each model's spare for a rollout's candidate, started as the server answers
        if settings.policies[name].device == "gpu":
            continue  # the live replicas hold the GPUs: a spare would wait for one (a rollout deploys it, and waits)
        try:
            versions.gates.deploy(name, wait=False)
        except ServingError as error:  # the models serve without it: a rollout deploys it again, or says why
            logger.warning("%s", error)


def with_key_file(options: dict, settings: RaySettings) -> dict:
    """The deployment's options with its replicas checking callers against the server's key file when token
    authorisation is on (serving/auth.py), wherever Ray starts them."""
    if settings.token_auth:
        options["ray_actor_options"].setdefault("runtime_env", {}).setdefault("env_vars", {})[KEYS_ENV] = \
            str(settings.key_file)
    return options


def verify_archive(archive: Path, device: str = "cpu", run_dir: Path | None = None) -> None:
    """Every form the archive may serve on this machine (the gated candidates it meets: the replica measures which
    serves, runtime/form_choice.py) is the file its manifest recorded, companions included (sha256), checked before
    Serve starts a replica: a tampered archive is refused at once with the reason. Each replica checks the form it
    opens again (the request core), but Serve retries a failing replica constructor several times before it gives
    up (tens of seconds). With the run dir, the archive is unpacked where its replicas open it (handlers/opening.py),
    once for all of them."""
    from contextlib import nullcontext

    from handlers.opening import shared_scratch, unpacked
    from runtime.integrity import verify_archive_signature
    verify_archive_signature(archive)  # who made it, where a key is set
    with (tempfile.TemporaryDirectory(prefix="verify-") if run_dir is None else nullcontext()) as temporary:
        try:
            folder = unpacked(archive, Path(temporary) / "archive" if temporary else shared_scratch(archive, run_dir))
        except zipfile.BadZipFile as error:
            raise ServingError(f"{archive}: not an archive of `python -m export` ({error}); "
                               "rebuild it with `python -m export`") from None
        problems = _form_problems(archive, folder, device)
    if problems:
        from handlers.core import REBUILD
        from runtime.integrity import IntegrityError
        raise IntegrityError(problems, REBUILD)


def _form_problems(archive: Path, folder: Path, device: str) -> dict[str, str]:
    """{archive: path -> why} of each form the unpacked archive may serve here that is not its recorded file."""
    from contract.records import Manifest
    from runtime.form_choice import may_serve_here
    from runtime.integrity import artifact_problems
    from runtime.machine import this_machine_profile
    try:
        manifest = Manifest.read(folder)
        records = [manifest.artifacts[kind] for kind in may_serve_here(manifest, this_machine_profile(device), device)]
    except KeyError as missing:
        raise ServingError(f"{archive}: not an archive of `python -m export` ({missing.args[0]}); "
                           "rebuild it with `python -m export`") from None
    return {f"{archive}: {path}": why for record in records
            for path, why in artifact_problems(folder, record).items()}


def serve_until_stopped(settings: RaySettings, head) -> int:
    """Watch until SIGTERM (0) or our head node's exit (1); Serve itself replaces a replica that dies."""
    try:
        while head is None or head.poll() is None:
            time.sleep(WATCH_INTERVAL_S)
    except INTERRUPTIONS:  # SIGTERM (sigterm_interrupts) or Ctrl-C
        return 0
    logger.error("the Ray head node exited with code %s: %s", head.returncode,
                 cluster.log_tail(settings.log_dir / "ray-head.log"))
    return 1


def remove(settings: RaySettings, own_cluster: bool) -> None:
    """Our applications off the cluster: all of Serve with our own head node, only ours on someone else's."""
    import ray
    from ray import serve
    if not ray.is_initialized():
        return
    if own_cluster:
        serve.shutdown()
    else:
        for name in settings.models:
            serve.delete(name)
            serve.delete(gate_app(name))
    ray.shutdown()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    settings = RaySettings.read(Path(argv[0]))
    sigterm_interrupts()  # a stop while the node starts or Serve deploys still cleans up
    head, code = None, 0
    try:
        head, address = start_head(settings) if settings.address is None else (None, settings.address)
        archives = prepare(settings)  # while the head node starts
        if head is not None:
            wait_for_head(settings, head, address)
        import ray
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
        sigterm_interrupts()  # ray.init put its own in place (sys.exit, which would skip our clean-up)
        deploy(settings, archives)
        code = serve_until_stopped(settings, head)
    except INTERRUPTIONS:
        logger.info("stopped while starting")
    except VisionExportError as error:
        logger.error("%s %s", REFUSAL, error)
        code = error.exit_code
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop: the clean-up itself is not interrupted
    own_cluster = settings.address is None
    try:
        remove(settings, own_cluster)
    finally:
        if own_cluster:
            stop_head(head)
            settings.address_file.unlink(missing_ok=True)
            remove_temp_dir(settings)
    return code


def remove_temp_dir(settings: RaySettings) -> None:
    try:
        settings.remove_short_temp_dir()
    except OSError as error:  # the server has stopped; a folder left behind is told, not fatal
        logger.warning("Ray's temp dir was not removed: %s", error)


def stop_head(head) -> None:
    """Our head node's processes ended (all of this session's but us: a stop while it started included).
    `ray start --block` itself only watches them, and on SIGTERM waits for a drain that has nothing left to
    drain (the applications are gone): it is killed, the node's processes are asked to stop (SIGKILL past
    cluster.NODE_STOP_TIMEOUT_S)."""
    if head is not None:
        head.kill()
        head.wait()
    left = cluster.end_session(os.getsid(0), spare=os.getpid())
    if left:
        logger.warning("Ray process(es) killed, still running %.0f s after SIGTERM: %s", cluster.NODE_STOP_TIMEOUT_S,
                       "; ".join(left))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
