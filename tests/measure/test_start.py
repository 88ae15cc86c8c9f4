"""`python -m measure start` (measure/start.py): the phases each process wrote, as a table with the CPU named; an
empty store is refused with what to do. The figures themselves are a benchmark's (docs/results/), never a test's."""

from __future__ import annotations

from handlers.start_phases import PHASES, StartPhases, read_phases
from measure.start import SHOWN, main, report
from tests.conftest import run_measure


def test_every_phase_of_every_process_is_a_column_and_the_cpu_is_named(tmp_path):
    run_dir = tmp_path / "run"
    answered = StartPhases.begin()
    answered.folder = run_dir / "start-phases"
    for phase in PHASES[1:-1]:
        with answered.timed(phase):
            pass
    answered.opened("efficientnet-lite0", "v1")
    answered.answered(0.05)
    phases = read_phases(run_dir)
    assert [p["model"] for p in phases] == ["efficientnet-lite0"] and set(phases[0]["seconds"]) == set(PHASES)
    run = {"engine": "kserve", "cold": True, "cpu": "Some CPU @ 2 GHz", "cores": 2, "returned_s": 4.2,
           "began": phases[0]["born"], "processes": phases + [{**phases[0], "pid": 7, "ready_at": None,
                                                               "seconds": {"process_and_imports": 1.0}}]}
    table = report(run)
    assert "Some CPU @ 2 GHz (2 cores)" in table and "returned after 4.2 s" in table
    assert all(SHOWN[phase] in table.splitlines()[2] for phase in PHASES)
    answered_row, unanswered_row = table.splitlines()[4:6]
    assert answered_row.startswith("| pid ") and "efficientnet-lite0 v1" in answered_row
    assert unanswered_row.startswith("| pid 7 |") and unanswered_row.split("|")[-3] == "  "  # no first answer: no ready
    assert "CPU to open" in table and float(answered_row.split("|")[-2]) >= 0  # the process's CPU before opening
    assert set(phases[0]["cpu_seconds"]) == set(PHASES) - {"first_answer"}  # the first answer is timed in seconds only


def test_a_store_without_an_archive_is_refused_with_what_to_do(tmp_path, capsys):
    assert main(["--store", str(tmp_path)]) == 2
    assert "python -m export" in capsys.readouterr().err


def test_it_is_a_measure_command():
    result = run_measure("start", "--help")
    assert result.returncode == 0 and "--store" in result.stdout
