"""How every process connects to Redis: TLS, ACL credentials and Sentinel, decided once.

A Redis URL names where Redis is (``redis://``, ``rediss://`` for TLS, ``unix://``,
``redis+cluster://``, ``redis+sentinel://H:P,H:P,H:P/SERVICE/DB`` or, with TLS to the sentinels
and to the group's primary, ``rediss+sentinel://H:P,H:P,H:P/SERVICE/DB``); the settings say how to
talk to it: ``RUNNER_REDIS_USERNAME`` and ``RUNNER_REDIS_PASSWORD`` (or
``RUNNER_REDIS_PASSWORD_FILE``) for an ACL user, ``RUNNER_REDIS_SSL_*`` for TLS. A password
never has to be put in a URL or on a command line, where ``ps`` and logs would show it; one in
the URL still wins over the settings'.

:func:`client` gives the redis-py client of the store, the probes and the broker's
maintenance reads; :func:`celery_conf` the matching Celery settings of broker and result
backend (kombu's Redis or Sentinel transport).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote, unquote, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from runner.errors import StoreError
from runner.settings import RunnerSettings, get_settings

SENTINEL_SCHEME = "redis+sentinel://"
"""URL scheme of a Sentinel group: ``redis+sentinel://H:P,H:P/SERVICE/DB``."""
SENTINEL_TLS_SCHEME = "rediss+sentinel://"
"""URL scheme of a Sentinel group reached over TLS (the sentinels and the group's primary)."""
SENTINEL_SCHEMES = (SENTINEL_SCHEME, SENTINEL_TLS_SCHEME)
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
"""URL schemes of a Redis Cluster (``redis+cluster://host:port``: any node of it)."""
_TLS_SCHEMES = ("rediss://", "rediss+cluster://", SENTINEL_TLS_SCHEME)
BROKER_REDIS_URL = "runner_broker_redis_url"
"""The Celery setting :func:`celery_conf` keeps a Sentinel broker's ``redis+sentinel://`` (or
``rediss+sentinel://``) URL in (``broker_url`` holds kombu's form of it), for :func:`client`."""
TRANSPORT_OPTIONS = ("broker_transport_options", "result_backend_transport_options")
"""The Celery settings :func:`celery_conf` may give that merge with a config file's own."""
POOL_SIZE = 100
"""Connections one :func:`client` keeps open at most (redis-py's default)."""
POOL_WAIT = 20.0
"""Seconds a caller that finds all :data:`POOL_SIZE` connections in use waits for one (then
redis-py's ``ConnectionError``, which a patient client retries). A worker ``-P threads -c 200``
runs more steps at once than the pool holds: they take turns instead of failing with redis-py's
"Too many connections" (redis-py's ``BlockingConnectionPool``; its default wait, so a pool a
forked child rebuilds from the parent's waits as long)."""


_DRIVER: dict[str, Any] = (
    {"driver_info": redis.DriverInfo(lib_version=redis.__version__)}
    if hasattr(redis, "DriverInfo")
    else {}
)
"""What redis-py tells the server it is (``CLIENT SETINFO``), as it would say it: given, so a
new connection does not look redis-py's version up in the installed packages' metadata
(about 2 ms of a cold ``runner`` command per connection). redis-py before 7.1 has no
``DriverInfo`` and looks it up itself."""


NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if hasattr(redis, "DriverInfo")
    else {"lib_name": None, "lib_version": None}
)
"""redis-py options that leave ``CLIENT SETINFO`` (two round trips of each new connection) out:
for a probe's connection, which lives for one PING and is named in no ``CLIENT LIST``."""


T = TypeVar("T")

_UNBOUNDED = 1_000_000
"""The retry count a :class:`Patience` shows redis-py: its bound is time, not a count."""

_outer = threading.local()
"""The deadline of the :class:`Patience` call this thread is inside, if any: a reconnect
inside a command's retry (redis-py connects lazily in ``send_command``) shares the command's
bound instead of starting one of its own."""


class Patience(Retry):
    """redis-py's ``Retry`` bounded by time: a command (or a connect, or a Sentinel's
    discovery of the group's primary) that fails on a connection error is tried again, with
    exponential backoff and jitter up to :attr:`cap` seconds apart, until ``seconds`` have
    passed since its first try (``RUNNER_STORE_RETRY``); then its last error is raised.

    redis-py retries on ``ConnectionError`` and ``TimeoutError``, which include Sentinel's
    ``MasterNotFoundError`` ("no sentinel answered with a primary" while the sentinels elect
    one); a refused connection to the old primary makes the connection ask the sentinels
    again (``SentinelConnectionPool`` re-discovers the primary at each connect).
    """

    def __init__(self, seconds: float, base: float = 0.05, cap: float = 1.0) -> None:
        super().__init__(ExponentialWithJitterBackoff(base=base, cap=cap), _UNBOUNDED)
        self.seconds = seconds

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Patience) and other.seconds == self.seconds

    __hash__ = Retry.__hash__

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        self._backoff.reset()
        outer = getattr(_outer, "deadline", None)
        deadline = outer if outer is not None else time.monotonic() + self.seconds
        _outer.deadline = deadline
        failures = 0
        try:
            while True:
                try:
                    return do()
                except self._supported_errors as error:
                    if is_retryable and not is_retryable(error):
                        raise
                    failures += 1
                    if with_failure_count:
                        fail(error, failures)
                    else:
                        fail(error)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise error
                    time.sleep(min(self._backoff.compute(failures), left))
        finally:
            _outer.deadline = outer


