"""Every key-store configuration error is one line with a reason code, naming the setting, never its value:
in process (``embedded.key_store``), and from every command in a process of its own (``doctor`` a check line,
``static`` the activation refusal, ``migrate`` and ``sweep`` a configuration error). The embedded key store
serves the embedded database only, and a ``file://`` store never lives inside a database's data directory."""

from __future__ import annotations

import datetime
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import NameOID
from support import COMMAND, pod_environment

from kagent_memory_governed import embedded, keys
from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.settings import Settings

if TYPE_CHECKING:
    from kagent_memory_governed.store import Store
    from kagent_memory_governed.testing import Bridge

PREFIX = "KAGENT_GOVERNED_MEMORY_"
KEY_STORE, TOKEN, CA = f"{PREFIX}KEY_STORE", f"{PREFIX}KEY_STORE_TOKEN", f"{PREFIX}KEY_STORE_CA"
OPENBAO = "openbao+https://bao.example:8200/kmg"  # never reached: each refusal comes before any connection
SECRET = "SENTINEL-secret-9f3"  # in every token and path given: never in any output


def _certificate_pem() -> bytes:
    key = generate_private_key(SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "governed memory test CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(Encoding.PEM)


@pytest.fixture
def files(tmp_path: Path) -> SimpleNamespace:
    """A directory named with the sentinel, holding a CA bundle, a private key, a token file and an empty one."""
    home = tmp_path / SECRET
    home.mkdir()
    (home / "ca.pem").write_bytes(_certificate_pem())
    key = generate_private_key(SECP256R1())
    (home / "key.pem").write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    (home / "text").write_text(f"{SECRET}\n")
    (home / "token").write_text(f"{SECRET}\n")  # an agent's token file ends with a newline
    (home / "empty").write_text("\n")
    (home / "latin1").write_bytes(b"\xff" + SECRET.encode())
    (home / "dir").mkdir()
    return SimpleNamespace(home=home)


def _settings(home: Path, **values: str) -> Settings:
    """Settings from these values alone (the suite's key store and any database URL unset)."""
    fields: dict[str, Any] = {"data_dir": str(home / "data"), "key_store": None, "database_url": None, **values}
    return Settings(**fields)


BAD = [  # (what is given, the code)
    ({"key_store_token": SECRET, "key_store_ca": "{home}/missing.pem"}, "ca_unreadable"),
    ({"key_store_token": SECRET, "key_store_ca": "{home}/dir"}, "ca_unreadable"),
    ({"key_store_token": SECRET, "key_store_ca": "{home}/text"}, "ca_not_a_certificate"),
    ({"key_store_token": SECRET, "key_store_ca": "{home}/key.pem"}, "ca_not_a_certificate"),
    ({"key_store_token": "@{home}/missing"}, "token_unreadable"),
    ({"key_store_token": "@{home}/dir"}, "token_unreadable"),
    ({"key_store_token": "@{home}/latin1"}, "token_unreadable"),
    ({"key_store_token": "@{home}/empty"}, "token_empty"),
    ({"key_store_token": f"{SECRET}\n"}, "token_invalid"),
    ({"key_store_token": f"{SECRET} x"}, "token_invalid"),
    ({}, "missing"),
]
IDS = [
    "ca-missing",
    "ca-directory",
    "ca-text",
    "ca-private-key",
    "token-file-missing",
    "token-file-directory",
    "token-file-not-utf8",
    "token-file-empty",
    "token-newline",
    "token-space",
    "no-token",
]


@pytest.mark.parametrize(("given", "code"), BAD, ids=IDS)
def test_a_key_store_setting_that_cannot_be_used_is_refused_with_a_code_naming_the_setting(
    files: SimpleNamespace, given: dict[str, str], code: str
) -> None:
    values = {name: value.format(home=files.home) for name, value in given.items()}
    with pytest.raises(ConfigurationError) as refused:
        embedded.key_store(_settings(files.home, key_store=OPENBAO, **values))
    assert refused.value.code == code
    message = str(refused.value)
    assert SECRET not in message and str(files.home) not in message and "\n" not in message
    setting = {"ca": CA}.get(code.split("_")[0], TOKEN)
    assert message.startswith(setting) or message.endswith(setting), message


def test_a_readable_token_file_and_a_pem_ca_bundle_make_an_openbao_key_store(files: SimpleNamespace) -> None:
    settings = _settings(
        files.home, key_store=OPENBAO, key_store_token=f"@{files.home}/token", key_store_ca=f"{files.home}/ca.pem"
    )
    assert isinstance(embedded.key_store(settings), keys.OpenBaoKeyStore)
    literal = _settings(files.home, key_store=OPENBAO, key_store_token=SECRET)
    assert isinstance(embedded.key_store(literal), keys.OpenBaoKeyStore)


# the embedded key store, and where a local one may live


def test_beside_a_configured_database_the_embedded_key_store_must_be_named(
    tmp_path: Path, database_url: str, store: Store
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        embedded.key_store(_settings(tmp_path, database_url=database_url))
    assert refused.value.code == "missing"
    assert str(refused.value).startswith(f"{KEY_STORE} is not set") and "file:///" in str(refused.value)
    named = embedded.key_store(_settings(tmp_path, database_url=database_url, key_store=f"file://{tmp_path}/keys"))
    assert isinstance(named, keys.LocalKeyStore) and named.root == tmp_path / "keys"


def test_with_the_embedded_database_the_embedded_key_store_is_the_default_outside_a_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = embedded.key_store(_settings(tmp_path))
    assert isinstance(local, keys.LocalKeyStore) and local.root == tmp_path / "data" / "keys"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with pytest.raises(ConfigurationError) as refused:
        embedded.key_store(_settings(tmp_path))
    assert refused.value.code == "missing" and f"{PREFIX}EMBEDDED=true" in str(refused.value)
    assert isinstance(embedded.key_store(_settings(tmp_path, embedded="true")), keys.LocalKeyStore)


def test_one_rule_refuses_both_embedded_defaults_in_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    messages = []
    for refuse in (embedded.database_url, embedded.key_store):
        with pytest.raises(ConfigurationError) as refused:
            refuse(_settings(tmp_path))
        messages.append(str(refused.value).split(" is not set; ", 1))
    only = f"is used only with {PREFIX}EMBEDDED=true"
    assert messages == [
        [f"{PREFIX}DATABASE_URL", f"inside a Kubernetes pod the embedded PostgreSQL {only}"],
        [KEY_STORE, f"inside a Kubernetes pod the embedded key store {only}"],
    ]


@pytest.mark.parametrize("inside", ["postgres", "postgres/keys", "postgres/../postgres/base/keys"])
def test_a_local_key_store_inside_the_embedded_database_directory_is_refused(tmp_path: Path, inside: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        embedded.key_store(_settings(tmp_path, key_store=f"file://{tmp_path}/data/{inside}"))
    assert refused.value.code == "inside_database"
    assert str(refused.value).startswith(f"{KEY_STORE}: inside") and str(tmp_path) not in str(refused.value)
    beside = embedded.key_store(_settings(tmp_path, key_store=f"file://{tmp_path}/data/postgres-keys"))
    assert isinstance(beside, keys.LocalKeyStore)


def test_a_local_key_store_inside_the_data_directory_a_socket_url_names_is_refused(
    tmp_path: Path, database_url: str, store: Store
) -> None:
    socket = Path(database_url.split("host=")[1])  # the suite's server: its socket lives in its data directory
    assert (socket / "PG_VERSION").is_file()
    with pytest.raises(ConfigurationError) as refused:
        embedded.key_store(_settings(tmp_path, database_url=database_url, key_store=f"file://{socket}/keys"))
    assert refused.value.code == "inside_database"


# every command, each in a process of its own


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMMAND, *args], env=env, capture_output=True, text=True, timeout=300)


def _every_command(env: dict[str, str]) -> dict[str, subprocess.CompletedProcess[str]]:
    commands = {"doctor": ["doctor"], "static": ["static", "--filepath", "/nonexistent"], "migrate": ["migrate"]}
    commands["sweep"] = ["sweep"]
    with ThreadPoolExecutor(len(commands)) as pool:  # two of them import kagent: side by side
        runs = {name: pool.submit(_run, args, env) for name, args in commands.items()}
        return {name: run.result() for name, run in runs.items()}


def _switch_off(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name != "KAGENT_GOVERNED_MEMORY"}


@pytest.mark.parametrize(
    ("given", "code", "setting"),
    [
        ({CA: "{home}/missing.pem", TOKEN: SECRET}, "ca_unreadable", CA),
        ({CA: "{home}/text", TOKEN: SECRET}, "ca_not_a_certificate", CA),
        ({TOKEN: "@{home}/missing"}, "token_unreadable", TOKEN),
    ],
    ids=["ca-missing", "ca-not-a-certificate", "token-file-missing"],
)
def test_every_command_refuses_an_unusable_key_store_setting_in_one_line(
    files: SimpleNamespace,
    bridge: Bridge,
    database_url: str,
    store: Store,
    given: dict[str, str],
    code: str,
    setting: str,
) -> None:
    values = {name: value.format(home=files.home) for name, value in given.items()}
    env = _switch_off(pod_environment(files.home, bridge, database_url, **{KEY_STORE: OPENBAO}, **values))
    runs = _every_command(env)
    for name, run in runs.items():
        assert "Traceback" not in run.stdout + run.stderr, name
        assert SECRET not in run.stdout + run.stderr, name
    doctor = runs["doctor"]
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    lines = [line.split() for line in doctor.stdout.splitlines()]
    assert [line[0] for line in lines][:8] == ["settings", "mode", "policy", "bridge_key", "bridge_issuer"] + [
        "homeserver",
        "agent_identity",
        "key_store",
    ]
    assert ["key_store", "FAILED", code, setting] in lines
    static = runs["static"]
    assert static.returncode == 78
    assert static.stderr.startswith(f"kagent-memory-governed: activation failed: {setting}: ")
    assert static.stderr.count("\n") == 1 and static.stdout == ""
    for name in ("migrate", "sweep"):
        assert (runs[name].returncode, runs[name].stdout) == (2, ""), runs[name].stderr
        assert runs[name].stderr.startswith(f"configuration error: {setting}: ")
        assert runs[name].stderr.count("\n") == 1


def test_a_command_beside_a_configured_database_refuses_a_missing_key_store(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store
) -> None:
    env = _switch_off(pod_environment(tmp_path, bridge, database_url))
    del env[KEY_STORE]
    migrate = _run(["migrate"], env)
    assert (migrate.returncode, migrate.stdout) == (2, "")
    assert migrate.stderr.startswith(f"configuration error: {KEY_STORE} is not set: ")
    assert migrate.stderr.count("\n") == 1
    static = _run(["static", "--filepath", "/nonexistent"], env)
    assert static.returncode == 78
    assert static.stderr.startswith(f"kagent-memory-governed: activation failed: {KEY_STORE} is not set: ")


def test_sweep_refuses_a_key_store_inside_the_embedded_database_before_starting_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    env |= {f"{PREFIX}DATA_DIR": str(tmp_path), KEY_STORE: f"file://{tmp_path}/postgres/keys"}
    swept = _run(["sweep"], env)
    assert (swept.returncode, swept.stdout) == (2, "")
    assert swept.stderr.startswith(f"configuration error: {KEY_STORE}: inside a database's data directory")
    assert not (tmp_path / "postgres").exists()  # no server was started


# a real OpenBao server: a token file that is good passes every check


@pytest.fixture
def openbao() -> Iterator[SimpleNamespace]:
    from openbao import served

    with served() as bao:
        yield SimpleNamespace(url=f"openbao+{bao.address}/{bao.mount}", token=bao.token)


def test_doctor_passes_a_token_file_that_openbao_accepts_and_fails_one_it_refuses(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store, openbao: SimpleNamespace
) -> None:
    token = tmp_path / "token"
    token.write_text(f"{openbao.token}\n")
    env = pod_environment(tmp_path, bridge, database_url, **{KEY_STORE: openbao.url, TOKEN: f"@{token}"})
    lines = [line.split() for line in _run(["doctor"], _switch_off(env)).stdout.splitlines()]
    assert ["key_store", "ok"] in lines, str(lines)  # the database is bound to the suite's key store: not this one
    token.write_text("not-the-token\n")
    lines = [line.split() for line in _run(["doctor"], _switch_off(env)).stdout.splitlines()]
    refused = next(line for line in lines if line[0] == "key_store")
    assert refused[:3] == ["key_store", "FAILED", "key_unavailable"], str(lines)  # the server refused the token
