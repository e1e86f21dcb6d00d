"""paradev.connect and Client: one channel to one daemon (pd_client)."""
import atexit
import dataclasses
import os
import stat
import threading
import weakref

from . import _lib
from ._cstr import cbytes
from ._lib import ffi, lib

DEFAULT_TCP = "127.0.0.1:7478"

# Every open client, so that the interpreter's exit closes them (and their
# sessions) while Python and libparadev's threads still run: left to the
# interpreter's teardown, the keep-alive and stream threads would outlive
# the objects they use.
_LIVE = weakref.WeakSet()


@atexit.register
def _close_all():
    for c in list(_LIVE):
        try:
            c.close()
        except Exception:
            pass


def default_target():
    """The daemon the `paradev` command talks to without --target:
    $PARADEV_TARGET, else paradevd's default Unix socket
    ($XDG_RUNTIME_DIR/paradevd.sock, else /tmp/paradevd-UID/paradevd.sock
    when that directory is the user's alone), else 127.0.0.1:7478."""
    env = os.environ.get("PARADEV_TARGET")
    if env:
        return env
    rt = os.environ.get("XDG_RUNTIME_DIR")
    if rt:
        p = os.path.join(rt, "paradevd.sock")
        if _is_socket(p):
            return "unix:" + p
    d = "/tmp/paradevd-%d" % os.getuid()
    try:
        sb = os.lstat(d)
        private = (stat.S_ISDIR(sb.st_mode) and sb.st_uid == os.getuid() and
                   (sb.st_mode & 0o077) == 0)
    except OSError:
        private = False
    if private and _is_socket(os.path.join(d, "paradevd.sock")):
        return "unix:" + os.path.join(d, "paradevd.sock")
    return DEFAULT_TCP


def _is_socket(p):
    try:
        return stat.S_ISSOCK(os.stat(p).st_mode)
    except OSError:
        return False


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    kind: str
    memory_total_bytes: int
    memory_limit_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    memory_peak_bytes: int
    busy_seconds: float
    # issue #17: the physical GPU the device runs on, as the node's
    # scheduler numbers them (SLURM_JOB_GPUS; the CPU backend's device k
    # stands for GPU k); -1: none, or a libparadev without the field
    gpu: int = -1


@dataclasses.dataclass(frozen=True)
class MeshRankInfo:
    """One rank of a mesh across machines as the coordinator sees it."""
    rank: int
    host: str               # its address for the mesh's transport
    incarnation: int        # random at each start of that paradevd
    attached: bool          # its mesh stream is up (rank 0: True)
    last_seen_ms_ago: int   # since its last message (0: rank 0, never seen)


@dataclasses.dataclass(frozen=True)
class MeshInfo:
    """The daemon's place in a mesh across machines (issue #16;
    GetServerInfo.mesh). Rank 0 is the coordinator, the only daemon that
    takes sessions; it serves them only while the mesh is formed and not
    degraded (health() is NOT_SERVING otherwise, and `reason` says why)."""
    world_size: int         # ranks (one paradevd each)
    rank: int               # this daemon's
    devices_per_rank: int   # rank r owns global devices [r*n, r*n+n)
    formed: bool            # every rank attached, transports built
    degraded: bool          # a rank was lost and has not come back
    missing_ranks: tuple    # ranks not attached now (the coordinator's view)
    epoch: int              # grows by one at each (re-)formation
    coordinator: str        # HOST:PORT of the coordinator's mesh port
    reason: str             # why degraded / not formed; "" when whole
    ranks: tuple = ()       # MeshRankInfo per rank (on the coordinator only)

    @property
    def whole(self):
        """Formed and not degraded: the mesh takes sessions."""
        return self.formed and not self.degraded


