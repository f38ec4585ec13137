"""Helpers for the Python end-to-end tests: tandemd processes on free ports
and gRPC stubs generated from the repository's .proto files at test time
(by grpcio-tools, as any client in any language would generate them)."""
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DAEMON = os.environ.get("TANDEM_DAEMON", os.path.join(ROOT, "build", "bin", "tandemd"))
MODEL = os.environ.get("TANDEM_TEST_MODEL",
                       os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def generated_stubs():
    """Generates tandem/v1/generate_pb2{,_grpc}.py into a temp dir; returns the modules."""
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="tandem_stubs_")
    proto_dir = os.path.join(ROOT, "proto")
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}",
                      f"--grpc_python_out={out}", os.path.join(proto_dir, "tandem/v1/generate.proto")])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, out)
    from tandem.v1 import generate_pb2, generate_pb2_grpc  # noqa: E402
    return generate_pb2, generate_pb2_grpc


def thread_flags(flags):
    """--threads=$TANDEM_TEST_THREADS (the CPUs per ctest job: scripts/test)
    unless `flags` size the pool; run alone, the daemon's default. Tests side
    by side that each compute on every CPU wait on each other's preempted
    threads (tests/integration/test_model.h)."""
    threads = int(os.environ.get("TANDEM_TEST_THREADS") or 0)
    if threads <= 0 or any(f.startswith(("--threads", "--decode_reserved_threads"))
                           for f in flags):
        return []
    # Unpinned: side by side, every daemon would pin its helper t to CPU t.
    return [f"--threads={threads}", "--pin_threads=false"]


def free_port():
    """A port of 127.0.0.1 that is free now, drawn from below the ephemeral
    range (where outgoing connections take their source ports, so a client of
    a test running beside this one cannot take it before the daemon binds it),
    as common/free_port.h does for the C++ tests, and reserved across
    processes in the same directory (tandem-port-reservations under the temp
    dir) so that two launchers side by side never draw the same port before
    either daemon binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    candidates = []
    if ephemeral_low - 10000 >= 1000:
        candidates = [random.randrange(10000, ephemeral_low) for _ in range(200)]
    for port in candidates + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if reserve_port(port):
            return port
    raise RuntimeError("no free port on 127.0.0.1")


PORT_RESERVATION_SECONDS = 300


def reserve_port(port):
    """Whether `port` is now reserved for this caller (see free_port)."""
    directory = os.path.join(os.environ.get("TMPDIR") or "/tmp", "tandem-port-reservations")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return True  # no reservations possible here
    path = os.path.join(directory, str(port))
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return True
        except FileExistsError:
            pass
        except OSError:
            return True
        try:
            if time.time() - os.stat(path).st_mtime < PORT_RESERVATION_SECONDS:
                return False
            os.unlink(path)  # lapsed: take it over
        except OSError:
            pass
    return False


class Daemon:
    """A tandemd on free ports; stderr goes to a log file."""

    def __init__(self, *flags):
        self.port = free_port()
        self.metrics_port = free_port()
        self.http_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="tandemd_", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [DAEMON, f"--model={MODEL}", f"--listen={self.address}",
             f"--metrics_listen=127.0.0.1:{self.metrics_port}",
             f"--http_port={self.http_port}",
             # One timed round of the start-up measurement: tests start
             # many daemons and need its figures, not precise ones.
             "--startup_measure_rounds=1",
             # The exact mode unless `flags` name one: auto's choice comes
             # from a start-up timing that a busy machine can move, and
             # tests compare tokens.
             "--cpu_matmul=f32", *thread_flags(flags), *flags],
            stdout=self.log, stderr=subprocess.STDOUT)

    def health(self):
        with grpc.insecure_channel(self.address) as channel:
            try:
                return health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=2).status
            except grpc.RpcError:
                return None

    def wait_serving(self, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"tandemd exited: {self.read_log()}")
            if self.health() == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.1)
        raise TimeoutError(f"tandemd not serving: {self.read_log()}")

    def metrics_text(self):
        """What /metrics serves now, in Prometheus text format."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        return urllib.request.urlopen(url).read().decode()

    def metric_families(self):
        """The names of the metric families /metrics serves now."""
        return set(re.findall(r"^# TYPE (\S+) ", self.metrics_text(), flags=re.M))

    def read_log(self):
        with open(self.log.name) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
