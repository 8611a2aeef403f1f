"""The deploy files agree with the code: every command they run exists in the CLI, and every
setting they pass is a valid rlbus setting. (No Docker engine or Kubernetes API here: the
images are not built and nothing is applied; see docs/deploying.md.)"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from rlbus.bus.store.client import Rows
from rlbus.cli import app
from rlbus.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


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
    subcommand = [a for a in args if not a.startswith("-")][:2]
    result = CliRunner().invoke(app, [*subcommand, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, (
        f"`rlbus {' '.join(subcommand)}` is not a command: {result.output}"
    )
    for flag in (a for a in args if a.startswith("--")):
        assert re.search(rf"{flag}\b", result.output), (
            f"`rlbus {' '.join(subcommand)}` has no {flag}"
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


def grafana_dashboard() -> dict:
    import json

    return json.loads((DEPLOY / "grafana" / "rlbus.json").read_text())


@pytest.fixture(scope="module")
def panel_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rows]:
    """What each panel's SQL (and the run variable's) returns from a migrated store holding one
    event of each kind, through the read-only guard (Grafana's user is read-only too)."""
    from support.factories import make_event

    from rlbus.bus.store import open_store
    from rlbus.schemas import EVENT_TYPES

    dashboard = grafana_dashboard()
    queries = {p["title"]: t["rawSql"] for p in dashboard["panels"] for t in p["targets"]}
    run = next(v for v in dashboard["templating"]["list"] if v["name"] == "run")
    queries["variable run"] = run["query"]
    url = f"chdb://{tmp_path_factory.mktemp('grafana') / 'store'}"
    with open_store(url) as store:
        for i, kind in enumerate(EVENT_TYPES):
            store.insert_events([make_event(kind, 1, run_id="r1")], [(0, i)], f"t{i}")
    with open_store(url, read_only=True) as reader:
        return {title: reader.query(sql.replace("${run}", "r1")) for title, sql in queries.items()}


def test_grafana_panels_query_the_real_schema(panel_rows: dict[str, Rows]) -> None:
    for title, rows in panel_rows.items():
        assert rows.rows, f"no rows for {title!r}"


def test_grafana_charts_have_their_x_axis_and_say_their_units(
    panel_rows: dict[str, Rows],
) -> None:
    """A time series panel plots against a time column (Grafana shows "Data does not have a time
    field" otherwise); a curve over steps or versions is a trend panel whose x field its query
    returns, ascending. Every chart names the unit of its y axis and labels it."""
    charts = [p for p in grafana_dashboard()["panels"] if p["type"] in ("timeseries", "trend")]
    assert {p["type"] for p in charts} == {"timeseries", "trend"}
    for panel in charts:
        title, rows = panel["title"], panel_rows[panel["title"]]
        if panel["type"] == "timeseries":
            assert isinstance(rows.rows[0][0], datetime), f"{title!r}: no time column first"
        else:
            x = panel["options"]["xField"]
            assert x in rows.columns, f"{title!r}: x field {x!r} not in {rows.columns}"
            xs = [row[rows.columns.index(x)] for row in rows.rows]
            assert all(isinstance(v, int | float) for v in xs) and xs == sorted(xs), title
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults.get("unit") and defaults["custom"].get("axisLabel"), title


# -- many of each: replicas, the partitions that allow them, state every replica reaches -----

SCALED = ("env", "judge", "sink")
"""Roles whose replicas split their topics' partitions: more members than partitions idle."""
SINGLE = ("orchestrator", "trainer")
"""One per run (a second orchestrator waits as a standby; a second trainer would train twice)."""
OBJECT_STORES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
"""fsspec protocols of object stores every host reaches, and the package each needs."""


def compose_replicas(service: str) -> int:
    return int(all_compose_services()[service].get("deploy", {}).get("replicas", 1))


def json_patch(doc: dict, ops: list[dict]) -> None:
    """RFC 6902 add/replace/remove on `doc`, as kustomize applies a role's patches."""
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        key = int(last) if isinstance(node, list) else last
        if op["op"] == "remove":
            del node[key]
        else:
            node[key] = op["value"]


def kustomized(directory: Path) -> list[dict]:
    """The documents `kubectl apply -k DIRECTORY` creates, built the way kustomize does for
    what deploy/k8s uses: resources (files, or directories with their own kustomization),
    components, JSON 6902 patches, labels (into selectors too) and a name suffix (which
    kustomize also carries into an autoscaler's target)."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs: list[dict] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        docs += kustomized(path) if path.is_dir() else list(yaml.safe_load_all(path.read_text()))
    patches = list(spec.get("patches", []))
    for entry in spec.get("components", []):
        # A component adds its resources, and its patches apply to everything built here.
        component = yaml.safe_load(((directory / entry) / "kustomization.yaml").read_text())
        for resource in component.get("resources", []):
            docs += yaml.safe_load_all(((directory / entry) / resource).read_text())
        patches += component.get("patches", [])
    docs = [d for d in docs if d]
    for patch in patches:
        for doc in docs:
            if doc["kind"] == patch["target"]["kind"]:
                json_patch(doc, yaml.safe_load(patch["patch"]))
    for labels in spec.get("labels", []):
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(labels["pairs"])
            if labels.get("includeSelectors"):
                if doc["kind"] == "Deployment":
                    doc["spec"]["selector"]["matchLabels"].update(labels["pairs"])
                    doc["spec"]["template"]["metadata"]["labels"].update(labels["pairs"])
                if doc["kind"] == "Service":
                    doc["spec"]["selector"].update(labels["pairs"])
    suffix = spec.get("nameSuffix", "")
    for doc in docs:
        doc["metadata"]["name"] += suffix
        if doc["kind"] == "HorizontalPodAutoscaler":
            doc["spec"]["scaleTargetRef"]["name"] += suffix
    return docs


def k8s_role(role: str) -> dict[str, dict]:
    """The role's documents by kind."""
    return {d["kind"]: d for d in kustomized(DEPLOY / "k8s" / "roles" / role)}


def test_the_scaled_roles_run_several_and_the_run_wide_ones_once() -> None:
    for role in (*SCALED, "inference"):
        assert compose_replicas(role) >= 2, f"compose runs one {role}"
    for role in SINGLE:
        assert compose_replicas(role) == 1, f"compose runs {compose_replicas(role)} {role}s"
    for role in SCALED:
        docs = k8s_role(role)
        hpa, deployment = docs["HorizontalPodAutoscaler"], docs["Deployment"]
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert hpa["spec"]["minReplicas"] >= 2
        # The autoscaler owns the count: a replicas field would reset it on every apply.
        assert "replicas" not in deployment["spec"]
        assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert k8s_role("inference")["Deployment"]["spec"]["replicas"] >= 2
    for role in SINGLE:
        docs = k8s_role(role)
        assert "HorizontalPodAutoscaler" not in docs
        assert docs["Deployment"]["spec"]["replicas"] == 1
        # A rolling update would run the new pod beside the old one for a while.
        assert docs["Deployment"]["spec"]["strategy"] == {"type": "Recreate"}


def test_the_partition_count_allows_every_replica() -> None:
    compose_partitions = int(
        next(iter(compose_services().values()))["environment"]["RLBUS_KAFKA__PARTITIONS"]
    )
    k8s_partitions = int(configmap()["RLBUS_KAFKA__PARTITIONS"])
    for role in SCALED:
        assert compose_replicas(role) <= compose_partitions, role
        most = k8s_role(role)["HorizontalPodAutoscaler"]["spec"]["maxReplicas"]
        assert most <= k8s_partitions, f"{role} scales to {most} on {k8s_partitions} partitions"


def test_env_producers_reach_the_inference_replicas_by_a_name_they_share() -> None:
    compose_args = all_compose_services()["env"]["command"]
    host = urlsplit(compose_args[compose_args.index("--base-url") + 1]).hostname
    assert host == "inference" and "inference" in all_compose_services()
    k8s_args = k8s_role_args()["env"]
    url = urlsplit(k8s_args[k8s_args.index("--base-url") + 1])
    service = k8s_role("inference")["Service"]
    assert url.hostname == service["metadata"]["name"]
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "inference"


def test_inference_replicas_announce_an_address_other_pods_reach() -> None:
    """A Deployment's pod names do not resolve in cluster DNS, so the default announcement
    (http://HOSTNAME:PORT/v1) would send producers nowhere: each replica announces its pod IP,
    which Kubernetes substitutes into the args from the downward API."""
    container = k8s_role("inference")["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    url = args[args.index("--url") + 1]
    announced = re.fullmatch(r"http://\$\((\w+)\):(\d+)/v1", url)
    assert announced, f"--url {url} is not http://$(VARIABLE):PORT/v1"
    env = {e["name"]: e for e in container.get("env", [])}
    assert env[announced[1]]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert announced[2] == args[args.index("--port") + 1]


def test_claims_and_checkpoints_are_where_every_replica_reaches_them() -> None:
    """One Docker host: a volume every container mounts. Kubernetes: object storage (a local
    folder is one node's), with its fsspec backend installed in the image."""
    env = next(iter(compose_services().values()))["environment"]
    trainer_env = all_compose_services()["trainer"]["environment"]
    for service in compose_services().values():
        assert "shared:/shared" in service["volumes"]
    for url in (env["RLBUS_CLAIM_CHECK__URL"], trainer_env["RLBUS_TRAINER__CHECKPOINT_URL"]):
        assert urlsplit(interpolated(url, {})).path.startswith("/shared/"), url
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    installed = re.search(r'pip install --no-cache-dir "?\.\[([\w,]+)\]', dockerfile)
    assert installed, "the image installs rlbus without extras"
    extras = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    packages = {p for extra in installed.group(1).split(",") for p in extras[extra]}
    config = configmap()
    for key in ("RLBUS_CLAIM_CHECK__URL", "RLBUS_TRAINER__CHECKPOINT_URL"):
        scheme = urlsplit(config[key]).scheme
        assert scheme in OBJECT_STORES, f"{key} = {config[key]} is not on object storage"
        assert any(p.startswith(OBJECT_STORES[scheme]) for p in packages), (
            f"the image does not install {OBJECT_STORES[scheme]} for {key}"
        )


def test_consumers_use_session_timeouts_and_fetch_waits_for_a_kafka_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kafka and Redpanda refuse sessions under 6 s (group.min.session.timeout.ms), and answer a
    waiting fetch when records arrive: a long wait costs no latency there, only idle fetches."""
    compose_env = next(iter(compose_services().values()))["environment"]
    secret = {"CLICKHOUSE_PASSWORD": "x", "RLBUS_STORE__PASSWORD": "x"}
    for env in ({k: interpolated(str(v), secret) for k, v in compose_env.items()}, configmap()):
        for key in [k for k in os.environ if k.startswith("RLBUS_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, str(value))
        kafka = load_settings().kafka
        assert kafka.session_timeout_ms >= 6000
        assert 3 * kafka.heartbeat_interval_ms <= kafka.session_timeout_ms
        assert kafka.fetch_max_wait_ms >= 500
