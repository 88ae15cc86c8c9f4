"""The LitServe peer is the same model and preprocessing as ours: started as the benchmark starts it (a real
LitServe on a free loopback port), it answers a real form upload with the top-5 our handler's core gives for
the same image, and stopping it leaves none of its processes (server, API servers, workers) behind."""

from __future__ import annotations

import os

import pytest
import requests

from handlers.core import ImageCore
from measure.served import peer as bench_peer
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not bench_peer.installed(), reason="litserve is not installed (the dev extra)")]


def _group(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            state = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[0]
            if os.getpgid(int(name)) == pgid and state != "Z":
                found.append(int(name))
        except (ProcessLookupError, FileNotFoundError):
            continue
    return found


def test_the_peer_answers_with_our_top5_and_stops_with_its_workers(resnet18_export, tmp_path):
    image = ROOT / "examples" / "cat.jpg"
    with bench_peer.running(resnet18_export["out"], tmp_path / "peer", image) as peer:
        form = bench_peer.form_body(image, tmp_path)
        answer = requests.post(peer.url, data=form.read_bytes(),
                               headers={"Content-Type": bench_peer.FORM_CONTENT_TYPE}, timeout=60)
        members = _group(peer.process.pid)
    assert answer.status_code == 200, answer.text
    ours = ImageCore.from_folder(resnet18_export["out"], threads=1).answer(image.read_bytes())
    assert [p["index"] for p in answer.json()["predictions"]] == [p["index"] for p in ours["predictions"]]
    assert [p["probability"] for p in answer.json()["predictions"]] == pytest.approx(
        [p["probability"] for p in ours["predictions"]], abs=1e-4)
    assert len(members) >= 3  # the server and its two inference workers at least
    assert _group(peer.process.pid) == []
