"""The names of kserve that serving/kserve/app.py's one override relies on (its docstring says why each): a kserve
release that renames or moves one fails here, not in a server that quietly binds 0.0.0.0 or answers with KServe's
own error handlers."""

from __future__ import annotations

import functools
import inspect

import kserve.model_server
import uvicorn
from fastapi import FastAPI
from kserve import ModelServer
from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
from kserve.protocol.rest.server import RESTServer

from serving.kserve.app import OurModelServer, OurRESTServer
from serving.kserve.versions import Versions

HOST = "127.0.0.1"


def test_kserve_makes_its_rest_server_through_the_name_our_server_points_at_ours():
    assert kserve.model_server.RESTServer is RESTServer
    assert "RESTServer(" in inspect.getsource(ModelServer.start)
    assert "self.create_application()" in inspect.getsource(RESTServer.start)


def test_kserve_serves_the_app_our_routes_middleware_and_handlers_are_added_to():
    assert FASTAPI_APP_IMPORT_STRING == "kserve.model_server:app"
    assert isinstance(kserve.model_server.app, FastAPI)
    assert "import_from_string(" in inspect.getsource(RESTServer.create_application)


def test_kserve_has_no_bind_address_of_its_own_and_ours_is_set_in_its_uvicorn_config():
    """Where a kserve release takes a host, the override's first job goes: this test says so."""
    assert "host" not in inspect.signature(ModelServer.__init__).parameters
    assert "host" not in inspect.signature(RESTServer.__init__).parameters
    server = OurModelServer(HOST, Versions(settings=None, make_model=None), http_port=0)
    made = functools.partial(OurRESTServer, server=server)(  # as ModelServer.start makes its REST server
        FASTAPI_APP_IMPORT_STRING, server.dataplane, server.model_repository_extension, server.http_port,
        access_log_format=server.access_log_format, workers=server.workers, grace_period=server.grace_period,
        event_loop=server.event_loop, timeout_keep_alive=server.timeout_keep_alive,
        ssl_certfile=server.ssl_certfile, ssl_keyfile=server.ssl_keyfile)
    assert isinstance(made.config, uvicorn.Config) and made.config.host == HOST
    assert made.dataplane is server.dataplane
