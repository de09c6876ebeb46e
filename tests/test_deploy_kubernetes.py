"""deploy/kubernetes/, validated without a cluster: every built-in object against
Kubernetes' own JSON schemas (``kubernetes-validate``, strict: an unknown field is an
error), the KEDA ScaledObject against KEDA's CRD schema (v2.20.2, vendored in
``tests/fixtures/keda``; no network at test time), strict in the same way, and what the
schemas cannot see: the objects refer to each other by the right names, every ``RUNNER_*``
variable is a setting the runner reads, the grace period covers a step's time limit, the
trigger's metadata are KEDA's prometheus scaler's and its queries name metrics and the queue
the console serves."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from runner.settings import RunnerSettings

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "deploy" / "kubernetes"
KEDA_CRD = Path(__file__).parent / "fixtures" / "keda" / "keda.sh_scaledobjects.yaml"
KUBERNETES = "1.33"
"""The Kubernetes release the built-in objects are validated against."""

PROMETHEUS_METADATA = {
    # KEDA v2.20.2, pkg/scalers/prometheus_scaler.go: the `keda:"name=..."` trigger metadata.
    "serverAddress",
    "query",
    "queryParameters",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
    "awsRegion",
    "timeout",
    "identityOwner",
}
PROMETHEUS_REQUIRED = {"serverAddress", "query", "threshold"}
CONSOLE_METRICS = {"runner_queue_depth", "runner_queue_oldest_seconds", "runner_runs"}


def manifests() -> list[dict[str, Any]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def one(kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its
    properties and does not keep unknown fields: what the API server's strict field
    validation (kubectl's default) rejects, rather than prunes."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def keda_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "ScaledObject"
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # The API server checks apiVersion, kind and metadata itself; the CRD leaves them open.
    schema["properties"]["metadata"] = {"type": "object"}
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def keda_errors(doc: dict[str, Any]) -> list[str]:
    assert doc["apiVersion"] == "keda.sh/v1alpha1"
    return [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in keda_validator().iter_errors(doc)
    ]


def test_the_manifests_hold_what_the_readme_describes() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in manifests())
    assert kinds == [
        ("ConfigMap", "runner-config"),
        ("Deployment", "runner-console"),
        ("Deployment", "runner-worker"),
        ("ScaledObject", "runner-worker"),
        ("Secret", "runner-secrets"),
        ("Service", "runner-console"),
    ]


@pytest.mark.parametrize(
    "doc",
    [d for d in manifests() if d["kind"] != "ScaledObject"],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_each_built_in_object_is_valid_for_kubernetes(doc: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(doc, KUBERNETES, strict=True) == KUBERNETES


def test_kubernetes_validate_rejects_a_misspelt_field() -> None:
    # The validator bites: the worker Deployment with `replica` for `replicas`, or a
    # container without its image's type right, is refused.
    broken = copy.deepcopy(one("Deployment", "runner-worker"))
    broken["spec"]["replica"] = broken["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)
    broken = copy.deepcopy(one("Deployment", "runner-worker"))
    broken["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "660"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_the_scaled_object_is_valid_for_kedas_crd_and_the_check_bites() -> None:
    scaled = one("ScaledObject", "runner-worker")
    assert keda_errors(scaled) == []
    broken = copy.deepcopy(scaled)
    broken["spec"]["scaleTargetRef"]["nmae"] = broken["spec"]["scaleTargetRef"].pop("name")
    broken["spec"]["triggers"][0].pop("type")
    broken["spec"]["maxReplicaCount"] = "20"
    errors = keda_errors(broken)
    assert any("spec.scaleTargetRef" in e and "'name' is a required property" in e for e in errors)
    assert any("'nmae' was unexpected" in e for e in errors)
    assert any("spec.triggers.0" in e and "'type' is a required property" in e for e in errors)
    assert any("spec.maxReplicaCount" in e and "not of type 'integer'" in e for e in errors)


def test_the_worker_deployment_runs_runner_worker_with_the_deployments_settings() -> None:
    worker = one("Deployment", "runner-worker")
    pod = worker["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"][:2] == ["runner", "worker"]
    assert worker["spec"]["selector"]["matchLabels"].items() <= (
        worker["spec"]["template"]["metadata"]["labels"].items()
    )
    config = one("ConfigMap", "runner-config")["data"]
    secret = one("Secret", "runner-secrets")["stringData"]
    assert container["envFrom"] == [{"configMapRef": {"name": "runner-config"}}]
    for env in container["env"]:
        ref = env["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "runner-secrets" and ref["key"] in secret
    # Every variable is one the runner reads (a typo would be silently ignored).
    settings = {f"RUNNER_{name.upper()}" for name in RunnerSettings.model_fields}
    assert set(config) | set(secret) <= settings
    # SIGTERM is Celery's warm shutdown: the longest step finishes before SIGKILL.
    assert pod["terminationGracePeriodSeconds"] > float(config["RUNNER_STEP_TIME_LIMIT"])
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9808}]
    assert config["RUNNER_METRICS_PORT"] == "9808"


def test_keda_scales_the_workers_on_the_metrics_the_console_serves() -> None:
    scaled = one("ScaledObject", "runner-worker")
    assert scaled["spec"]["scaleTargetRef"] == {"name": "runner-worker"}
    assert one("Deployment", "runner-worker")  # the target exists
    config = one("ConfigMap", "runner-config")["data"]
    queue = config.get("RUNNER_QUEUE") or RunnerSettings(prefix=config["RUNNER_PREFIX"]).queue
    assert scaled["spec"]["minReplicaCount"] >= 1
    triggers = scaled["spec"]["triggers"]
    assert {t["type"] for t in triggers} == {"prometheus"}
    queried = set()
    for trigger in triggers:
        metadata = trigger["metadata"]
        assert PROMETHEUS_REQUIRED <= set(metadata) <= PROMETHEUS_METADATA
        assert all(isinstance(v, str) for v in metadata.values())  # KEDA's map of strings
        float(metadata["threshold"])
        names = set(re.findall(r"\brunner_\w+", metadata["query"]))
        assert names <= CONSOLE_METRICS
        queried |= names
        assert re.findall(r'queue="([^"]+)"', metadata["query"]) == [queue]
    assert queried == {"runner_queue_depth", "runner_queue_oldest_seconds"}
    # The console those metrics come from is in the manifests, with its token.
    console = one("Deployment", "runner-console")["spec"]["template"]["spec"]["containers"][0]
    assert console["command"][:2] == ["runner", "ui"]
    assert "RUNNER_UI_TOKEN" in {e["name"] for e in console["env"]}
    service = one("Service", "runner-console")["spec"]
    assert service["selector"].items() <= (
        one("Deployment", "runner-console")["spec"]["template"]["metadata"]["labels"].items()
    )
