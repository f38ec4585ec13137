"""deploy/ checked from the outside: every Kubernetes manifest (each kustomize
overlay, rendered by `kubectl kustomize`) validates against the Kubernetes
schemas offline and holds together (probes, ports, labels, drain timing);
the daemon starts with the flags the manifests give it; every metric the
Grafana dashboard queries is one that /metrics serves; and the container
images install a Debian package for every shared library tandemd links."""
import glob
import json
import os
import re
import shutil
import subprocess

import grpc
import kubernetes_validate
import pytest
import yaml

import tandem_e2e

pb2, pb2_grpc = tandem_e2e.generated_stubs()

DEPLOY = os.path.join(tandem_e2e.ROOT, "deploy")
OVERLAYS = sorted(glob.glob(os.path.join(DEPLOY, "k8s", "overlays", "*")))
# The oldest Kubernetes with GA gRPC probes, and the newest schemas known.
KUBERNETES_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
# Flags the test replaces with its own (paths and ports of this machine).
LOCAL_FLAGS = ("--model=", "--listen=", "--metrics_listen=", "--http_port=")


def kubectl_with_kustomize_v4():
    """kubectl whose built-in kustomize understands `labels:` (v4 and later);
    Debian 12's kubernetes-client (1.20, kustomize v2) does not."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return None
    out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True).stdout
    match = re.search(r"Kustomize Version: v(\d+)", out)
    return kubectl if match and int(match.group(1)) >= 4 else None


def render(overlay):
    kubectl = kubectl_with_kustomize_v4()
    if kubectl is None:
        pytest.skip("needs kubectl 1.21+ (kustomize v4+) on PATH to render deploy/k8s")
    out = subprocess.run([kubectl, "kustomize", overlay], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def container(deployment):
    (c,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "tandemd"]
    return c


def flag(args, name, default=None):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return default


def seconds(duration):
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, f"use whole seconds or minutes in manifests: {duration}"
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def test_there_are_overlays():
    assert [os.path.basename(o) for o in OVERLAYS] == ["prefill-decode", "unified"]


@pytest.mark.parametrize("overlay", OVERLAYS, ids=os.path.basename)
def test_manifests_validate_against_the_kubernetes_schemas(overlay):
    docs = render(overlay)
    kinds = {"Deployment", "Service", "PodMonitor"}
    if os.path.basename(overlay) == "prefill-decode":
        kinds |= {"NetworkPolicy", "Issuer", "Certificate"}
    assert {d["kind"] for d in docs} == kinds
    for doc in docs:
        if doc["apiVersion"].startswith(("monitoring.coreos.com/", "cert-manager.io/")):
            continue  # CRDs; their schemas are not Kubernetes'; checked below
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=os.path.basename)
def test_manifests_hold_together(overlay):
    docs = render(overlay)
    monitors = by_kind(docs, "PodMonitor")
    for deployment in by_kind(docs, "Deployment"):
        pod = deployment["spec"]["template"]
        labels = pod["metadata"]["labels"]
        # Exactly one Service and one PodMonitor select these pods.
        (service,) = [s for s in by_kind(docs, "Service")
                      if set(s["spec"]["selector"].items()) <= set(labels.items())]
        (monitor,) = [m for m in monitors
                      if set(m["spec"]["selector"]["matchLabels"].items()) <= set(labels.items())]
        c = container(deployment)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        grpc_port = int(flag(c["args"], "listen").rsplit(":", 1)[1])
        metrics_port = int(flag(c["args"], "metrics_listen").rsplit(":", 1)[1])
        http_port = int(flag(c["args"], "http_port"))
        expected_ports = {"grpc": grpc_port, "metrics": metrics_port, "http": http_port}
        # KV events wherever prompts enter (every pod but a decode pool's).
        decode_pool = flag(c["args"], "role") == "decode"
        if not decode_pool:
            expected_ports["kv-events"] = int(
                flag(c["args"], "kv_events_endpoint").rsplit(":", 1)[1])
            expected_ports["kv-replay"] = int(
                flag(c["args"], "kv_events_replay_endpoint").rsplit(":", 1)[1])
            # Bound on every interface, where the router reaches them.
            assert flag(c["args"], "kv_events_endpoint").startswith("tcp://*:")
            assert flag(c["args"], "kv_events_replay_endpoint").startswith("tcp://*:")
        else:
            assert not [a for a in c["args"] if a.startswith("--kv_events_")]
        if flag(c["args"], "peer_listen") is not None:
            expected_ports["peer"] = int(flag(c["args"], "peer_listen").rsplit(":", 1)[1])
        assert ports == expected_ports
        service_ports = {p["name"] for p in service["spec"]["ports"]}
        assert ({"kv-events", "kv-replay"} <= service_ports) != decode_pool
        # Listening on every interface, or the kubelet's probes cannot reach it
        # (the HTTP API listens on --listen's host).
        assert flag(c["args"], "listen").startswith("0.0.0.0:")
        # Native gRPC probes against the daemon's health service, and
        # readiness on the HTTP API's /health (the same answer).
        for probe in ("startupProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == grpc_port, probe
        assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
        # The kubelet waits out the preStop pause and the whole drain.
        pre_stop = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
        pause = int(re.search(r"sleep (\d+);", pre_stop).group(1))
        assert "kill -TERM 1" in pre_stop
        drain = seconds(flag(c["args"], "drain_timeout", "30s"))
        grpc_shutdown = 5
        assert pod["spec"]["terminationGracePeriodSeconds"] > pause + drain + grpc_shutdown
        # As many compute threads as whole CPUs requested.
        assert int(flag(c["args"], "threads")) == int(c["resources"]["requests"]["cpu"])
        assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"]
        # The headless Service and the PodMonitor reach these pods by port name.
        assert service["spec"]["clusterIP"] == "None"
        assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
        assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


def test_the_prefill_pool_finds_the_decode_pool():
    docs = render(os.path.join(DEPLOY, "k8s", "overlays", "prefill-decode"))
    roles = {flag(container(d)["args"], "role"): d for d in by_kind(docs, "Deployment")}
    assert sorted(roles) == ["decode", "prefill"]
    prefill, decode = container(roles["prefill"]), container(roles["decode"])
    # --decode_peers names the decode pool's headless Service and gRPC port,
    # which resolves to every ready decode pod.
    host, port = flag(prefill["args"], "decode_peers").rsplit(":", 1)
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == host]
    assert service["spec"]["clusterIP"] == "None"
    decode_labels = roles["decode"]["spec"]["template"]["metadata"]["labels"]
    assert set(service["spec"]["selector"].items()) <= set(decode_labels.items())
    # ... on its Peer service's own port.
    (peer_port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "peer"]
    assert int(port) == peer_port == int(flag(decode["args"], "peer_listen").rsplit(":", 1)[1])
    assert flag(decode["args"], "decode_peers", None) is None
    assert flag(prefill["args"], "disagg_output_threshold") not in (None, "off")
    # Mutual TLS: both pools present the Certificate's secret, issued by the
    # pool's own CA for the name in --decode_peers, for either side of a
    # connection.
    (certificate,) = [c for c in by_kind(docs, "Certificate") if not c["spec"].get("isCA")]
    assert host in certificate["spec"]["dnsNames"]
    assert set(certificate["spec"]["usages"]) == {"server auth", "client auth"}
    (ca_issuer,) = [i for i in by_kind(docs, "Issuer")
                    if i["metadata"]["name"] == certificate["spec"]["issuerRef"]["name"]]
    (ca,) = [c for c in by_kind(docs, "Certificate") if c["spec"].get("isCA")]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    for role, deployment in roles.items():
        c = container(deployment)
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "peer-tls"]
        (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"]
                     if v["name"] == "peer-tls"]
        assert volume["secret"]["secretName"] == certificate["spec"]["secretName"], role
        for name, file in (("cert", "tls.crt"), ("key", "tls.key"), ("ca", "ca.crt")):
            assert flag(c["args"], f"peer_tls_{name}") == f"{mount['mountPath']}/{file}", role
    # Only the prefill pool reaches the decode pool beyond its client ports.
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    for role, other in (("decode", "prefill"), ("prefill", "decode")):
        spec = policies[f"tandem-{role}"]
        labels = roles[role]["spec"]["template"]["metadata"]["labels"]
        assert set(spec["podSelector"]["matchLabels"].items()) <= set(labels.items())
        open_ports = {p["port"] for rule in spec["ingress"] if "from" not in rule
                      for p in rule["ports"]}
        assert "peer" not in open_ports and {"grpc", "http", "metrics"} <= open_ports, role
        (peer_rule,) = [rule for rule in spec["ingress"] if "from" in rule and
                        "app.kubernetes.io/name" in rule["from"][0]["podSelector"]["matchLabels"]]
        # The KV events (prompt tokens) only to pods labelled as their readers.
        readers = [rule for rule in spec["ingress"] if "from" in rule and rule is not peer_rule]
        if role == "prefill":
            (events_rule,) = readers
            assert events_rule["from"] == [
                {"podSelector": {"matchLabels": {"tandem.dev/kv-events-reader": "true"}}}]
            assert {p["port"] for p in events_rule["ports"]} == {"kv-events", "kv-replay"}
        assert not {"kv-events", "kv-replay"} & open_ports
        other_labels = roles[other]["spec"]["template"]["metadata"]["labels"]
        (source,) = peer_rule["from"]
        assert set(source["podSelector"]["matchLabels"].items()) <= set(other_labels.items())
        assert not set(source["podSelector"]["matchLabels"].items()) <= set(labels.items())
        # ... on the other pool's KV transport ports (and, into the decode
        # pool, its peer port) only.
        low, high = map(int, flag(container(roles[other])["args"], "kv_transport_ports").split("-"))
        assert flag(container(roles[role])["args"], "kv_transport_ports") == f"{low}-{high}"
        allowed = {(p["port"], p.get("endPort")) for p in peer_rule["ports"]}
        assert allowed == ({("peer", None), (low, high)} if role == "decode" else {(low, high)})
    # The KV pages must mean the same on both sides, and the products round
    # alike (an explicit mode: auto may choose differently per node).
    for same in ("model", "block_size", "cpu_matmul"):
        assert flag(prefill["args"], same, None) == flag(decode["args"], same, None), same
    assert flag(prefill["args"], "cpu_matmul") in ("f32", "q16", "bf16", "q8")


@pytest.mark.parametrize("overlay", OVERLAYS, ids=os.path.basename)
def test_the_daemon_starts_with_the_manifests_flags(overlay):
    for deployment in by_kind(render(overlay), "Deployment"):
        args = [a for a in container(deployment)["args"] if not a.startswith(LOCAL_FLAGS)]
        # The KV events' sockets and the peer port on free local ports (the
        # manifests' are fixed); without the peer certificates, which
        # cert-manager makes there (multi_daemon_test checks mutual TLS).
        args = [re.sub(r"tcp://\*:\d+", f"tcp://127.0.0.1:{tandem_e2e.free_port()}", a)
                if a.startswith("--kv_events_") else a for a in args
                if not a.startswith("--peer_tls_")]
        args = [f"--peer_listen=127.0.0.1:{tandem_e2e.free_port()}"
                if a.startswith("--peer_listen=") else a for a in args]
        port = tandem_e2e.free_port()
        args = [f"--kv_transport_ports={port}-{port}"
                if a.startswith("--kv_transport_ports=") else a for a in args]
        daemon = tandem_e2e.Daemon(*args)
        try:
            daemon.wait_serving()
        finally:
            daemon.kill()


def test_every_metric_the_dashboard_queries_is_served():
    with open(os.path.join(DEPLOY, "grafana", "tandem-dashboard.json")) as f:
        dashboard = json.load(f)
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queried |= set(re.findall(r"\btandem_[a-z0-9_]+", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if isinstance(variable.get("query"), dict):
            queried |= set(re.findall(r"\btandem_[a-z0-9_]+", variable["query"]["query"]))
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in queried}
    assert len(families) > 20

    # One request on each path (the second long enough to be handed to the
    # decode worker) so that every labelled family has a child.
    daemon = tandem_e2e.Daemon("--disagg_output_threshold=8")
    try:
        daemon.wait_serving()
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb2_grpc.GenerationStub(channel)
            for max_tokens in (4, 24):
                request = pb2.GenerateRequest(
                    messages=[pb2.ChatMessage(role="user", content="Count to twenty.")],
                    sampling=pb2.SamplingParams(temperature=0.0), max_tokens=max_tokens,
                    ignore_eos=True)
                list(stub.Generate(request, timeout=60))
        served = daemon.metric_families()
    finally:
        daemon.kill()
    assert sorted(families - served) == []


def linked_packages(binary):
    """The Debian packages that hold the shared libraries `binary` links."""
    packages = set()
    for line in subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout.splitlines():
        if "=>" not in line or "not found" in line:
            continue
        path = os.path.realpath(line.split("=>")[1].split()[0])
        for candidate in (path, "/usr" + path, path.removeprefix("/usr")):
            found = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
            if found.returncode == 0:
                packages.add(found.stdout.split(":")[0])
                break
        else:
            raise AssertionError(f"no Debian package holds {path}")
    return packages


def with_dependencies(packages):
    """`packages` and everything they depend on, as installed here."""
    closure, todo = set(), list(packages)
    while todo:
        package = todo.pop()
        if package in closure:
            continue
        closure.add(package)
        depends = subprocess.run(["dpkg-query", "-W", "-f=${Depends}", package],
                                 capture_output=True, text=True).stdout
        for alternative in filter(None, (d.strip() for d in depends.split(","))):
            todo.append(re.split(r"[\s:(|]", alternative.strip())[0])
    return closure


@pytest.mark.parametrize("image", ["cpu", "cuda"])
def test_the_images_install_every_library_tandemd_links(image):
    with open(os.path.join(DEPLOY, "docker", f"{image}.Dockerfile")) as f:
        dockerfile = f.read()
    runtime_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    installed = re.search(r"apt-get install[^\n]*\n((?:.*\\\n)+)", runtime_stage).group(1)
    listed = set(re.findall(r"\b(lib[a-z0-9+.\-]+)", installed))
    # Always present in debian:12-slim.
    essential = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}
    linked = {p for p in linked_packages(tandem_e2e.DAEMON)
              if not re.match(r"lib(a|ub|t)san\d", p)}  # a sanitizer build's runtime
    missing = sorted(linked - essential - with_dependencies(listed))
    assert missing == [], f"{image}.Dockerfile's runtime stage lacks {missing}"
