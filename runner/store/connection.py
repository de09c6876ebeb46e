"""How every process connects to Redis: TLS, ACL credentials and Sentinel, decided once.

A Redis URL names where Redis is (``redis://``, ``rediss://`` for TLS, ``unix://``,
``redis+cluster://`` or ``redis+sentinel://H:P,H:P,H:P/SERVICE/DB``); the settings say how to
talk to it: ``RUNNER_REDIS_USERNAME`` and ``RUNNER_REDIS_PASSWORD`` (or
``RUNNER_REDIS_PASSWORD_FILE``) for an ACL user, ``RUNNER_REDIS_SSL_*`` for TLS. A password
never has to be put in a URL or on a command line, where ``ps`` and logs would show it; one in
the URL still wins over the settings'.

:func:`client` gives the redis-py client of the store, the probes and the broker's
maintenance reads; :func:`celery_conf` the matching Celery settings of broker and result
backend (kombu's Redis or Sentinel transport).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import redis
from redis.sentinel import MasterNotFoundError, Sentinel

from runner.errors import StoreError
from runner.settings import RunnerSettings, get_settings

SENTINEL_SCHEME = "redis+sentinel://"
"""URL scheme of a Sentinel group: ``redis+sentinel://H:P,H:P/SERVICE/DB``."""
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
"""URL schemes of a Redis Cluster (``redis+cluster://host:port``: any node of it)."""
_TLS_SCHEMES = ("rediss://", "rediss+cluster://")
BROKER_REDIS_URL = "runner_broker_redis_url"
"""The Celery setting :func:`celery_conf` keeps a Sentinel broker's ``redis+sentinel://`` URL
in (``broker_url`` holds kombu's form of it), for :func:`client`."""
TRANSPORT_OPTIONS = ("broker_transport_options", "result_backend_transport_options")
"""The Celery settings :func:`celery_conf` may give that merge with a config file's own."""


class BadRedisSettings(StoreError):
    """A Redis URL or connection setting that cannot be used (a Sentinel URL without its
    service, a password file that cannot be read): bad input, not a Redis that is down."""


