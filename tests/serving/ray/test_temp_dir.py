"""Ray's temp dir: in the run dir where its path is short enough for Ray's sockets, else one short folder per run
dir, reused by a restart and removed when our own node has stopped."""

from serving.ray.config import MAX_TEMP_DIR_CHARS, TEMP_DIR, RaySettings


def settings_in(run_dir) -> RaySettings:
    run_dir.mkdir(parents=True, exist_ok=True)
    return RaySettings(run_dir, ("resnet18",), run_dir=run_dir)


def test_a_long_run_dir_gets_one_short_folder_that_a_restart_reuses_and_stop_removes(tmp_path):
    settings = settings_in(tmp_path / ("run-" + "x" * MAX_TEMP_DIR_CHARS))
    first = settings.temp_dir()
    assert len(str(first)) <= MAX_TEMP_DIR_CHARS and first.is_dir()
    (first / "session_latest").mkdir()  # what Ray writes there
    assert settings_in(settings.run_dir).temp_dir() == first  # a restart of the same run dir
    settings.remove_short_temp_dir()
    assert not first.exists() and not (settings.run_dir / TEMP_DIR).is_symlink()

