"""The files under deploy/ agree with the service they deploy.

No container engine or cluster runs here, so these check what can be checked
without one: every YAML parses, the image is non-root with a health check and no
secrets, every ``RECONCILER_*`` variable is one the service reads, secrets are
only referenced, the example configurations load, and the shell script parses.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from reconciler import config
from reconciler.config import LOG_LEVELS, CallbackSettings, ConsoleSettings, Settings, load_settings
from reconciler.providers.loader import load_providers

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
SCRIPT = DEPLOY / "local-replicas.sh"
UNIT = DEPLOY / "systemd" / "reconciler.service"

WHSEC = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "KEY", "DATABASE_URL", "CREDENTIAL")
ENV_NAME = re.compile(r"\bRECONCILER_[A-Z0-9_]+")


def _yaml() -> Any:
    return pytest.importorskip(
        "yaml",
        reason="PyYAML is not installed; it should be in the test extras (pyproject.toml)",
    )


def load_yaml(path: Path) -> Any:
    return _yaml().safe_load(path.read_text())


def load_yaml_all(path: Path) -> list[Any]:
    return list(_yaml().safe_load_all(path.read_text()))


def is_secret_name(name: str) -> bool:
    return any(word in name.upper() for word in SECRET_WORDS)


def deploy_text_files() -> Iterator[Path]:
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path


# --- which RECONCILER_* names the service reads ---------------------------------------


def _sample(default: Any, name: str = "") -> str | None:
    """A value for a setting's variable that differs from its default, or None."""
    if isinstance(default, bool):
        return str(not default).lower()
    if isinstance(default, int | float):
        return str(default + 1)
    if isinstance(default, str):
        if default.startswith("sqlite"):
            return "sqlite:///elsewhere.db"
        if default in LOG_LEVELS:
            return next(level for level in LOG_LEVELS if level != default)
        if default == "":  # an optional URL (server.public_url)
            return "https://sample.example"
        return default + "-changed"
    if isinstance(default, tuple):
        return "sample.example:run" if name == "hooks" else "sample.example"
    return None


def _candidates() -> Iterator[tuple[str, str]]:
    defaults = Settings()
    for name in Settings.model_fields:
        value = getattr(defaults, name)
        if isinstance(value, BaseModel):
            for sub in type(value).model_fields:
                sample = _sample(getattr(value, sub))
                if sample is not None:
                    yield f"{config.ENV_PREFIX}{name.upper()}_{sub.upper()}", sample
        else:
            sample = _sample(value, name)
            if sample is not None:
                yield f"{config.ENV_PREFIX}{name.upper()}", sample


def settings_variables() -> set[str]:
    """Names whose value changes the loaded settings: derived from the models, then
    kept only if ``load_settings`` really honours them."""
    base = load_settings(None, environ={}).model_dump()
    return {
        name
        for name, sample in _candidates()
        if load_settings(None, environ={name: sample}).model_dump() != base
    }


def known_variables() -> set[str]:
    secrets = {
        CallbackSettings().signing_secret_env,
        ConsoleSettings().session_secret_env,
        config.AUDIT_KEY_ENV,
        config.CONFIG_ENV,
    }
    return settings_variables() | secrets | {"RECONCILER_DATABASE_URL"}


def test_the_variable_derivation_finds_real_settings_only() -> None:
    names = settings_variables()
    assert {"RECONCILER_DATABASE_URL", "RECONCILER_SERVER_HOST", "RECONCILER_SERVER_PORT"} <= names
    assert "RECONCILER_SCHEDULER_TICK_SECONDS" in names
    # Metadata fields are model fields but not settings.
    assert not {"RECONCILER_SOURCE", "RECONCILER_BASE_DIR", "RECONCILER_PROVIDERS"} & names


def test_every_reconciler_variable_in_deploy_maps_to_a_setting() -> None:
    valid = known_variables()
    unknown: dict[str, set[str]] = {}
    for path in deploy_text_files():
        for name in ENV_NAME.findall(path.read_text(errors="replace")):
            if name not in valid:
                unknown.setdefault(str(path.relative_to(ROOT)), set()).add(name)
    assert unknown == {}


