"""The cluster examples (deploy/): each overlay renders with ``kubectl kustomize``; every rendered object
is valid, strictly, against its schema (Kubernetes' own for core kinds, kagent's Agent CRD of each supported
release for Agents); every name they use is one the package reads, every command exists, every reference
resolves, the one-off Jobs run locked down, and nothing admits more than the bridge. No database needed."""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kagent_memory_governed import cli
from kagent_memory_governed.activation import ENVIRONMENT_SWITCH
from kagent_memory_governed.adk import upstream
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store.connection import parse

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
SECRETS = DEPLOY / "secrets.example.yaml"
OVERLAYS = {"byo-0.9.11": "0.9.11", "declarative-0.10.4": "0.10.4"}  # overlay: the kagent release it runs on
CRDS = ROOT / "tests" / "data" / "kagent-crds"
CRD_RELEASES = {
    "0.9.11": CRDS / "v0.9.11" / "kagent.dev_agents.yaml",
    "0.10.4": CRDS / "v0.10.x" / "kagent.dev_agents.yaml",
}
KUBERNETES = ("1.32.0", "1.37.0")  # the releases whose schemas the core kinds are validated against
BRIDGE_PODS = {"app.kubernetes.io/name": "matrix-bridge"}
PREFIX = Settings.model_config["env_prefix"]
KNOWN_VARIABLES = {ENVIRONMENT_SWITCH} | {
    f"{PREFIX}{name}".upper() for name, field in Settings.model_fields.items() if field.validation_alias is None
}
SOURCES = sorted(path for path in DEPLOY.rglob("*.yaml"))


@functools.cache
def rendered(overlay: str) -> tuple[dict, ...]:
    """What ``kubectl kustomize deploy/overlays/<overlay>`` renders."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with kustomize) is needed to render deploy/overlays"
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "overlays" / overlay)], capture_output=True, text=True, check=True
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def secrets() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(SECRETS.read_text()) if doc]


def documents() -> list[tuple[str, dict]]:
    """Every object an operator applies: each overlay's, and the Secrets they bring."""
    found = [(overlay, doc) for overlay in OVERLAYS for doc in rendered(overlay)]
    return found + [(SECRETS.name, doc) for doc in secrets()]


def of_kind(kind: str, overlay: str | None = None) -> list[dict]:
    return [doc for name, doc in documents() if doc["kind"] == kind and overlay in (None, name)]


@dataclass(frozen=True)
class Workload:
    """What one object runs: its command line (empty: the image's own), image, environment and volumes."""

    overlay: str
    name: str
    argv: list[str]
    image: str | None
    env: dict[str, dict]
    volumes: dict[str, dict]
    mounts: list[dict]


def workloads(overlay: str | None = None) -> Iterator[Workload]:
    for name in [overlay] if overlay else list(OVERLAYS):
        for agent in of_kind("Agent", name):
            spec = agent["spec"]
            deployment = (spec.get("declarative") or spec.get("byo"))["deployment"]
            argv = [deployment["cmd"], *deployment.get("args", [])] if "cmd" in deployment else []
            yield _workload(name, agent["metadata"]["name"], argv, deployment.get("image"), deployment, deployment)
        jobs = of_kind("Job", name) + [cron["spec"]["jobTemplate"] for cron in of_kind("CronJob", name)]
        for job in jobs:
            pod = job["spec"]["template"]["spec"]
            for container in pod["containers"]:
                argv = [*container.get("command", []), *container.get("args", [])]
                yield _workload(name, container["name"], argv, container["image"], container, pod)


def _workload(overlay: str, name: str, argv: list[str], image: str | None, container: dict, pod: dict) -> Workload:
    env = {variable["name"]: variable for variable in container.get("env", [])}
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    return Workload(overlay, name, argv, image, env, volumes, container.get("volumeMounts", []))


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


def secret_keys() -> dict[str, set[str]]:
    return {s["metadata"]["name"]: {*s.get("stringData", {}), *s.get("data", {})} for s in secrets()}


def mounted_file(workload: Workload, path: Path) -> tuple[str, str]:
    """The Secret and key that ``path`` is mounted from in ``workload``."""
    mount = next(m for m in workload.mounts if Path(m["mountPath"]) == path.parent)
    source = workload.volumes[mount["name"]]["secret"]
    files = {item["path"]: item["key"] for item in source.get("items", [])} or {
        key: key for key in secret_keys()[source["secretName"]]
    }
    return source["secretName"], files[path.name]


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


def dockerfile_instructions() -> list[tuple[str, str]]:
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [tuple(line.split(None, 1)) for line in joined.splitlines() if line.strip()]


# -- kagent's Agent CRD as a strict JSON schema ---------------------------------------------------------------

