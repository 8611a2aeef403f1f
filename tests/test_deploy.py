"""The deploy files agree with the code: every command they run exists in the CLI, and every
setting they pass is a valid rlbus setting. (No Docker engine or Kubernetes API here: the
images are not built and nothing is applied; see docs/deploying.md.)"""

from __future__ import annotations

import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from rlbus.cli import app
from rlbus.config import load_settings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def all_compose_services() -> dict[str, dict]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]


def compose_services() -> dict[str, dict]:
    services = all_compose_services()
    return {name: svc for name, svc in services.items() if svc.get("image", "").startswith("rlbus")}


INTERPOLATION = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


def interpolated(value: str, env: dict[str, str]) -> str:
    """`value` as docker compose resolves ${NAME}, ${NAME:-default} and ${NAME:?error}."""
    return INTERPOLATION.sub(lambda m: env.get(m.group(1), m.group(2) or ""), value)


def configmap() -> dict[str, str]:
    return next(
        d
        for d in yaml.safe_load_all((DEPLOY / "k8s" / "config.yaml").read_text())
        if d["kind"] == "ConfigMap"
    )["data"]


def k8s_role_args() -> dict[str, list[str]]:
    out = {}
    for kustomization in sorted((DEPLOY / "k8s" / "roles").glob("*/kustomization.yaml")):
        patch = yaml.safe_load(yaml.safe_load(kustomization.read_text())["patches"][0]["patch"])
        out[kustomization.parent.name] = patch[0]["value"]
    return out


def test_every_role_is_deployed_both_ways() -> None:
    roles = {"sink", "inference", "env", "judge", "orchestrator", "trainer"}
    assert set(compose_services()) == roles
    assert set(k8s_role_args()) == roles
    listed = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]
    assert {r.removeprefix("roles/") for r in listed if r.startswith("roles/")} == roles


@pytest.mark.parametrize(
    "args", [*(svc["command"] for svc in compose_services().values()), *k8s_role_args().values()]
)
def test_deployed_commands_exist(args: list[str]) -> None:
    # The command's own flags are checked by --help parsing up to the subcommand.
    subcommand = [a for a in args if not a.startswith("-")][:2]
    result = CliRunner().invoke(app, [*subcommand, "--help"])
    assert result.exit_code == 0, (
        f"`rlbus {' '.join(subcommand)}` is not a command: {result.output}"
    )


def test_deployed_settings_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the secrets an operator supplies (deploy/.env; a Kubernetes Secret), every role's
    settings load, and the store password reaches the store URL."""
    compose_env = next(iter(compose_services().values()))["environment"]
    secret = {"CLICKHOUSE_PASSWORD": "from-dot-env"}
    k8s_secret = {"RLBUS_STORE__PASSWORD": "from-dot-env"}
    for env in (
        {k: interpolated(str(v), secret) for k, v in compose_env.items()},
        {**configmap(), **k8s_secret},
    ):
        for key in [k for k in os.environ if k.startswith("RLBUS_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, str(value))
        settings = load_settings()
        assert settings.kafka.bootstrap_servers and settings.store.url.startswith("http://")
        assert urlsplit(settings.store.url.reveal()).password == "from-dot-env"
        assert "from-dot-env" not in f"{settings.store.url} {settings!r}"


def test_services_listen_on_the_compose_network_or_host_loopback_only() -> None:
    for name, service in all_compose_services().items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    published = {n for n, s in all_compose_services().items() if s.get("ports")}
    # ClickHouse for `rlbus sql` from the host, Grafana for a browser; Redpanda stays inside.
    assert published == {"clickhouse", "grafana"}


def test_no_password_is_committed_in_deploy_files() -> None:
    """Passwords come from the environment (compose: ${VAR} from an uncommitted deploy/.env)
    or a Kubernetes Secret, never from a committed file."""
    compose_env = {
        k: str(v)
        for svc in all_compose_services().values()
        for k, v in (svc.get("environment") or {}).items()
    }
    for key, value in compose_env.items():
        if "PASSWORD" in key:
            assert INTERPOLATION.fullmatch(value), f"{key} in compose.yaml is not from the env"
        if key == "RLBUS_STORE__URL":
            assert urlsplit(value).password is None, "a password in compose's store URL"
    for key, value in configmap().items():
        assert "PASSWORD" not in key and urlsplit(str(value)).password is None, key
    deployment = yaml.safe_load((DEPLOY / "k8s" / "base" / "deployment.yaml").read_text())
    env_from = deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    assert {"secretRef": {"name": "rlbus-secrets"}} in env_from  # required, not optional
    tracked = subprocess.run(
        ["git", "ls-files", str(DEPLOY)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [f for f in tracked if f.endswith(".env") or "secret" in Path(f).name.lower()]
    assert ".env" in (DEPLOY / ".gitignore").read_text().split()
    for manifest in (DEPLOY / "k8s").rglob("*.yaml"):
        for doc in yaml.safe_load_all(manifest.read_text()):
            assert not (doc and doc.get("kind") == "Secret"), f"a Secret committed in {manifest}"


def bind_mounts(service: str) -> dict[str, Path]:
    """A compose service's bind mounts: container path -> the file or folder in deploy/."""
    mounts = {}
    for volume in all_compose_services()[service].get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("."):
            mounts[target] = (DEPLOY / source).resolve()
    return mounts