def _mesh_info(p):
    """ServerInfo.mesh from a pd_server_info: None off a mesh (or with a
    libparadev older than the mesh accessors)."""
    if not _lib.has("pd_server_info_has_mesh") or \
            not lib.pd_server_info_has_mesh(p):
        return None
    ranks = []
    for i in range(lib.pd_server_info_mesh_num_ranks(p)):
        r = lib.pd_server_info_mesh_rank_info(p, i)
        ranks.append(MeshRankInfo(r.rank, _str(r.host), r.incarnation,
                                  bool(r.attached), r.last_seen_ms_ago))
    return MeshInfo(
        lib.pd_server_info_mesh_world_size(p),
        lib.pd_server_info_mesh_rank(p),
        lib.pd_server_info_mesh_devices_per_rank(p),
        bool(lib.pd_server_info_mesh_formed(p)),
        bool(lib.pd_server_info_mesh_degraded(p)),
        tuple(lib.pd_server_info_mesh_missing_rank(p, i) for i in
              range(lib.pd_server_info_mesh_num_missing_ranks(p))),
        lib.pd_server_info_mesh_epoch(p),
        _str(lib.pd_server_info_mesh_coordinator(p)),
        _str(lib.pd_server_info_mesh_reason(p)), tuple(ranks))


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    version: str
    incarnation: int
    backend: str
    start_time_ms: int
    devices: tuple
    limits: dict
    # where Session.load and Session.save may read and write: local
    # directories and http(s):// URL prefixes (empty: checkpoints refused)
    storage_roots: tuple = ()
    # transport security: the daemon's TCP listeners serve TLS, require a
    # client certificate, or serve plaintext off loopback (allowed by
    # [tls] allow_insecure_tcp); its warnings for the operator
    tls: bool = False
    client_cert_required: bool = False
    insecure_tcp: bool = False
    warnings: tuple = ()
    # a mesh across machines (issue #16): MeshInfo, None on a daemon of its
    # own
    mesh: object = None

    @property
    def num_devices(self):
        return len(self.devices)

    @property
    def memory_used_bytes(self):
        """Bytes in use, all devices together."""
        return sum(d.memory_used_bytes for d in self.devices)


_LIMIT_FIELDS = ("max_message_bytes", "max_tensor_bytes", "max_rank",
                 "max_ops_per_request", "max_handles_per_session",
                 "max_sessions", "max_string_bytes", "max_inputs_per_op",
                 "max_attrs_per_op", "max_list_length", "max_ids_per_request",
                 "default_lease_seconds", "max_lease_seconds",
                 "max_chunk_bytes")

_HAS_GPU = _lib.struct_has("pd_device_info", "gpu")

_SERVING = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING",
            3: "SERVICE_UNKNOWN"}


def _str(p):
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""


