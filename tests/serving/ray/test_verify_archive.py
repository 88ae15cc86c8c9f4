"""The Ray engine's check before Serve starts a replica (serving/ray/server.py verify_archive): every form the
archive may serve on this machine is the file its manifest recorded, not only the one the export chose for its
target, since the replica measures which serves (runtime/form_choice.py)."""

import zipfile

import pytest

from runtime import IntegrityError
from runtime.form_choice import may_serve_here
from runtime.machine import this_machine_profile
from serving.ray.server import verify_archive

pytestmark = pytest.mark.slow


def test_a_tampered_candidate_that_may_serve_here_is_refused_though_the_export_chose_another(lite0_int8_export,
                                                                                          tmp_path):
    manifest = lite0_int8_export["manifest"]
    met = may_serve_here(manifest, this_machine_profile("cpu"))
    assert len(met) >= 2, met  # the gated int8 and an fp32 form
    other = next(kind for kind in met if kind != manifest.decision().served)
    tampered_path = manifest.artifacts[other].path
    verify_archive(lite0_int8_export["archive"])  # as exported: every candidate is its recorded file
    tampered = tmp_path / "tampered.mar"
    with zipfile.ZipFile(lite0_int8_export["archive"]) as source, zipfile.ZipFile(tampered, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            target.writestr(item, data[:-1] + bytes([data[-1] ^ 0xFF]) if item.filename == tampered_path else data)
    with pytest.raises(IntegrityError, match=f"{tampered_path}: sha256 "):
        verify_archive(tampered)