def patience(seconds: float | None = None) -> Patience:
    """A :class:`Patience` of ``seconds`` (default: the settings' ``RUNNER_STORE_RETRY``)."""
    return Patience(get_settings().store_retry if seconds is None else seconds)


class BadRedisSettings(StoreError):
    """A Redis URL or connection setting that cannot be used (a Sentinel URL without its
    service, a password file that cannot be read): bad input, not a Redis that is down."""


class SentinelGroup(NamedTuple):
    """What a ``redis+sentinel://`` or ``rediss+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    tls: bool = False
    """Reached over TLS (``rediss+sentinel://``): the sentinels and the primary alike."""

    @classmethod
    def parse(cls, url: str) -> SentinelGroup:
        """The group of ``url`` (:class:`BadRedisSettings` if it names none)."""
        scheme = next((s for s in SENTINEL_SCHEMES if url.startswith(s)), None)
        if scheme is None:
            raise BadRedisSettings(
                f"a Sentinel URL starts with {SENTINEL_SCHEME} or {SENTINEL_TLS_SCHEME} (TLS)"
            )
        rest = url[len(scheme) :]
        hosts, _, path = rest.partition("/")
        service, _, db = path.partition("/")
        sentinels = []
        for item in filter(None, hosts.rpartition("@")[2].split(",")):
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise BadRedisSettings(f"{scheme}: {item!r} is not HOST:PORT")
            sentinels.append((host, int(port)))
        if not sentinels or not service or not (db or "0").isdigit():
            raise BadRedisSettings(
                f"a Sentinel URL is {scheme}HOST:PORT,HOST:PORT/SERVICE/DB "
                f"(sentinels, the monitored service's name, the database number)"
            )
        return cls(tuple(sentinels), service, int(db or 0), scheme == SENTINEL_TLS_SCHEME)


def check_database(url: str) -> None:
    """:class:`BadRedisSettings` if ``url`` names a database that is not a number.

    redis-py drops a database part it cannot read (``redis://host:6379/abc``) and connects to
    database 0, where another deployment's data may be: refused here instead, for every
    process that finds its Redis through :func:`runner.embedded.ping`.
    """
    if is_sentinel(url):
        SentinelGroup.parse(url)  # checks its /SERVICE/DB
        return
    parts = urlsplit(url)
    if parts.scheme == "unix":  # its database is a query parameter, which redis-py checks
        return
    db = parts.path.strip("/") or "0"
    if not db.isdigit():
        raise BadRedisSettings(f"the Redis URL's database {db!r} is not a number (e.g. /0)")


def is_sentinel(url: str) -> bool:
    """Whether ``url`` names a Sentinel group (over TLS or not)."""
    return url.startswith(SENTINEL_SCHEMES)


def is_tls(url: str) -> bool:
    """Whether ``url`` is reached over TLS (``rediss://``, ``rediss+cluster://``,
    ``rediss+sentinel://``)."""
    return url.startswith(_TLS_SCHEMES)


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
    if is_tls(url):
        options.update(tls_options(settings))
    return options


def sentinel_options(
    url: str, settings: RunnerSettings | None = None, **socket_options: Any
) -> dict[str, Any]:
    """redis-py keyword arguments of the connections to the sentinels of ``url`` themselves
    (``sentinel_kwargs`` of redis-py, kombu and Celery): ``socket_options``, and on
    ``rediss+sentinel://`` ``ssl=True`` with the settings' TLS options. redis-py gives the
    sentinels none of the primary's options, so without these they would be asked in plain
    text (and a TLS-only sentinel would close the connection)."""
    options = dict(socket_options)
    if url.startswith(SENTINEL_TLS_SCHEME):
        options.update(ssl=True, **tls_options(settings))
    return options


def client(url: str, **kwargs: Any) -> Any:
    """A redis-py client for ``url`` with the settings' credentials and TLS options: the
    Sentinel group's current primary for ``redis+sentinel://`` (found again after a
    failover; over TLS to the sentinels and the primary for ``rediss+sentinel://``), a
    :class:`~redis.cluster.RedisCluster` for the ``+cluster`` schemes. ``kwargs`` are
    redis-py's (timeouts, retry). A plain Redis's connections are a blocking pool of
    :data:`POOL_SIZE` (see :data:`POOL_WAIT`)."""
    options = {**client_options(url), **_DRIVER, **kwargs}
    if is_sentinel(url):
        group = SentinelGroup.parse(url)
        # The sentinels get the caller's timeouts and retries too: a probe that must answer at
        # once is not held up by redis-py's default retries on each sentinel in turn.
        timeouts = {k: v for k, v in kwargs.items() if k.startswith("socket_") or k == "retry"}
        if isinstance(timeouts.get("retry"), Patience):
            # Patience is the primary's: its connect asks the sentinels in turn at each try,
            # so a dead sentinel is skipped at once rather than waited for.
            timeouts["retry"] = Retry(NoBackoff(), 0)
        if group.tls:  # the primary's pool then makes SentinelManagedSSLConnections
            options["ssl"] = True
        sentinel = Sentinel(
            list(group.sentinels), sentinel_kwargs=sentinel_options(url, **timeouts), **options
        )
        return sentinel.master_for(group.service, db=group.db)
    for scheme in CLUSTER_SCHEMES:
        if url.startswith(scheme):
            from redis.cluster import RedisCluster

            if isinstance(options.get("retry"), Patience):
                # redis-py's cluster client counts its retries (a slot map refresh each):
                # a count it is given, not a time bound.
                options["retry"] = Retry(ExponentialWithJitterBackoff(base=0.02, cap=0.25), 3)
            return RedisCluster.from_url(url.replace("+cluster", "", 1), **options)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=POOL_SIZE, timeout=POOL_WAIT, **options
    )
    plain = redis.Redis(connection_pool=pool)
    plain.auto_close_connection_pool = True  # closed with the client, as from_url's is
    return plain


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
    lives in this process only. On ``rediss+sentinel://`` the TLS options reach the sentinels
    too, as the transport option ``sentinel_kwargs`` (kombu's and Celery's backend's)."""
    settings = settings or get_settings()
    conf: dict[str, Any] = {"broker_url": broker_url, "result_backend": backend_url}
    if broker_url.startswith(("redis", "unix")):
        creds = credentials(broker_url, settings)
        if creds:
            conf["broker_user"] = creds.get("username")
            conf["broker_password"] = creds.get("password")
        if is_tls(broker_url):
            conf["broker_use_ssl"] = tls_options(settings)
        if is_sentinel(broker_url):
            group = SentinelGroup.parse(broker_url)
            conf["broker_url"] = ";".join(
                f"sentinel://{host}:{port}/{group.db}" for host, port in group.sentinels
            )
            conf["broker_transport_options"] = _sentinel_transport(broker_url, group, settings)
            conf[BROKER_REDIS_URL] = broker_url
    if backend_url and backend_url.startswith("redis"):
        creds = credentials(backend_url, settings)
        if is_sentinel(backend_url):
            group = SentinelGroup.parse(backend_url)
            hosts = ";".join(f"sentinel://{h}:{p}/{group.db}" for h, p in group.sentinels)
            conf["result_backend"] = hosts
            conf["result_backend_transport_options"] = _sentinel_transport(
                backend_url, group, settings
            )
        if creds:
            conf["result_backend"] = _with_credentials(conf["result_backend"], creds)
        if is_tls(backend_url):
            conf["redis_backend_use_ssl"] = tls_options(settings)
    return conf


def _sentinel_transport(url: str, group: SentinelGroup, settings: RunnerSettings) -> dict[str, Any]:
    """The transport options of kombu's (or Celery's backend's) Sentinel on ``group``: its
    service, and the sentinels' own connection options over TLS. Without TLS none are given,
    so kombu keeps giving the sentinels its socket options as before."""
    options: dict[str, Any] = {"master_name": group.service}
    if group.tls:
        options["sentinel_kwargs"] = sentinel_options(url, settings)
    return options


def merged_options(given: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """A config file's transport options (``given``: ``visibility_timeout``, its sentinels'
    socket timeouts) with :func:`celery_conf`'s on top; ``sentinel_kwargs`` merged one level
    down, so the file's timeouts stay beside the TLS options the URL asks for."""
    merged = {**given, **ours}
    if isinstance(given.get("sentinel_kwargs"), dict) and "sentinel_kwargs" in ours:
        merged["sentinel_kwargs"] = {**given["sentinel_kwargs"], **ours["sentinel_kwargs"]}
    return merged


def _with_credentials(url: str, creds: dict[str, str]) -> str:
    """``url`` (each ``;``-separated part) with ``creds`` as its userinfo."""
    user = quote(creds.get("username", ""), safe="")
    secret = quote(creds.get("password", ""), safe="")
    parts = []
    for part in url.split(";"):
        scheme, sep, rest = part.partition("://")
        parts.append(f"{scheme}{sep}{user}:{secret}@{rest}")
    return ";".join(parts)