# The CEL rules (x-kubernetes-validations) of kagent's Agent CRDs, each as Python; a rule not listed here
# fails the test, so a new release's rules are read before its schema is trusted.
CEL_RULES = {
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


def _cel(validator, rules, instance, schema):
    if not isinstance(instance, dict):
        return
    for rule in rules:
        check = CEL_RULES.get(rule["rule"])
        if check is None:
            yield jsonschema.ValidationError(f"CEL rule not evaluated by this test: {rule['rule']}")
        elif not check(instance):
            yield jsonschema.ValidationError(rule.get("message", rule["rule"]))


def _int_or_string(validator, enabled, instance, schema):
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


def agent_errors(agent: dict, release: str) -> list[str]:
    assert agent["apiVersion"] == "kagent.dev/v1alpha2" and agent["kind"] == "Agent"
    return sorted(
        f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
        for error in agent_validator(release).iter_errors(agent)
    )


# -- rendering and schemas --------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_the_base_and_its_agent_in_one_namespace(overlay: str):
    kinds = sorted(doc["kind"] for doc in rendered(overlay))
    expected = ["Agent", "CronJob", "Job", "NetworkPolicy"] + (["ConfigMap"] if overlay.startswith("byo") else [])
    assert kinds == sorted(expected)
    assert {doc["metadata"]["namespace"] for doc in rendered(overlay)} == {"kagent"}


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_core_object_is_valid_against_the_kubernetes_schema_strictly(version: str):
    core = [(name, doc) for name, doc in documents() if doc["kind"] != "Agent"]
    assert len(core) >= 10
    for name, doc in core:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as invalid:
            pytest.fail(f"{name} {doc['kind']} {doc['metadata']['name']}: {invalid.message}")


def test_strict_kubernetes_validation_refuses_an_unknown_field():
    job = copy.deepcopy(of_kind("Job")[0])
    job["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"port": 8080}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(job, KUBERNETES[-1], strict=True)


@pytest.mark.parametrize("release", CRD_RELEASES)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_agent_is_valid_against_kagents_own_crd_of_each_release(overlay: str, release: str):
    (agent,) = of_kind("Agent", overlay)
    assert agent_errors(agent, release) == []


@pytest.mark.parametrize("release", CRD_RELEASES)
def test_the_crd_schema_refuses_a_probe_field_a_typo_and_a_broken_rule(release: str):
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


def test_the_crd_files_are_the_upstream_copies_their_source_names():
    source = (CRDS / "SOURCE.md").read_text()
    for path in CRD_RELEASES.values():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert re.search(rf"`{re.escape(path.parent.name)}/{path.name}`.*`{digest}`", source), path


def test_the_operators_guide_recommends_no_agent_field_the_crd_rejects():
    guide = (ROOT / "docs" / "operator.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, re.DOTALL)
    for block in blocks:
        assert "Probe:" not in block, block  # kagent sets the probe itself; an Agent has no such field
        for doc in yaml.safe_load_all(block):
            if isinstance(doc, dict) and doc.get("kind") == "Agent":
                for release in CRD_RELEASES:
                    assert agent_errors(doc, release) == [], block


# -- what the objects run -----------------------------------------------------------------------------------


def test_every_source_and_the_dockerfile_start_with_an_example_marker():
    for path in [*SOURCES, DOCKERFILE]:
        text = path.read_text()
        assert text.startswith("# EXAMPLE") or path.name == "kustomizeconfig.yaml", path


def test_every_governed_memory_variable_the_examples_mention_is_one_the_package_reads():
    mentioned = set()
    for path in [*SOURCES, DOCKERFILE]:
        mentioned |= set(re.findall(r"\bKAGENT_GOVERNED_MEMORY\w*", path.read_text()))
    assert mentioned and mentioned <= KNOWN_VARIABLES
    assert "KAGENT_GOVERNED_MEMORY_BRIDGE_KEY" not in KNOWN_VARIABLES  # a near miss is not accepted


def test_every_agent_turns_governed_memory_on_with_everything_activation_needs():
    agents = {agent["metadata"]["name"] for agent in of_kind("Agent")}
    required = {
        f"{PREFIX}{name}".upper() for name in ("database_url", "bridge_public_key", "bridge_issuer", "homeserver")
    }
    for workload in (w for w in workloads() if w.name in agents):
        assert workload.env[ENVIRONMENT_SWITCH].get("value") == "on", workload.name  # a bare YAML on is True
        assert required <= workload.env.keys(), workload.name
    assert len(agents) == 2


def test_every_command_the_examples_run_is_a_real_subcommand():
    governed = [w.argv for w in workloads() if w.argv and w.argv[0] == "kagent-memory-governed"]
    assert {argv[1] for argv in governed} >= {"static", "migrate", "sweep"}
    for argv in governed:
        assert real_subcommand(argv[1]), argv
    assert not real_subcommand("reticulate")


def test_every_command_the_examples_tell_the_operator_to_run_is_a_real_subcommand():
    for path in [*SOURCES, DOCKERFILE]:
        for name in re.findall(r"kagent-memory-governed (\w+)", path.read_text()):
            assert real_subcommand(name), (path.name, name)


def test_one_off_commands_turn_activation_off_because_the_image_turns_it_on():
    one_off = [w for w in workloads() if w.argv[1:2] in (["migrate"], ["sweep"])]
    assert len(one_off) == 2 * len(OVERLAYS)
    for workload in one_off:
        assert workload.env[ENVIRONMENT_SWITCH]["value"] == "off", workload.name


def test_jobs_run_non_root_on_a_read_only_root_without_privilege_escalation_and_with_resources():
    pods = [job["spec"]["template"]["spec"] for job in of_kind("Job")]
    pods += [cron["spec"]["jobTemplate"]["spec"]["template"]["spec"] for cron in of_kind("CronJob")]
    assert len(pods) == 2 * len(OVERLAYS)
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]


@pytest.mark.parametrize(("overlay", "release"), OVERLAYS.items())
def test_the_migrate_job_is_named_after_its_image_tag_so_a_release_needs_no_renaming(overlay: str, release: str):
    (job,) = of_kind("Job", overlay)
    image = job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(f":{release}")
    assert job["metadata"]["name"] == f"governed-memory-migrate-{release}"
    (cron,) = of_kind("CronJob", overlay)
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"] == image


def resolved_runtime_image(agent: dict, controller_tag: str) -> str:
    """The image kagent 0.10.x's controller runs a Declarative Python agent on (resolveRuntimeImage, not in
    a sandbox): ``<imageRegistry>/kagent-dev/kagent/app:<the controller's image tag>``."""
    declarative = agent["spec"]["declarative"]
    assert declarative.get("runtime", "python") == "python" and "sandbox" not in agent["spec"]
    return f"{declarative['deployment']['imageRegistry']}/kagent-dev/kagent/app:{controller_tag}"


def test_the_declarative_agent_runs_the_image_the_0_10_controller_resolves_and_the_jobs_run():
    (agent,) = of_kind("Agent", "declarative-0.10.4")
    (job,) = of_kind("Job", "declarative-0.10.4")
    assert resolved_runtime_image(agent, "0.10.4") == job["spec"]["template"]["spec"]["containers"][0]["image"]
    assert agent["spec"]["declarative"]["memory"]["modelConfig"]


def test_the_byo_agent_serves_a_kagent_config_with_memory_through_the_governed_command_on_the_jobs_image():
    from a2a.types import AgentCard
    from kagent.adk import AgentConfig

    (agent,) = of_kind("Agent", "byo-0.9.11")
    (workload,) = [w for w in workloads("byo-0.9.11") if w.name == agent["metadata"]["name"]]
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


def test_the_bridge_key_is_read_from_a_file_mounted_from_an_example_secret():
    keyed = [w for w in workloads() if f"{PREFIX}BRIDGE_PUBLIC_KEY" in w.env]
    assert len(keyed) == len(OVERLAYS)
    for workload in keyed:
        value = workload.env[f"{PREFIX}BRIDGE_PUBLIC_KEY"]["value"]
        assert value.startswith("@/"), workload.name
        secret, key = mounted_file(workload, Path(value[1:]))
        assert key in secret_keys()[secret], workload.name


def test_the_example_database_url_is_valid_and_its_ca_is_mounted_wherever_it_is_used(tmp_path: Path):
    (database,) = [s for s in secrets() if s["metadata"]["name"] == "governed-memory-database"]
    url = database["stringData"]["url"]
    ca = Path(re.search(r"sslrootcert=([^&]+)", url).group(1))
    assert "sslmode=verify-full" in url
    pem = tmp_path / "ca.pem"  # the URL is checked as the package checks it, with a real CA at that path
    from test_tls import make_pki

    pem.write_bytes(make_pki(tmp_path).ca.read_bytes())
    parse(url.replace(str(ca), str(pem)))
    using = [w for w in workloads() if f"{PREFIX}DATABASE_URL" in w.env]
    assert len(using) == 3 * len(OVERLAYS)  # the Agent, the migrate Job, the sweep
    for workload in using:
        assert workload.env[f"{PREFIX}DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "governed-memory-database"
        secret, key = mounted_file(workload, ca)
        assert key in secret_keys()[secret], workload.name


def test_every_secret_reference_names_a_secret_and_key_in_the_example_secrets():
    keys = secret_keys()
    references = [ref for _, doc in documents() for ref in find(doc, "secretKeyRef")]
    assert len(references) == 3 * len(OVERLAYS) + 1  # the database URL thrice an overlay, BYO's model key
    for ref in references:
        assert ref["key"] in keys.get(ref["name"], set()), ref
    for _, doc in documents():
        for volume in find(doc, "volumes"):
            for source in (v["secret"] for v in volume if "secret" in v):
                assert source["secretName"] in keys, source


def test_the_example_secrets_hold_only_obvious_placeholders():
    for secret in secrets():
        assert "data" not in secret  # base64 would hide what a value is
        for key, value in secret["stringData"].items():
            assert "REPLACE-ME" in value, (secret["metadata"]["name"], key)


@pytest.mark.parametrize(
    ("schedule", "daily"),
    [("17 * * * *", True), ("0 3 * * *", True), ("@daily", True), ("0 3 * * 1", False), ("0 0 1 * *", False)],
)
def test_a_schedule_runs_daily_only_if_it_fires_on_every_day(schedule: str, daily: bool):
    assert runs_every_day(schedule) is daily


def test_the_sweep_runs_at_least_once_a_day():
    for cron in of_kind("CronJob"):
        assert runs_every_day(cron["spec"]["schedule"])
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_network_policy_admits_only_bridge_pods_on_port_8080_to_every_governed_agent(overlay: str):
    (policy,) = of_kind("NetworkPolicy", overlay)
    spec = policy["spec"]
    assert "Ingress" in spec["policyTypes"]
    selected = spec["podSelector"]["matchLabels"]
    for agent in of_kind("Agent", overlay):
        spec_of_kind = agent["spec"].get("declarative") or agent["spec"].get("byo")
        assert selected.items() <= spec_of_kind["deployment"].get("labels", {}).items(), agent["metadata"]["name"]
    for rule in spec["ingress"]:
        assert rule["from"], "an empty 'from' admits every source"
        for peer in rule["from"]:
            assert peer.keys() == {"podSelector", "namespaceSelector"}, peer
            assert peer["podSelector"] == {"matchLabels": BRIDGE_PODS}
            assert peer["namespaceSelector"]["matchLabels"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]


def test_the_image_installs_the_package_from_the_lock_and_turns_activation_on():
    instructions = dockerfile_instructions()
    assert ("FROM", "${KAGENT_APP_IMAGE}") in instructions
    assert ("ARG", "KAGENT_APP_IMAGE=ghcr.io/kagent-dev/kagent/app:${KAGENT_ADK_VERSION}") in instructions
    newest = upstream.SUPPORTED[-1]
    assert ("ARG", f"KAGENT_ADK_VERSION={newest.version}") in instructions
    assert newest.image == f"ghcr.io/kagent-dev/kagent/app:{newest.version}"
    assert ("ENV", "KAGENT_GOVERNED_MEMORY=on") in instructions
    (install,) = [rest for op, rest in instructions if op == "RUN" and "pip install" in rest]
    lock = re.escape('-c "locks/kagent-adk-${KAGENT_ADK_VERSION}.txt" .')
    assert re.search(lock + r"(\s|$)", install) and not re.search(r"\s(-e|--editable)\s", install)
    header = DOCKERFILE.read_text()
    assert all(r.image in header and f"locks/kagent-adk-{r.version}.txt" in header for r in upstream.SUPPORTED)
    for overlay, release in OVERLAYS.items():  # the header builds exactly the images the overlays run
        (job,) = of_kind("Job", overlay)
        assert f"-t {job['spec']['template']['spec']['containers'][0]['image']} ." in header.replace("\\\n#  ", "")
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


def test_every_workload_names_its_key_store_and_reads_its_token_and_ca_from_a_mounted_secret():
    """A pod without a key store stops (the embedded one is for local runs), so each workload that touches the
    store (agents, migrate, sweep) names OpenBao, with the token and CA files of an example Secret mounted."""
    from kagent_memory_governed.keys import check_url

    stores = [w for w in workloads() if f"{PREFIX}DATABASE_URL" in w.env]
    assert len(stores) == 3 * len(OVERLAYS)  # the agent, the migrate Job and the sweep CronJob of each overlay
    for workload in stores:
        url = workload.env[f"{PREFIX}KEY_STORE"]["value"]
        check_url(url)  # refuses what the package cannot use
        assert url.startswith("openbao+https://"), workload.name
        token = workload.env[f"{PREFIX}KEY_STORE_TOKEN"]["value"]
        assert token.startswith("@/"), workload.name  # a file: renewed tokens are read again, never baked in
        for path in (Path(token[1:]), Path(workload.env[f"{PREFIX}KEY_STORE_CA"]["value"])):
            secret, key = mounted_file(workload, path)
            assert key in secret_keys()[secret], (workload.name, path)