def test_clickhouse_gets_the_housekeeping_and_grafana_user_snippets() -> None:
    mounts = bind_mounts("clickhouse")
    logs = mounts["/etc/clickhouse-server/config.d/rlbus-system-logs.xml"]
    assert logs == DEPLOY / "clickhouse" / "system-logs.xml"  # tested in test_store_housekeeping
    users = ET.parse(mounts["/etc/clickhouse-server/users.d/rlbus-grafana.xml"]).getroot()
    profile = users.find("users/grafana/profile").text  # type: ignore[union-attr]
    assert users.find(f"profiles/{profile}/readonly").text == "1"  # type: ignore[union-attr]
    grants = [g.text for g in users.findall("users/grafana/grants/query")]
    assert grants == ["GRANT SELECT ON default.*"]
    password = users.find("users/grafana/password")
    assert password is not None and not password.text
    variable = password.get("from_env")
    assert variable in all_compose_services()["clickhouse"]["environment"]


def grafana_provisioning() -> tuple[dict, dict]:
    root = bind_mounts("grafana")["/etc/grafana/provisioning"]
    datasources = yaml.safe_load((root / "datasources" / "clickhouse.yaml").read_text())
    dashboards = yaml.safe_load((root / "dashboards" / "rlbus.yaml").read_text())
    return datasources, dashboards


def test_grafana_provisions_the_clickhouse_source_and_the_dashboard() -> None:
    """What Grafana reads at start-up, checked field by field against what it needs (no Docker
    here: Grafana itself does not load them in this test)."""
    import json

    services = all_compose_services()
    grafana = services["grafana"]
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_INSTALL_PLUGINS"]
    datasources, dashboards = grafana_provisioning()
    assert datasources["apiVersion"] == 1 and dashboards["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "grafana-clickhouse-datasource" and source["name"]
    options = source["jsonData"]
    assert options["host"] in services and options["protocol"] == "http"
    assert f"{options['port']}:{options['port']}" in services[options["host"]]["ports"][0]
    users = ET.parse(DEPLOY / "clickhouse" / "grafana-user.xml").getroot()
    assert users.find(f"users/{options['username']}") is not None
    # The password is Grafana's expansion of its own environment, set from deploy/.env.
    variable = source["secureJsonData"]["password"].removeprefix("$").strip("{}")
    assert variable in grafana["environment"]
    assert grafana["environment"][variable] == services["clickhouse"]["environment"][variable]
    (provider,) = dashboards["providers"]
    assert provider["type"] == "file"
    mounted = bind_mounts("grafana")
    path = provider["options"]["path"]
    files = [target for target in mounted if str(Path(target).parent) == path]
    assert files and all(mounted[f].suffix == ".json" and mounted[f].is_file() for f in files)
    dashboard = json.loads(mounted[files[0]].read_text())
    assert dashboard["uid"] and dashboard["title"]
    kinds = {p["datasource"]["type"] for p in dashboard["panels"]}
    kinds |= {t["datasource"]["type"] for p in dashboard["panels"] for t in p["targets"]}
    assert kinds == {source["type"]}
    (variable_source,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable_source["query"] == source["type"]


def test_grafana_panels_query_the_real_schema(tmp_path: Path) -> None:
    """Every panel's SQL runs against a migrated store holding one event of each kind, through
    the read-only guard (Grafana's user is read-only too)."""
    import json

    from factories import make_event

    from rlbus.bus.store import open_store
    from rlbus.schemas import EVENT_TYPES

    dashboard = json.loads((DEPLOY / "grafana" / "rlbus.json").read_text())
    queries = [t["rawSql"] for p in dashboard["panels"] for t in p["targets"]]
    queries.append(next(v for v in dashboard["templating"]["list"] if v["name"] == "run")["query"])
    url = f"chdb://{tmp_path / 'store'}"
    with open_store(url) as store:
        for i, kind in enumerate(EVENT_TYPES):
            store.insert_events([make_event(kind, 1, run_id="r1")], [(0, i)], f"t{i}")
    with open_store(url, read_only=True) as reader:
        for sql in queries:
            rows = reader.query(sql.replace("${run}", "r1")).rows
            assert rows, f"no rows from: {sql}"