# --- provider credentials named by the provider files -----------------------------------


class RecordingEnviron(Mapping[str, str]):
    """Answers every variable with a valid value and remembers which were asked for."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return WHSEC

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def provider_variables(directory: Path) -> set[str]:
    environ = RecordingEnviron()
    specs = load_providers(directory, {}, environ)
    assert specs, f"no provider in {directory}"
    return environ.asked


# --- every YAML file -------------------------------------------------------------------


def test_every_yaml_file_parses() -> None:
    files = [p for p in deploy_text_files() if p.suffix in {".yaml", ".yml"}]
    assert COMPOSE in files
    assert len([p for p in files if p.parent == K8S]) >= 7
    for path in files:
        documents = load_yaml_all(path)
        assert documents, path
        assert all(isinstance(doc, dict) for doc in documents), path


# --- Dockerfile ------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions (keyword, arguments) per stage; comments dropped, continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[list[tuple[str, str]]] = [[]]
    for line in logical:
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append((keyword.upper(), rest.strip()))
    return stages


def _args(stage: list[tuple[str, str]], keyword: str) -> list[str]:
    return [rest for kw, rest in stage if kw == keyword]


def test_dockerfile_is_multi_stage_on_python_311_slim() -> None:
    stages = dockerfile_stages()
    preamble, build = stages[0], stages[1]
    assert len(stages) >= 3
    assert any("python:3.11-slim" in arg for arg in _args(preamble, "ARG"))
    run = " ".join(_args(build, "RUN"))
    assert "pip wheel" in run
    assert "[postgres]" in run
    assert any("--from=build" in arg for stage in stages[2:] for arg in _args(stage, "COPY"))


def test_dockerfile_service_stage_is_non_root_with_healthcheck() -> None:
    service = dockerfile_stages()[-1]
    users = _args(service, "USER")
    assert users, "the final stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric, non-zero uid (runAsNonRoot checks it)"
    (healthcheck,) = _args(service, "HEALTHCHECK")
    assert "/healthz" in healthcheck
    assert "8080" in _args(service, "EXPOSE")
    assert _args(service, "ENTRYPOINT") == ['["reconciler"]']
    assert _args(service, "CMD") == ['["serve"]']
    assert "RECONCILER_SERVER_HOST=0.0.0.0" in _args(service, "ENV")


def test_dockerfile_holds_no_secrets() -> None:
    text = DOCKERFILE.read_text()
    assert "whsec_" not in text
    for stage in dockerfile_stages():
        for keyword in ("ENV", "ARG"):
            for arg in _args(stage, keyword):
                for word in shlex.split(arg):
                    name = word.split("=", 1)[0]
                    assert not is_secret_name(name), f"{keyword} {name} would bake a secret"


def test_dockerignore_lets_in_only_what_the_dockerfile_copies() -> None:
    ignore = DEPLOY / "Dockerfile.dockerignore"
    lines = [
        line.strip()
        for line in ignore.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines[0] == "*", "exclude everything first, then let back in what is copied"
    allowed = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    for stage in dockerfile_stages():
        for arg in _args(stage, "COPY"):
            words = [w for w in arg.split() if not w.startswith("--")]
            if any(w.startswith("--from") for w in arg.split()):
                continue
            for source in words[:-1]:
                assert any(source == a or source.startswith(a + "/") for a in allowed), source
    assert {".env", "*.env"} <= {line.removeprefix("**/") for line in lines}


# --- compose ---------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def test_compose_topology() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "migrate", "reconciler-1", "reconciler-2", "provider-sim"}
    assert services["postgres"]["image"].startswith("postgres:15")
    assert services["migrate"]["command"] == ["db", "upgrade"]
    for name in ("reconciler-1", "reconciler-2"):
        replica = services[name]
        assert replica["command"] == ["serve", "--no-migrate"]
        assert replica["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert replica["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert "/readyz" in " ".join(replica["healthcheck"]["test"])
        assert replica["read_only"] is True
        assert all(port.startswith("127.0.0.1:") for port in replica["ports"])
        assert replica["environment"]["RECONCILER_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in replica["environment"]["RECONCILER_DATABASE_URL"]
    for name in ("postgres", "provider-sim"):
        assert services[name]["healthcheck"]["test"], name
    assert services["provider-sim"]["build"]["target"] == "provider-sim"


def test_compose_mounts_providers_read_only() -> None:
    services = compose()["services"]
    for name in ("migrate", "reconciler-1", "reconciler-2"):
        mounts = services[name]["volumes"]
        providers = [m for m in mounts if m.split(":")[1] == "/etc/reconciler/providers"]
        assert providers and all(m.endswith(":ro") for m in providers), name
        assert all(m.endswith(":ro") for m in mounts), name


def _environment_items(service: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        for item in env:
            name, _, value = str(item).partition("=")
            yield name, value
    else:
        for name, value in env.items():
            yield name, "" if value is None else str(value)


def test_compose_has_no_literal_secrets() -> None:
    assert "whsec_" not in COMPOSE.read_text()
    for name, service in compose()["services"].items():
        for key, value in _environment_items(service):
            if key.endswith("_FILE"):
                continue
            if is_secret_name(key):
                assert re.search(r"\$\{[A-Z0-9_]+:\?[^}]+\}", value), f"{name}: {key} is literal"


def test_compose_env_example_names_every_required_variable() -> None:
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", json.dumps(compose())))
    example = _env_file(DEPLOY / "compose" / "env.example")
    assert required <= set(example)
    assert all(value == "REPLACE_ME" for value in example.values())


def test_compose_replicas_get_every_provider_credential() -> None:
    needed = provider_variables(DEPLOY / "compose" / "providers")
    services = compose()["services"]
    for name in ("reconciler-1", "reconciler-2"):
        assert needed <= {key for key, _ in _environment_items(services[name])}, name
    sim_env = {key for key, _ in _environment_items(services["provider-sim"])}
    assert needed <= sim_env


def test_compose_provider_file_is_the_fixture_but_for_base_url() -> None:
    fixture = tomllib.loads((ROOT / "service/reconciler/demo/sim/sim.toml").read_text())
    deployed = tomllib.loads((DEPLOY / "compose" / "providers" / "sim.toml").read_text())
    assert deployed["providers"]["sim"].pop("base_url") == "http://provider-sim:9000"
    fixture["providers"]["sim"].pop("base_url")
    assert deployed == fixture


# --- Kubernetes ------------------------------------------------------------------------


def k8s(name: str) -> dict[str, Any]:
    data = load_yaml(K8S / name)
    assert isinstance(data, dict)
    return data


def _pod_spec(manifest: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return spec


def _check_hardened(pod: Mapping[str, Any]) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["requests"] and container["resources"]["limits"]


def _check_secrets_by_reference(pod: Mapping[str, Any], secret_keys: set[str]) -> set[str]:
    names: set[str] = set()
    for container in pod["containers"]:
        for item in container.get("env", []):
            names.add(item["name"])
            if is_secret_name(item["name"]):
                assert "value" not in item, f"{item['name']} must come from a Secret"
                ref = item["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "reconciler-secrets"
                assert ref["key"] in secret_keys
                assert ref.get("optional") is not True
    return names


def _secret_example() -> dict[str, str]:
    secret = k8s("secret.example.yaml")
    assert secret["kind"] == "Secret"
    data: dict[str, str] = secret["stringData"]
    assert all("REPLACE_ME" in value for value in data.values())
    return data


def test_k8s_deployment() -> None:
    deployment = k8s("deployment.yaml")
    assert deployment["kind"] == "Deployment"
    assert deployment["spec"]["replicas"] == 2
    pod = _pod_spec(deployment)
    _check_hardened(pod)
    (container,) = pod["containers"]
    assert container["args"] == ["serve", "--no-migrate"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port_names = {p["name"] for p in container["ports"] if p["containerPort"] == 8080}
    assert container["readinessProbe"]["httpGet"]["port"] in port_names | {8080}
    env = _check_secrets_by_reference(pod, set(_secret_example()))
    needed = {"RECONCILER_DATABASE_URL", "RECONCILER_CALLBACK_SECRET", "RECONCILER_AUDIT_KEY"}
    assert needed <= env


def test_k8s_deployment_gets_every_provider_credential(tmp_path: Path) -> None:
    providers = _configmap_providers(tmp_path)
    env = _check_secrets_by_reference(_pod_spec(k8s("deployment.yaml")), set(_secret_example()))
    assert provider_variables(providers) <= env


def test_k8s_config_volume_matches_the_configmap() -> None:
    configmap = k8s("configmap.yaml")
    pod = _pod_spec(k8s("deployment.yaml"))
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    items = {item["key"]: item["path"] for item in volume["configMap"]["items"]}
    assert set(items) == set(configmap["data"])
    assert items["reconciler.toml"] == "reconciler.toml"
    providers_dir = tomllib.loads(configmap["data"]["reconciler.toml"])["providers_dir"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    for key, path in items.items():
        if key != "reconciler.toml":
            assert str(Path(mount["mountPath"]) / path).startswith(providers_dir + "/")
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["RECONCILER_CONFIG"] == str(Path(mount["mountPath"]) / "reconciler.toml")


def test_k8s_migrate_job() -> None:
    job = k8s("migrate-job.yaml")
    assert job["kind"] == "Job"
    pod = _pod_spec(job)
    _check_hardened(pod)
    assert pod["containers"][0]["args"] == ["db", "upgrade"]
    env = _check_secrets_by_reference(pod, set(_secret_example()))
    assert "RECONCILER_DATABASE_URL" in env


def test_k8s_service_selects_the_pods() -> None:
    service = k8s("service.yaml")
    deployment = k8s("deployment.yaml")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    port_names = {
        p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert all(p["targetPort"] in port_names for p in service["spec"]["ports"])


def test_k8s_kustomization_lists_everything_but_the_secret_example() -> None:
    kustomization = k8s("kustomization.yaml")
    resources = kustomization["resources"]
    expected = {
        p.name
        for p in K8S.glob("*.yaml")
        if p.name not in {"kustomization.yaml", "secret.example.yaml"}
    }
    assert set(resources) == expected
    assert "namespace" not in kustomization, "the set stays namespace-agnostic"
    images = {image["name"] for image in kustomization["images"]}
    for name in ("deployment.yaml", "migrate-job.yaml"):
        for container in _pod_spec(k8s(name))["containers"]:
            assert container["image"].split(":")[0] in images
    for path in K8S.glob("*.yaml"):
        for doc in load_yaml_all(path):
            assert "namespace" not in doc.get("metadata", {}), path.name


# --- example configurations load ---------------------------------------------------------


def _configmap_providers(tmp_path: Path) -> Path:
    directory = tmp_path / "k8s-providers"
    directory.mkdir()
    for key, text in k8s("configmap.yaml")["data"].items():
        if key != "reconciler.toml":
            (directory / key).write_text(text)
    return directory


def _load(toml_text: str, tmp_path: Path, providers: Path) -> Settings:
    path = tmp_path / "reconciler.toml"
    path.write_text(toml_text)
    environ = {
        "RECONCILER_DATABASE_URL": "postgresql+psycopg://reconciler@db.invalid:5432/reconciler",
        # The example points at the mount path; here the same files are in tmp_path.
        "RECONCILER_PROVIDERS_DIR": str(providers),
    }
    settings = load_settings(path, environ=environ)
    load_providers(settings.providers_path(), settings.providers, RecordingEnviron())
    return settings


def test_configmap_example_loads(tmp_path: Path) -> None:
    text = k8s("configmap.yaml")["data"]["reconciler.toml"]
    assert tomllib.loads(text)["providers_dir"] == "/etc/reconciler/providers"
    settings = _load(text, tmp_path, _configmap_providers(tmp_path))
    assert settings.database_url.startswith("postgresql+psycopg://")
    assert settings.server.port == 8080


def test_compose_config_loads(tmp_path: Path) -> None:
    text = (DEPLOY / "compose" / "reconciler.toml").read_text()
    settings = _load(text, tmp_path, DEPLOY / "compose" / "providers")
    assert settings.server.port == 8080


def test_systemd_config_loads(tmp_path: Path) -> None:
    providers = _configmap_providers(tmp_path)
    settings = _load((DEPLOY / "systemd" / "reconciler.toml").read_text(), tmp_path, providers)
    assert settings.server.host == "127.0.0.1"


# --- systemd ---------------------------------------------------------------------------


def _unit_values() -> dict[tuple[str, str], list[str]]:
    """Every (section, key) with all its values; systemd keys may repeat."""
    values: dict[tuple[str, str], list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not key=value: {line!r}"
        values.setdefault((section, key.strip()), []).append(value.strip())
    return values


def test_systemd_unit_parses_as_ini() -> None:
    parser = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment, method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    assert set(parser.sections()) == {"Unit", "Service", "Install"}


def test_systemd_unit_is_hardened() -> None:
    v = _unit_values()

    def one(key: str, section: str = "Service") -> str:
        (value,) = v[(section, key)]
        return value

    assert one("DynamicUser") == "yes" or one("User") not in {"", "root", "0"}
    assert one("ProtectSystem") == "strict"
    assert one("StateDirectory") == "reconciler"
    assert one("EnvironmentFile") == "/etc/reconciler/env"
    assert one("ExecStartPre").endswith("reconciler db upgrade")
    assert one("ExecStart").endswith("reconciler serve --no-migrate")
    assert one("Restart") in {"on-failure", "always"}
    assert one("NoNewPrivileges") == "yes"
    assert one("ProtectHome") == "yes"
    assert one("PrivateTmp") == "yes"
    assert one("CapabilityBoundingSet") == ""
    assert one("WantedBy", "Install") == "multi-user.target"
    for value in v[("Service", "Environment")]:
        assert not is_secret_name(value.split("=", 1)[0]), "secrets belong in the env file"


def _env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{path.name}: {line!r}"
        values[key] = value
    return values


def test_systemd_env_example_holds_only_placeholders(tmp_path: Path) -> None:
    values = _env_file(DEPLOY / "systemd" / "env.example")
    assert {"RECONCILER_DATABASE_URL", "RECONCILER_CALLBACK_SECRET", "RECONCILER_AUDIT_KEY"} <= set(
        values
    )
    for key, value in values.items():
        if is_secret_name(key):
            assert "REPLACE_ME" in value, key
    assert provider_variables(_configmap_providers(tmp_path)) <= set(values)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not found")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    # The binaries are not installed here; any executable stands in for them.
    text = UNIT.read_text().replace("/opt/reconciler/bin/reconciler", "/bin/true")
    unit = tmp_path / "reconciler.service"
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "reconciler.service" not in done.stderr, done.stderr


# --- local-replicas.sh ---------------------------------------------------------------------


def test_local_replicas_script_parses_and_is_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in SCRIPT.read_text()
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not found")
def test_local_replicas_script_is_shellcheck_clean() -> None:
    done = subprocess.run(
        ["shellcheck", "-x", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout


def _script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STATE_DIR": str(tmp_path / "state")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, env=env
    )


def test_local_replicas_usage_and_stop_without_start(tmp_path: Path) -> None:
    usage = _script(tmp_path)
    assert usage.returncode == 2
    assert "usage:" in usage.stderr
    stop = _script(tmp_path, "stop")
    assert stop.returncode == 0
    assert "nothing to stop" in stop.stderr
    assert _script(tmp_path, "start", "--bogus").returncode != 0
