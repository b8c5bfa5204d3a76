"""Preflight: the filesystem and the tracking store checked before any stage spends time."""

import http.server
import threading

import pytest

from clusterft.errors import ConfigError
from clusterft.io.preflight import load_checked
from clusterft.spec.config import check_tracking_uri


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "file:///tmp/mlruns", "mlruns", "/abs/mlruns",
                                 r"C:\mlruns", "postgresql+psycopg2://u@h/db", "mysql://u@h/db",
                                 "databricks", "databricks-uc", "https://mlflow.example.org"])
def test_stores_mlflow_opens_are_accepted(uri):
    assert check_tracking_uri(uri) == uri


@pytest.mark.parametrize("uri", ["bogus://x", "s3://bucket/mlruns", "", "  "])
def test_other_stores_are_refused(uri):
    with pytest.raises(ValueError):
        check_tracking_uri(uri)


def test_the_environment_store_wins_and_is_checked(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://x")
    with pytest.raises(ConfigError, match=r"MLFLOW_TRACKING_URI \(environment\): 'bogus://x'"):
        load_checked(None, [])


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args):
        pass


def test_an_http_store_must_answer_its_health_check(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_port}"
        assert load_checked(None, [f"tracking.tracking_uri={uri}"]).tracking.tracking_uri == uri
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ConfigError, match="does not answer"):
        load_checked(None, [f"tracking.tracking_uri={uri}"])  # the same server, stopped
