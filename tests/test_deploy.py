"""The deploy files agree with the code: every command they run exists in the CLI, and every
setting they pass is a valid rlbus setting. (No Docker engine or Kubernetes API here: the
images are not built and nothing is applied; see README.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlbus.cli import app
from rlbus.config import load_settings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def compose_services() -> dict[str, dict]:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    return {name: svc for name, svc in services.items() if svc.get("image", "").startswith("rlbus")}


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
    compose_env = next(iter(compose_services().values()))["environment"]
    configmap = next(
        d
        for d in yaml.safe_load_all((DEPLOY / "k8s" / "config.yaml").read_text())
        if d["kind"] == "ConfigMap"
    )["data"]
    for env in (compose_env, configmap):
        for key in [k for k in os.environ if k.startswith("RLBUS_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, str(value).replace("${RLBUS_RUN_ID:-compose}", "compose"))
        settings = load_settings()
        assert settings.kafka.bootstrap_servers and settings.store.url.startswith("http://")


def test_grafana_panels_query_the_real_schema(tmp_path: Path) -> None:
    """Every panel's SQL runs against a migrated store holding one event of each kind."""
    import json

    from factories import make_event

    from rlbus.bus.store import open_store
    from rlbus.schemas import EVENT_TYPES

    dashboard = json.loads((DEPLOY / "grafana" / "rlbus.json").read_text())
    queries = [t["rawSql"] for p in dashboard["panels"] for t in p["targets"]]
    queries.append(next(v for v in dashboard["templating"]["list"] if v["name"] == "run")["query"])
    with open_store(f"chdb://{tmp_path / 'store'}") as store:
        for i, kind in enumerate(EVENT_TYPES):
            store.insert_events([make_event(kind, 1, run_id="r1")], [(0, i)], f"t{i}")
        for sql in queries:
            rows = store.query(sql.replace("${run}", "r1")).rows
            assert rows, f"no rows from: {sql}"
