"""Redis Sentinel over TLS: ``rediss+sentinel://`` for store, broker and result backend.

On loopback a TLS-only group private to the test: a primary and a replica (``--port 0
--tls-port``, ``tls-replication yes``) and three TLS-only sentinels, every node requiring a
client certificate of the test's CA. The ``RUNNER_REDIS_SSL_*`` settings reach the
connections to the sentinels (redis-py's, kombu's and Celery's ``sentinel_kwargs``) as well
as those to the group's primary. The fast tests at the top start no server.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.connection import SSLConnection
from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

from runner.distributed.client import submit
from runner.embedded import ping
from runner.errors import StoreUnavailable
from runner.settings import RunnerSettings
from runner.store import connection
from runner.store.connection import BadRedisSettings, SentinelGroup
from runner.store.models import RunStatus
from tests._dist_support import finished, private_pool
from tests.flows.production import ProdSplit
from tests.redis_servers import (
    SERVICE,
    Certificates,
    RedisProcess,
    free_port,
    make_certificates,
    redis_server,
    tls_args,
    tls_sentinel,
)
from tests.test_tls import use_env  # noqa: F401  (fixture)

TLS = {
    "redis_ssl_ca_certs": "/certs/ca.crt",
    "redis_ssl_certfile": "/certs/client.crt",
    "redis_ssl_keyfile": "/certs/client.key",
}
SSL_OPTIONS = {
    "ssl_ca_certs": "/certs/ca.crt",
    "ssl_certfile": "/certs/client.crt",
    "ssl_keyfile": "/certs/client.key",
    "ssl_cert_reqs": "required",
}


# --- no servers -----------------------------------------------------------------------------


def test_a_tls_sentinel_url_gives_kombu_and_the_backend_tls_to_the_sentinels_and_primary() -> None:
    settings = RunnerSettings(
        redis_ssl_ca_certs=TLS["redis_ssl_ca_certs"],
        redis_ssl_certfile=TLS["redis_ssl_certfile"],
        redis_ssl_keyfile=TLS["redis_ssl_keyfile"],
    )
    url = f"rediss+sentinel://127.0.0.1:26379,127.0.0.1:26380/{SERVICE}/3"
    assert SentinelGroup.parse(url) == SentinelGroup(
        (("127.0.0.1", 26379), ("127.0.0.1", 26380)), SERVICE, 3, tls=True
    )
    assert connection.is_sentinel(url) and connection.is_tls(url)
    assert connection.client_options(url, settings) == SSL_OPTIONS
    conf = connection.celery_conf(url, url, settings)
    kombu_form = "sentinel://127.0.0.1:26379/3;sentinel://127.0.0.1:26380/3"
    assert conf["broker_url"] == conf["result_backend"] == kombu_form
    assert conf["broker_use_ssl"] == conf["redis_backend_use_ssl"] == SSL_OPTIONS
    sentinels = {"ssl": True, **SSL_OPTIONS}
    for key in connection.TRANSPORT_OPTIONS:
        assert conf[key] == {"master_name": SERVICE, "sentinel_kwargs": sentinels}
    assert conf[connection.BROKER_REDIS_URL] == url
    # Without TLS nothing changes: no TLS options, kombu's own options for the sentinels.
    plain = connection.celery_conf(url.replace("rediss+", "redis+"), None, settings)
    assert "broker_use_ssl" not in plain
    assert plain["broker_transport_options"] == {"master_name": SERVICE}
    assert SentinelGroup.parse(url.replace("rediss+", "redis+")).tls is False


def test_a_config_file_s_sentinel_kwargs_are_kept_beside_the_tls_ones() -> None:
    settings = RunnerSettings(redis_ssl_ca_certs=TLS["redis_ssl_ca_certs"])
    url = f"rediss+sentinel://127.0.0.1:26379/{SERVICE}/0"
    ours = connection.celery_conf(url, None, settings)["broker_transport_options"]
    given = {"visibility_timeout": 99, "sentinel_kwargs": {"socket_timeout": 3, "ssl": False}}
    assert connection.merged_options(given, ours) == {
        "visibility_timeout": 99,
        "master_name": SERVICE,
        # The file's timeout is kept; TLS is the URL's to decide.
        "sentinel_kwargs": {
            "socket_timeout": 3,
            "ssl": True,
            "ssl_ca_certs": TLS["redis_ssl_ca_certs"],
            "ssl_cert_reqs": "required",
        },
    }


def test_a_tls_sentinel_client_speaks_tls_to_the_sentinels_and_to_the_primary(
    use_env: Callable[[dict[str, str]], None],  # noqa: F811
) -> None:
    use_env({f"RUNNER_{key.upper()}": value for key, value in TLS.items()})
    url = f"rediss+sentinel://127.0.0.1:26379,127.0.0.1:26380/{SERVICE}/2"
    client = connection.client(url, socket_timeout=1.5)  # connects lazily: no server needed
    pool = client.connection_pool
    assert pool.connection_class is SentinelManagedSSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == TLS["redis_ssl_ca_certs"]
    assert pool.connection_kwargs["db"] == 2
    for node in pool.sentinel_manager.sentinels:
        assert node.connection_pool.connection_class is SSLConnection
        kwargs = node.connection_pool.connection_kwargs
        assert kwargs["ssl_certfile"] == TLS["redis_ssl_certfile"]
        assert kwargs["socket_timeout"] == 1.5
    plain = connection.client(url.replace("rediss+", "redis+"))
    assert plain.connection_pool.connection_class is SentinelManagedConnection
    sentinel = plain.connection_pool.sentinel_manager.sentinels[0]
    assert sentinel.connection_pool.connection_class is redis.Connection


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("rediss+sentinel://127.0.0.1:26379", r"rediss\+sentinel://HOST:PORT,HOST:PORT/SERVICE/DB"),
        ("rediss+sentinel://sentinel-1/svc/0", r"rediss\+sentinel://: 'sentinel-1' is not HOST"),
        (f"rediss+sentinel://127.0.0.1:1/{SERVICE}/x", r"/SERVICE/DB \(sentinels"),
    ],
)
def test_a_malformed_tls_sentinel_url_is_one_clear_line(url: str, message: str) -> None:
    with pytest.raises(BadRedisSettings, match=message) as caught:
        ping(url)
    assert "\n" not in str(caught.value)


# --- a TLS-only Sentinel group --------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def tls_env(certs: Certificates) -> dict[str, str]:
    """The ``RUNNER_REDIS_SSL_*`` settings: the CA and the client certificate."""
    return {
        "RUNNER_REDIS_SSL_CA_CERTS": str(certs.ca),
        "RUNNER_REDIS_SSL_CERTFILE": str(certs.client_cert),
        "RUNNER_REDIS_SSL_KEYFILE": str(certs.client_key),
    }


def tls_node(
    folder: Path, certs: Certificates, *args: str, port: int | None = None
) -> contextlib.AbstractContextManager[RedisProcess]:
    """A TLS-only data node of the group (replicating over TLS)."""
    tls_port = str(port or free_port())
    return redis_server(
        folder, "--tls-port", tls_port, "--tls-replication", "yes", *tls_args(certs), *args, port=0
    )


def _client(port: int, certs: Certificates) -> Any:  # redis-py's typing of replies is loose
    return redis.Redis(
        port=port,
        ssl=True,
        ssl_ca_certs=str(certs.ca),
        ssl_certfile=str(certs.client_cert),
        ssl_keyfile=str(certs.client_key),
    )


@contextlib.contextmanager
def tls_sentinel_group(
    folder: Path, certs: Certificates
) -> Iterator[tuple[RedisProcess, list[RedisProcess]]]:
    """A TLS primary, a TLS replica in sync with it, and three TLS sentinels that see both."""
    with contextlib.ExitStack() as stack:
        primary = stack.enter_context(tls_node(folder, certs))
        replica = stack.enter_context(
            tls_node(folder, certs, "--replicaof", "127.0.0.1", str(primary.port))
        )
        sentinels = [
            stack.enter_context(tls_sentinel(folder, primary.port, certs)) for _ in range(3)
        ]
        deadline = time.monotonic() + 15
        while not _ready(replica, sentinels, certs):
            assert time.monotonic() < deadline, "the TLS Sentinel group did not settle"
            time.sleep(0.1)
        yield primary, sentinels


def _ready(replica: RedisProcess, sentinels: list[RedisProcess], certs: Certificates) -> bool:
    if _client(replica.port, certs).info("replication")["master_link_status"] != "up":
        return False
    for node in sentinels:
        master = _client(node.port, certs).sentinel_master(SERVICE)
        if master["num-slaves"] < 1 or master["num-other-sentinels"] < 2:
            return False
    return True


def tls_sentinel_url(sentinels: list[RedisProcess]) -> str:
    hosts = ",".join(f"127.0.0.1:{node.port}" for node in sentinels)
    return f"rediss+sentinel://{hosts}/{SERVICE}/0"


def primary_port(sentinels: list[RedisProcess], certs: Certificates) -> int:
    """The port of the primary the sentinels name now."""
    _host, port = _client(sentinels[0].port, certs).sentinel_get_master_addr_by_name(SERVICE)
    return int(port)


@pytest.mark.processes
def test_a_plain_sentinel_url_cannot_reach_a_tls_group_and_says_so_in_one_line(
    certs: Certificates,
    tmp_path: Path,
    use_env: Callable[[dict[str, str]], None],  # noqa: F811
) -> None:
    with tls_sentinel_group(tmp_path, certs) as (_primary, sentinels):
        url = tls_sentinel_url(sentinels)
        use_env(tls_env(certs))
        ping(url)  # the same group, over TLS: it answers
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            ping(url.replace("rediss+sentinel://", "redis+sentinel://", 1))
        print(f"refused in {time.monotonic() - began:.2f} s: {caught.value}")
        assert time.monotonic() - began < 5  # refused, not left hanging
        message = str(caught.value)
        assert "\n" not in message
        assert message.endswith(f"no sentinel answered with a primary for {SERVICE!r}")


@pytest.mark.slow
def test_flows_run_over_a_tls_sentinel_group_and_finish_after_its_primary_dies(
    certs: Certificates,
    worker_env: dict[str, str],
    tmp_path: Path,
    use_env: Callable[[dict[str, str]], None],  # noqa: F811
) -> None:
    with (
        tls_sentinel_group(tmp_path, certs) as (primary, sentinels),
        contextlib.ExitStack() as stack,
    ):
        # Results kept too: Celery's Sentinel result backend then writes over TLS as well.
        env = {
            "RUNNER_REDIS_URL": tls_sentinel_url(sentinels),
            "RUNNER_TASK_RESULTS": "true",
            **tls_env(certs),
        }
        use_env(env)
        with private_pool(worker_env, str(tmp_path), **env) as (pool, rt, _):
            conf = rt.app.conf
            assert conf.broker_url.startswith("sentinel://127.0.0.1:")
            assert conf.broker_transport_options["sentinel_kwargs"]["ssl"] is True
            assert conf.result_backend_transport_options["sentinel_kwargs"]["ssl"] is True
            assert rt.store.wait_replicas == 1  # on by default with Sentinel, over TLS too
            assert not rt.sends_in_commit
            pool.start(concurrency=2)
            first = submit(ProdSplit, rt=rt)
            assert first.result(timeout=60) == ["a", "b", "c"]
            commits = Counter(c.step for c in finished(rt, first.run_id))
            assert commits == dict.fromkeys(("root", "a", "b", "c", "join"), 1)
            node = _client(primary.port, certs)
            assert node.keys("celery-task-meta-*"), "no result reached the backend"

            # A few more, and the primary dies while some are mid-step.
            handles = [submit(ProdSplit, {"pause": 0.3}, rt=rt) for _ in range(4)]
            deadline = time.monotonic() + 20
            while not any(h.status() is RunStatus.RUNNING for h in handles):
                assert time.monotonic() < deadline, "no run started"
                time.sleep(0.05)
            time.sleep(0.3)
            running = [h for h in handles if h.status() is RunStatus.RUNNING]
            primary.kill()
            print(f"primary killed with {len(running)} of {len(handles)} runs running")
            assert running
            deadline = time.monotonic() + 20
            while primary_port(sentinels, certs) == primary.port:
                assert time.monotonic() < deadline, "Sentinel did not promote the replica"
                time.sleep(0.1)
            # The dead node comes back as a replica of the new primary: commits wait for one.
            stack.enter_context(
                tls_node(
                    tmp_path,
                    certs,
                    *("--replicaof", "127.0.0.1", str(primary_port(sentinels, certs))),
                    port=primary.port,
                )
            )
            for handle in handles:
                assert handle.result(timeout=60) == ["a", "b", "c"]
            for handle in handles:
                commits = Counter(c.step for c in finished(rt, handle.run_id))
                assert commits == dict.fromkeys(("root", "a", "b", "c", "join"), 1)
