"""Store, broker, workers, Flower and the console on a Redis behind TLS (``rediss://``).

The test makes a CA, a server certificate for 127.0.0.1 and a client certificate with
``openssl``, and starts a private ``redis-server`` that listens on TLS only (``--port 0``),
with and without ``--tls-auth-clients``. The certificates reach redis-py and kombu through
``RUNNER_REDIS_SSL_*`` settings alone: the URL carries none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from runner.distributed.client import submit
from runner.embedded import ping
from runner.errors import StoreUnavailable
from runner.settings import reset_settings
from runner.store.redis import RedisProvider
from tests._dist_support import eventually, finished, private_pool
from tests.console_support import flower, serving
from tests.flows.production import ProdSplit
from tests.redis_servers import Certificates, free_port, make_certificates, redis_server

pytestmark = pytest.mark.processes  # TLS redis-servers of its own (and openssl)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@contextlib.contextmanager
def tls_redis(folder: Path, certs: Certificates, auth_clients: bool) -> Iterator[str]:
    """A TLS-only ``redis-server``; yields its ``rediss://`` URL (database 0)."""
    port = free_port()
    with redis_server(
        folder,
        *("--tls-port", str(port), "--tls-ca-cert-file", str(certs.ca)),
        *("--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key)),
        *("--tls-auth-clients", "yes" if auth_clients else "no"),
        port=0,
    ):
        yield f"rediss://127.0.0.1:{port}/0"


def tls_env(certs: Certificates, client_cert: bool) -> dict[str, str]:
    """The ``RUNNER_REDIS_SSL_*`` settings: the CA, and the client certificate if asked."""
    env = {"RUNNER_REDIS_SSL_CA_CERTS": str(certs.ca)}
    if client_cert:
        env["RUNNER_REDIS_SSL_CERTFILE"] = str(certs.client_cert)
        env["RUNNER_REDIS_SSL_KEYFILE"] = str(certs.client_key)
    return env


@pytest.fixture
def use_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, str]], None]]:
    """Set ``RUNNER_*`` variables of this process (the producer's) and re-read the settings."""

    def apply(env: dict[str, str]) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        reset_settings()

    yield apply
    monkeypatch.undo()
    reset_settings()


@pytest.mark.slow
@pytest.mark.parametrize("auth_clients", [True, False], ids=["client-cert", "server-cert-only"])
def test_a_flow_runs_on_workers_over_tls_and_flower_and_the_console_see_it(
    auth_clients: bool,
    certs: Certificates,
    worker_env: dict[str, str],
    tmp_path: Path,
    use_env: Callable[[dict[str, str]], None],
) -> None:
    with tls_redis(tmp_path, certs, auth_clients) as url:
        env = {"RUNNER_REDIS_URL": url, **tls_env(certs, client_cert=auth_clients)}
        use_env(env)
        with private_pool(worker_env, str(tmp_path), **env) as (pool, rt, full_env):
            assert rt.app.conf.broker_url == url  # the URL as configured: no paths in it
            assert rt.app.conf.broker_use_ssl["ssl_ca_certs"] == str(certs.ca)
            # The broker is the store's server: steps are still sent inside the commit.
            assert rt.sends_in_commit
            pool.start()
            with flower(full_env, str(tmp_path)) as flower_url:
                handle = submit(ProdSplit, rt=rt)
                assert handle.result(timeout=60) == ["a", "b", "c"]
                assert len(finished(rt, handle.run_id)) == 5

                def flower_tasks() -> set[str]:
                    tasks = httpx.get(f"{flower_url}/api/tasks", timeout=5).json()
                    return {t["name"] for t in tasks.values() if t["state"] == "SUCCESS"}

                names = eventually(lambda: len(flower_tasks()) == 5 and flower_tasks(), 20)
                assert names == {f"ProdSplit.{m}" for m in ("root", "a", "b", "c", "join")}
            with serving(rt) as console:
                runs = httpx.get(f"{console}/api/runs", timeout=10).json()
                assert handle.run_id in str(runs)


def test_a_server_requiring_a_client_certificate_refuses_a_client_without_one(
    certs: Certificates, tmp_path: Path, use_env: Callable[[dict[str, str]], None]
) -> None:
    with tls_redis(tmp_path, certs, auth_clients=True) as url:
        use_env(tls_env(certs, client_cert=False))
        with pytest.raises(StoreUnavailable) as caught:
            ping(url)
        assert "does not answer" in str(caught.value) and "\n" not in str(caught.value)
        use_env(tls_env(certs, client_cert=True))
        ping(url)
        store = RedisProvider(url, prefix="tls-test")
        try:
            assert store.client.ping()
            assert store.client.connection_pool.connection_kwargs["ssl_certfile"] == str(
                certs.client_cert
            )
        finally:
            store.close()


def test_a_server_certificate_of_another_ca_is_refused(
    certs: Certificates, tmp_path: Path, use_env: Callable[[dict[str, str]], None]
) -> None:
    (tmp_path / "other").mkdir()
    other = make_certificates(tmp_path / "other")
    with tls_redis(tmp_path, certs, auth_clients=False) as url:
        use_env({"RUNNER_REDIS_SSL_CA_CERTS": str(other.ca)})
        with pytest.raises(StoreUnavailable, match="certificate verify failed"):
            ping(url)
        # Unchecked on request only: RUNNER_REDIS_SSL_CERT_REQS=none accepts it.
        use_env({"RUNNER_REDIS_SSL_CERT_REQS": "none"})
        ping(url)