@dataclass(frozen=True)
class SentinelGroup:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int

    @classmethod
    def parse(cls, url: str) -> SentinelGroup:
        """The group of ``url`` (:class:`BadRedisSettings` if it names none)."""
        rest = url[len(SENTINEL_SCHEME) :]
        hosts, _, path = rest.partition("/")
        service, _, db = path.partition("/")
        sentinels = []
        for item in filter(None, hosts.rpartition("@")[2].split(",")):
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise BadRedisSettings(f"{SENTINEL_SCHEME}: {item!r} is not HOST:PORT")
            sentinels.append((host, int(port)))
        if not sentinels or not service or not (db or "0").isdigit():
            raise BadRedisSettings(
                f"a Sentinel URL is {SENTINEL_SCHEME}HOST:PORT,HOST:PORT/SERVICE/DB "
                f"(sentinels, the monitored service's name, the database number)"
            )
        return cls(tuple(sentinels), service, int(db or 0))


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names a Sentinel group."""
    return url.startswith(SENTINEL_SCHEME)


def password(settings: RunnerSettings | None = None) -> str | None:
    """The ACL password of the settings: ``RUNNER_REDIS_PASSWORD``, else the first line of
    ``RUNNER_REDIS_PASSWORD_FILE`` (read at each connection, so a rotated file is seen)."""
    settings = settings or get_settings()
    if settings.redis_password:
        return settings.redis_password
    if not settings.redis_password_file:
        return None
    try:
        text = Path(settings.redis_password_file).read_text()
    except OSError as exc:
        raise BadRedisSettings(
            f"RUNNER_REDIS_PASSWORD_FILE cannot be read: {exc.strerror}: "
            f"{settings.redis_password_file}"
        ) from None
    lines = text.splitlines()
    return lines[0] if lines else ""


def credentials(url: str, settings: RunnerSettings | None = None) -> dict[str, str]:
    """``username``/``password`` for redis-py from the settings, unless ``url`` has its own
    (which redis-py reads itself, except from a Sentinel URL: those are returned here)."""
    settings = settings or get_settings()
    own = urlsplit(url)
    found: dict[str, str | None]
    if own.password is None:
        found = {"username": settings.redis_username, "password": password(settings)}
    elif is_sentinel(url):
        found = {"username": unquote(own.username or ""), "password": unquote(own.password)}
    else:
        return {}
    return {key: value for key, value in found.items() if value}


def tls_options(settings: RunnerSettings | None = None) -> dict[str, str]:
    """The ``ssl_*`` options of a TLS connection that the settings give (redis-py's and
    kombu's names: the same)."""
    settings = settings or get_settings()
    found = {
        "ssl_ca_certs": settings.redis_ssl_ca_certs,
        "ssl_certfile": settings.redis_ssl_certfile,
        "ssl_keyfile": settings.redis_ssl_keyfile,
        "ssl_cert_reqs": settings.redis_ssl_cert_reqs,
    }
    return {key: value for key, value in found.items() if value}


def client_options(url: str, settings: RunnerSettings | None = None) -> dict[str, Any]:
    """redis-py keyword arguments for ``url``: credentials, and TLS options on ``rediss``."""
    options: dict[str, Any] = credentials(url, settings)
    if url.startswith(_TLS_SCHEMES):
        options.update(tls_options(settings))
    return options


def client(url: str, **kwargs: Any) -> Any:
    """A redis-py client for ``url`` with the settings' credentials and TLS options: the
    Sentinel group's current primary for ``redis+sentinel://`` (found again after a
    failover), a :class:`~redis.cluster.RedisCluster` for the ``+cluster`` schemes.
    ``kwargs`` are redis-py's (timeouts, retry)."""
    options = {**client_options(url), **kwargs}
    if is_sentinel(url):
        group = SentinelGroup.parse(url)
        timeouts = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
        sentinel = Sentinel(list(group.sentinels), sentinel_kwargs=timeouts, **options)
        return sentinel.master_for(group.service, db=group.db)
    for scheme in CLUSTER_SCHEMES:
        if url.startswith(scheme):
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(url.replace("+cluster", "", 1), **options)
    return redis.Redis.from_url(url, **options)


def describe(exc: BaseException) -> str:
    """One short line for a connection error (redis-py's ``MasterNotFoundError`` names the
    repr of every sentinel client it tried)."""
    if isinstance(exc, MasterNotFoundError):
        service = str(exc).split("'")[1] if str(exc).count("'") >= 2 else "the service"
        return f"no sentinel answered with a primary for {service!r}"
    return " ".join(str(exc).split())


def celery_conf(
    broker_url: str, backend_url: str | None, settings: RunnerSettings | None = None
) -> dict[str, Any]:
    """Celery settings for a Redis ``broker_url`` and result ``backend_url``: a Sentinel URL
    becomes kombu's ``sentinel://`` transport on the same group, TLS options go in
    ``broker_use_ssl`` and ``redis_backend_use_ssl``, credentials in ``broker_user`` /
    ``broker_password`` (the broker URL stays as configured) and in the backend's URL, which
    lives in this process only."""
    settings = settings or get_settings()
    conf: dict[str, Any] = {"broker_url": broker_url, "result_backend": backend_url}
    if broker_url.startswith(("redis", "unix")):
        creds = credentials(broker_url, settings)
        if creds:
            conf["broker_user"] = creds.get("username")
            conf["broker_password"] = creds.get("password")
        if broker_url.startswith("rediss"):
            conf["broker_use_ssl"] = tls_options(settings)
        if is_sentinel(broker_url):
            group = SentinelGroup.parse(broker_url)
            conf["broker_url"] = ";".join(
                f"sentinel://{host}:{port}/{group.db}" for host, port in group.sentinels
            )
            conf["broker_transport_options"] = {"master_name": group.service}
            conf[BROKER_REDIS_URL] = broker_url
    if backend_url and backend_url.startswith("redis"):
        creds = credentials(backend_url, settings)
        if is_sentinel(backend_url):
            group = SentinelGroup.parse(backend_url)
            hosts = ";".join(f"sentinel://{h}:{p}/{group.db}" for h, p in group.sentinels)
            conf["result_backend"] = hosts
            conf["result_backend_transport_options"] = {"master_name": group.service}
        if creds:
            conf["result_backend"] = _with_credentials(conf["result_backend"], creds)
        if backend_url.startswith("rediss"):
            conf["redis_backend_use_ssl"] = tls_options(settings)
    return conf


def _with_credentials(url: str, creds: dict[str, str]) -> str:
    """``url`` (each ``;``-separated part) with ``creds`` as its userinfo."""
    user = quote(creds.get("username", ""), safe="")
    secret = quote(creds.get("password", ""), safe="")
    parts = []
    for part in url.split(";"):
        scheme, sep, rest = part.partition("://")
        parts.append(f"{scheme}{sep}{user}:{secret}@{rest}")
    return ";".join(parts)