class Client:
    """A connection to one daemon. Thread-safe: sessions of several threads
    may share it. Close it with close() (or use it as a context manager);
    every session made from it must be closed first."""

    def __init__(self, target=None, *, timeout=None, max_message_bytes=0,
                 chunk_bytes=0, user_agent="paradev-python",
                 prefer_shared_memory=True, tls=None, tls_ca=None,
                 tls_cert=None, tls_key=None, tls_server_name=None,
                 token=None, token_file=None, ignore_environment=False):
        """tls: None (TLS for "tls://host:port" or when a CA or client
        certificate is given, here or in $PARADEV_TLS_CA / $PARADEV_TLS_CERT),
        True or False. tls_ca, tls_cert, tls_key: PEM files (the CAs of the
        daemon's certificate; a client certificate and its key for mutual
        TLS); tls_server_name: the name the daemon's certificate must hold.
        token (or token_file, its first line): a bearer token sent on every
        call. A None argument takes its environment variable
        (PARADEV_TLS_CA, PARADEV_TLS_CERT, PARADEV_TLS_KEY,
        PARADEV_TLS_SERVER_NAME, PARADEV_TOKEN, PARADEV_TOKEN_FILE) unless
        ignore_environment."""
        self.target_given = target if target is not None else default_target()
        self.timeout = timeout
        self.prefer_shared_memory = prefer_shared_memory
        opts = ffi.new("pd_client_options *")
        opts.struct_size = ffi.sizeof("pd_client_options")
        opts.max_message_bytes = max_message_bytes
        opts.default_timeout_ms = _timeout_ms(timeout)
        opts.chunk_bytes = chunk_bytes
        self._ua = ffi.new("char[]", cbytes(
            user_agent, "connect: user_agent")) if user_agent else None
        opts.user_agent = self._ua if self._ua is not None else ffi.NULL
        opts.tls = {None: lib.PD_TLS_AUTO, True: lib.PD_TLS_ON,
                    False: lib.PD_TLS_OFF}[tls]
        keep = []  # the strings live until pd_client_new returns
        for field, value in (("tls_ca_file", tls_ca),
                             ("tls_cert_file", tls_cert),
                             ("tls_key_file", tls_key),
                             ("tls_server_name", tls_server_name),
                             ("token", token), ("token_file", token_file)):
            if value is not None:
                keep.append(ffi.new("char[]", cbytes(
                    os.fspath(value), "connect: " + field)))
                setattr(opts, field, keep[-1])
        opts.ignore_environment = 1 if ignore_environment else 0
        st = _lib.status()
        c = lib.pd_client_new(cbytes(self.target_given, "connect: target"),
                              opts, st)
        if c == ffi.NULL:
            _lib.raise_status(lib.pd_status_code(st), st)
        self._c = c
        self._sessions = weakref.WeakSet()
        # Sessions whose C object is alive: libparadev requires every
        # pd_session to be deleted before its pd_client. A client and its
        # sessions dropped together are finalized in any order (the WeakSet
        # is already empty then), so the channel goes with the last session.
        self._live = 0
        self._closing = False
        self._live_lock = threading.Lock()
        _LIVE.add(self)
        self.target = _str(lib.pd_client_target(c))
        self.tls = bool(lib.pd_client_tls(c))

    # -- lifetime --------------------------------------------------------
    def close(self):
        """Closes every session still open and the channel. Idempotent."""
        for s in list(self._sessions):
            s.close(_quiet=True)
        with self._live_lock:
            self._closing = True
            if self._live == 0:
                self._delete_channel()

    def _delete_channel(self):
        if self._c is not None:
            lib.pd_client_delete(self._c)
            self._c = None

    def _session_made(self):
        with self._live_lock:
            self._live += 1

    def _session_deleted(self):
        """A session's pd_session is gone; the last one of a closed client
        takes the channel with it."""
        with self._live_lock:
            self._live -= 1
            if self._closing and self._live == 0:
                self._delete_channel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<paradev.Client %s>" % self.target

    def _handle(self):
        if self._c is None or self._closing:
            raise ValueError("paradev.Client is closed")
        return self._c

    @property
    def is_local(self):
        """True when the daemon is on this machine (a Unix socket or a
        loopback address): shared memory transfers can work."""
        t = self.target
        if t.startswith("unix:") or t.startswith("unix-abstract:"):
            return True
        host = t.rsplit(":", 1)[0].strip("[]")
        return host in ("localhost", "::1") or host.startswith("127.")

    # -- calls -----------------------------------------------------------
    def info(self):
        """The daemon's version, incarnation, backend, devices (memory now)
        limits, storage roots and, on a mesh across machines, its place in
        the mesh (ServerInfo.mesh) (GetServerInfo)."""
        st = _lib.status()
        p = lib.pd_client_get_server_info(self._handle(), ffi.NULL, st)
        if p == ffi.NULL:
            _lib.raise_status(lib.pd_status_code(st), st)
        try:
            devs = []
            for i in range(lib.pd_server_info_num_devices(p)):
                d = lib.pd_server_info_device(p, i)
                devs.append(DeviceInfo(
                    d.index, _str(d.name), _str(d.kind), d.memory_total_bytes,
                    d.memory_limit_bytes, d.memory_used_bytes,
                    d.memory_free_bytes, d.memory_peak_bytes, d.busy_seconds,
                    d.gpu if _HAS_GPU else -1))
            lim = lib.pd_server_info_limits(p)
            limits = {f: getattr(lim, f) for f in _LIMIT_FIELDS}
            roots = tuple(_str(lib.pd_server_info_storage_root(p, i)) for i in
                          range(lib.pd_server_info_num_storage_roots(p)))
            warnings = tuple(_str(lib.pd_server_info_warning(p, i)) for i in
                             range(lib.pd_server_info_num_warnings(p)))
            return ServerInfo(
                _str(lib.pd_server_info_version(p)),
                lib.pd_server_info_incarnation(p),
                _str(lib.pd_server_info_backend(p)),
                lib.pd_server_info_start_time_ms(p), tuple(devs), limits,
                roots, bool(lib.pd_server_info_tls(p)),
                bool(lib.pd_server_info_client_cert_required(p)),
                bool(lib.pd_server_info_insecure_tcp(p)), warnings,
                _mesh_info(p))
        finally:
            lib.pd_server_info_delete(p)

    def health(self, service=""):
        """The standard health check: "SERVING", "NOT_SERVING", "UNKNOWN" or
        "SERVICE_UNKNOWN". service "" is the whole server,
        "paradev.v1.ParallelDevice" the device service."""
        st = _lib.status()
        out = ffi.new("pd_serving_status *")
        _lib.check(lib.pd_client_health(self._handle(), cbytes(
            service, "health: service"), out,
                                        ffi.NULL, st), st)
        return _SERVING.get(out[0], "UNKNOWN")

    def echo(self, payload=b""):
        """Echo round trip (the transport's baseline)."""
        st = _lib.status()
        _lib.check(lib.pd_client_echo(self._handle(), payload, len(payload),
                                      ffi.NULL, 0, ffi.NULL, ffi.NULL, st), st)

    def session(self, name=None, *, job_id=None, lease_s=None,
                memory_quota=None, keep_alive=True, priority=0, weight=0,
                pipelined=False, prefer_shared_memory=None,
                shm_threshold=1 << 20, op_timeout_ms=None, job_token=None,
                devices=None):
        """Opens a session (CreateSession): a namespace of tensors with a
        lease, renewed in the background while it is open. Use it as a
        context manager: it is closed (every tensor freed) on exit.
        priority: the band, -8..8 (higher served strictly first); weight:
        the share of device time inside the band, 1..10000 (0: 1).
        op_timeout_ms: an op not started on the devices within this many ms
        of being queued fails with DEADLINE_EXCEEDED (and so do the ops
        that consume it); None: no deadline.
        job_token: the job's proof (default $PARADEV_JOB_TOKEN, which the
        Slurm TaskProlog exports); the session's job id then comes from it.
        devices: narrows the session to these daemon devices (a list of
        indices or names as info() shows them, e.g. [2, 3] or ["cpu:2"]):
        its allowed device set and the default placement of its tensors
        (session.devices); None: all the session may use. A device outside
        its job's or tenant's allocation: paradev.PermissionDenied.
        """
        from .session import Session
        if prefer_shared_memory is None:
            prefer_shared_memory = self.prefer_shared_memory
        s = Session(self, name, job_id=job_id, lease_s=lease_s,
                    memory_quota=memory_quota, keep_alive=keep_alive,
                    priority=priority, weight=weight, pipelined=pipelined,
                    prefer_shared_memory=prefer_shared_memory,
                    shm_threshold=shm_threshold, op_timeout_ms=op_timeout_ms,
                    job_token=job_token, devices=devices)
        self._sessions.add(s)
        return s


def _timeout_ms(timeout):
    if timeout is None:
        return 0
    if timeout <= 0:
        raise ValueError("timeout %r: expected a positive number of seconds "
                         "or None" % (timeout,))
    return max(1, int(round(timeout * 1000)))


def connect(target=None, *, timeout=None, **kw):
    """Opens a Client on the daemon at `target` ("unix:/path", "host:port",
    "tls://host:port"; None: as the `paradev` command finds it, see
    default_target()). TLS and token arguments: see Client.
    timeout: seconds each call may take (None: libparadev's 60 s). Nothing
    is sent yet: a daemon that is not there shows as paradev.Unavailable on
    the first call."""
    return Client(target, timeout=timeout, **kw)
