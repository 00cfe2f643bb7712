"""The cluster examples (deploy/): every name they use is one the package reads, every command exists,
every reference resolves, and nothing admits more than the bridge. No database needed."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kagent_memory_governed import cli
from kagent_memory_governed.activation import ENVIRONMENT_SWITCH
from kagent_memory_governed.adk import upstream
from kagent_memory_governed.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
DOCUMENTS = [(path.name, doc) for path in EXAMPLES for doc in yaml.safe_load_all(path.read_text()) if doc]
BRIDGE_PODS = {"app.kubernetes.io/name": "matrix-bridge"}
PREFIX = Settings.model_config["env_prefix"]
KNOWN_VARIABLES = {ENVIRONMENT_SWITCH} | {
    f"{PREFIX}{name}".upper() for name, field in Settings.model_fields.items() if field.validation_alias is None
}


@dataclass(frozen=True)
class Workload:
    """What one example runs: its command line (empty: the image's own), environment and volumes."""

    name: str
    argv: list[str]
    env: dict[str, dict]
    volumes: dict[str, dict]
    mounts: list[dict]


def of_kind(kind: str) -> list[dict]:
    return [doc for _, doc in DOCUMENTS if doc["kind"] == kind]


def workloads() -> Iterator[Workload]:
    for agent in of_kind("Agent"):
        spec = agent["spec"]
        deployment = (spec.get("declarative") or spec.get("byo"))["deployment"]
        argv = [deployment["cmd"], *deployment.get("args", [])] if "cmd" in deployment else []
        yield _workload(agent["metadata"]["name"], argv, deployment, deployment)
    jobs = of_kind("Job") + [cron["spec"]["jobTemplate"] for cron in of_kind("CronJob")]
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        for container in pod["containers"]:
            argv = [*container.get("command", []), *container.get("args", [])]
            yield _workload(container["name"], argv, container, pod)


def _workload(name: str, argv: list[str], container: dict, pod: dict) -> Workload:
    env = {variable["name"]: variable for variable in container.get("env", [])}
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    return Workload(name, argv, env, volumes, container.get("volumeMounts", []))


def find(node: object, key: str) -> Iterator[dict]:
    """Every value stored under ``key`` anywhere in a parsed document."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name == key:
                yield value
            yield from find(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from find(item, key)


def example_secrets() -> dict[str, set[str]]:
    return {s["metadata"]["name"]: {*s.get("stringData", {}), *s.get("data", {})} for s in of_kind("Secret")}


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


def test_every_example_and_the_dockerfile_start_with_an_example_marker():
    for path in [*EXAMPLES, DOCKERFILE]:
        assert path.read_text().startswith("# EXAMPLE"), path.name
    assert {name for name, _ in DOCUMENTS} == {path.name for path in EXAMPLES}  # none is empty


def test_every_document_is_kubernetes_shaped():
    dns_name = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
    for name, doc in DOCUMENTS:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), name
        assert dns_name.fullmatch(doc["metadata"]["name"]) and doc["metadata"].get("namespace"), name
    for agent in of_kind("Agent"):
        assert agent["apiVersion"] == "kagent.dev/v1alpha2"
        assert agent["spec"]["type"].lower() in agent["spec"]  # Declarative -> declarative, BYO -> byo


def test_every_governed_memory_variable_the_examples_mention_is_one_the_package_reads():
    mentioned = set()
    for path in [*EXAMPLES, DOCKERFILE]:
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
    for path in [*EXAMPLES, DOCKERFILE]:
        for name in re.findall(r"kagent-memory-governed (\w+)", path.read_text()):
            assert real_subcommand(name), (path.name, name)


def test_one_off_commands_turn_activation_off_because_the_image_turns_it_on():
    one_off = [w for w in workloads() if w.argv[1:2] in (["migrate"], ["sweep"])]
    assert len(one_off) == 2
    for workload in one_off:
        assert workload.env[ENVIRONMENT_SWITCH]["value"] == "off", workload.name


def test_the_bridge_key_is_read_from_a_file_mounted_from_an_example_secret():
    secrets = example_secrets()
    keyed = [w for w in workloads() if f"{PREFIX}BRIDGE_PUBLIC_KEY" in w.env]
    assert keyed
    for workload in keyed:
        value = workload.env[f"{PREFIX}BRIDGE_PUBLIC_KEY"]["value"]
        assert value.startswith("@/"), workload.name
        key_file = Path(value[1:])
        mount = next(m for m in workload.mounts if Path(m["mountPath"]) == key_file.parent)
        source = workload.volumes[mount["name"]]["secret"]
        files = {item["path"]: item["key"] for item in source.get("items", [])} or {
            key: key for key in secrets[source["secretName"]]
        }
        assert files[key_file.name] in secrets[source["secretName"]], workload.name


def test_every_secret_reference_names_a_secret_and_key_in_the_example_secrets():
    secrets = example_secrets()
    references = [ref for _, doc in DOCUMENTS for ref in find(doc, "secretKeyRef")]
    assert len(references) >= 4
    for ref in references:
        assert ref["key"] in secrets.get(ref["name"], set()), ref
    for _, doc in DOCUMENTS:
        for volume in find(doc, "volumes"):
            for source in (v["secret"] for v in volume if "secret" in v):
                assert source["secretName"] in secrets, source


def test_the_example_secrets_hold_only_obvious_placeholders():
    for secret in of_kind("Secret"):
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
    (cron,) = of_kind("CronJob")
    assert runs_every_day(cron["spec"]["schedule"])
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"


def test_the_network_policy_admits_only_bridge_pods_on_port_8080_to_every_governed_agent():
    (policy,) = of_kind("NetworkPolicy")
    spec = policy["spec"]
    assert "Ingress" in spec["policyTypes"]
    selected = spec["podSelector"]["matchLabels"]
    for agent in of_kind("Agent"):
        spec_of_kind = agent["spec"].get("declarative") or agent["spec"].get("byo")
        assert selected.items() <= spec_of_kind["deployment"].get("labels", {}).items(), agent["metadata"]["name"]
    for rule in spec["ingress"]:
        assert rule["from"], "an empty 'from' admits every source"
        for peer in rule["from"]:
            assert peer.keys() == {"podSelector", "namespaceSelector"}, peer
            assert peer["podSelector"] == {"matchLabels": BRIDGE_PODS}
            assert peer["namespaceSelector"]["matchLabels"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]


def test_the_declarative_agent_hands_its_memory_to_governed_memory_on_the_python_runtime():
    (agent,) = [a for a in of_kind("Agent") if a["spec"]["type"] == "Declarative"]
    declarative = agent["spec"]["declarative"]
    assert declarative["memory"]["modelConfig"]
    assert declarative.get("runtime", "python") == "python"
    assert declarative["deployment"]["imageRegistry"]


def test_the_byo_agent_serves_a_kagent_config_with_memory_through_the_governed_command():
    from a2a.types import AgentCard
    from kagent.adk import AgentConfig

    (agent,) = [a for a in of_kind("Agent") if a["spec"]["type"] == "BYO"]
    (workload,) = [w for w in workloads() if w.name == agent["metadata"]["name"]]
    assert workload.argv == ["kagent-memory-governed", "static", "--host", "0.0.0.0", "--port", "8080"] + [
        "--filepath",
        "/config",
    ]
    mount = next(m for m in workload.mounts if m["mountPath"] == "/config")
    config_map = workload.volumes[mount["name"]]["configMap"]["name"]
    (files,) = [c["data"] for c in of_kind("ConfigMap") if c["metadata"]["name"] == config_map]
    assert AgentConfig.model_validate(json.loads(files["config.json"])).memory is not None
    AgentCard.model_validate(json.loads(files["agent-card.json"]))


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
    header = (ROOT / "deploy/Dockerfile").read_text()
    assert all(r.image in header and f"locks/kagent-adk-{r.version}.txt" in header for r in upstream.SUPPORTED)
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
