"""deploy/kubernetes/ as far as `podman kube play` (podman 4.3) runs it: writes DIR/<name>.yaml per manifest that
kube play can run, adapted only where it must be, and DIR/plan.txt (one line per file: the network alias its pods
answer to, as the Service names them in Kubernetes), and says on stderr what is left out and why.

Adaptations, each forced by kube play:
  - a StatefulSet becomes a Deployment of the same pod template, its volumeClaimTemplates PVCs (no StatefulSet);
  - kube play publishes every containerPort on the host (on every interface, without hostIP: Redis would be open
    to the host's network): only the Service-fronted HTTP API keeps its port, on 127.0.0.1:API_PORT (8000, or
    OVQ_KUBE_API_PORT); the other containers' ports go (probes name their port by number instead), as pods on one
    network reach each other's ports without them;
  - one replica each (the second replica's published port is taken by the first);
  - Services become network aliases on the run's own network (kube play has no Services);
  - init containers are annotated to run at every start of their pod (podman 4.3 fails to remove run-once ones).

    python deploy/podman/kube_play.py DIR [CLAIM...]   # CLAIMs: volumes made beforehand (their PVCs are dropped)
"""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import yaml

KUBERNETES = Path(__file__).resolve().parent.parent / "kubernetes"
RUNS = ("Deployment", "StatefulSet", "PersistentVolumeClaim")
# Podman runs a "once" init container, then removes it, and 4.3 often fails there ("cannot remove container ... as
# it is running"); "always" ones it keeps.
INIT_CONTAINER_TYPE = "io.podman.annotations.init.container.type"
API_PORT = int(os.environ.get("OVQ_KUBE_API_PORT", "8000"))
API_SERVICE = "ovq-api"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
# Left out, and why (Secrets are made by the script as podman secrets; ConfigMaps go with --configmap).
LEFT_OUT = {
    "Namespace": "kube play has no namespaces",
    "Service": "kube play has no Services: the pods get the Service's name as a network alias instead",
    "PodDisruptionBudget": "no evictions to budget",
    "ScaledObject": "a KEDA custom resource: no autoscaler",
}


def _statefulset_as_deployment(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = workload["spec"]
    claims = [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": t["metadata"]["name"]},
               "spec": t["spec"]} for t in spec.pop("volumeClaimTemplates", [])]
    volumes = spec["template"]["spec"].setdefault("volumes", [])
    volumes += [{"name": c["metadata"]["name"], "persistentVolumeClaim": {"claimName": c["metadata"]["name"]}}
                for c in claims]
    spec.pop("serviceName", None)
    return [*claims, {**workload, "kind": "Deployment"}]


def _ports(container: dict[str, Any], published: bool) -> None:
    """The API's port on 127.0.0.1:API_PORT; no other port published (probes then name theirs by number)."""
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    for probe in (container.get(name) for name in PROBES):
        for check in (probe or {}).values():
            if isinstance(check, dict) and check.get("port") in named:
                check["port"] = named[check["port"]]
    if published:
        for port in container["ports"]:
            port.update(hostIP="127.0.0.1", hostPort=API_PORT)
    else:
        container.pop("ports", None)


def _adapt(doc: dict[str, Any], service: str) -> list[dict[str, Any]]:
    doc = copy.deepcopy(doc)
    docs = _statefulset_as_deployment(doc) if doc["kind"] == "StatefulSet" else [doc]
    for workload in docs:
        if workload["kind"] != "Deployment":
            continue
        workload["spec"]["replicas"] = 1
        pod = workload["spec"]["template"]["spec"]
        if pod.get("initContainers"):
            for metadata in (workload["metadata"], workload["spec"]["template"]["metadata"]):
                metadata.setdefault("annotations", {})[INIT_CONTAINER_TYPE] = "always"
        for container in pod.get("initContainers", []) + pod["containers"]:
            _ports(container, published=service == API_SERVICE and bool(container.get("ports")))
    return docs


def _alias(workload: dict[str, Any], services: list[dict[str, Any]]) -> str:
    """The Service that selects this workload's pods, by name ("-" if none)."""
    labels = workload["spec"]["template"]["metadata"]["labels"]
    for service in services:
        selector = service["spec"].get("selector") or {}
        if selector and all(labels.get(k) == v for k, v in selector.items()):
            return service["metadata"]["name"]
    return "-"


def main(directory: Path, existing: set[str]) -> int:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    docs = {name: [d for d in yaml.safe_load_all((KUBERNETES / name).read_text()) if d]
            for name in kustomization["resources"]}
    services = [d for file in docs.values() for d in file if d["kind"] == "Service"]
    directory.mkdir(parents=True, exist_ok=True)
    plan = []
    for name, file in docs.items():
        for doc in file:
            if doc["kind"] in LEFT_OUT:
                print(f"kube_play: {name}: {doc['kind']} {doc['metadata']['name']} left out: {LEFT_OUT[doc['kind']]}",
                      file=sys.stderr)
        workloads = [doc for doc in file if doc["kind"] in ("Deployment", "StatefulSet")]
        if not workloads:
            continue
        alias = _alias(workloads[0], services)
        runnable = [d for doc in file if doc["kind"] in RUNS for d in _adapt(doc, alias)
                    if not (d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] in existing)]
        for doc in runnable:
            doc["metadata"].pop("namespace", None)
        (directory / name).write_text(yaml.safe_dump_all(runnable, sort_keys=False))
        plan.append(f"{name} {alias}")
    (directory / "plan.txt").write_text("\n".join(plan) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), set(sys.argv[2:])))
