"""`rlbus env install|list|remove` (rlbus.environment.hosted.venvs), real venvs and pip, offline:
tiny packages written here, built by an in-tree PEP 517 backend that needs nothing from an
index. An installed package imports in its own venv and not in rlbus's; its build sees none of
rlbus's secrets; a package that cannot be built leaves nothing behind, and a failed reinstall
leaves the previous one as it was."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlbus.cli import app
from rlbus.environment.hosted.venvs import (
    EnvInstallError,
    install_env,
    name_of_spec,
    passed_environment,
    venv_python,
)

BACKEND = '''
"""A PEP 517 backend that writes one module into a wheel (nothing to fetch)."""
import base64, hashlib, os, zipfile

NAME, DIST, VERSION, FAIL = {name!r}, {dist!r}, {version!r}, {fail!r}


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if FAIL:
        raise RuntimeError(f"{{NAME}}'s build failed on purpose")
    info = f"{{DIST}}-{{VERSION}}.dist-info"
    files = {{
        f"{{DIST}}.py": f"SECRET = {{os.environ.get('RLBUS_TEST_SECRET')!r}}\\n".encode(),
        f"{{info}}/METADATA": (
            f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n".encode()
        ),
        f"{{info}}/WHEEL": b"Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }}
    record = ""
    for member, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{{member}},sha256={{digest}},{{len(data)}}\\n"
    record += f"{{info}}/RECORD,,\\n"
    wheel = f"{{DIST}}-{{VERSION}}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
        archive.writestr(f"{{info}}/RECORD", record)
    return wheel
'''


def a_package(
    folder: Path, name: str, version: str = "0.1.0", fail: bool = False, named: bool = True
) -> Path:
    """A source tree of distribution `name` with one module (its name, underscored) that says
    whether its build saw RLBUS_TEST_SECRET. `named`: pyproject.toml names it (else only its
    build says the name)."""
    dist = re.sub(r"[-.]+", "_", name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "backend.py").write_text(
        BACKEND.format(name=name, dist=dist, version=version, fail=fail)
    )
    project = f'\n[project]\nname = "{name}"\nversion = "{version}"\n' if named else ""
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n' + project
    )
    return folder


def rlbus_env(data: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["env", *args, "--store.url", f"chdb://{data}"])
    return result.exit_code, " ".join(result.output.split())


def imports(python: str | Path, module: str) -> subprocess.CompletedProcess[str]:
    code = f"import {module}; print({module}.SECRET)"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("verifiers-env", "verifiers-env"),
        ("Some_Env[extra]>=1.2", "Some_Env"),
        ("some-env @ git+https://github.com/o/r@v1", "some-env"),
        ("git+https://github.com/o/r@v1#egg=some_env", "some_env"),
        ("git+https://github.com/o/r@v1", None),
        ("https://example.com/wheels/some_env-1.0-py3-none-any.whl", "some_env"),
        ("/nowhere/some-env-1.0.tar.gz", "some-env"),
    ],
)
def test_the_name_a_spec_says(spec: str, name: str | None) -> None:
    assert name_of_spec(spec) == name


def test_a_folder_s_name_is_its_pyproject_s(tmp_path: Path) -> None:
    assert name_of_spec(str(a_package(tmp_path / "a", "tiny-env"))) == "tiny-env"
    assert name_of_spec(str(a_package(tmp_path / "b", "tiny-env", named=False))) is None


def test_pip_sees_pip_settings_and_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBUS_STORE__PASSWORD", "hunter2")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels")
    passed = passed_environment()
    assert passed["PIP_FIND_LINKS"] == "/wheels" and "PATH" in passed
    assert "RLBUS_STORE__PASSWORD" not in passed and "OPENAI_API_KEY" not in passed


@pytest.mark.slow
def test_install_list_reinstall_remove(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBUS_TEST_SECRET", "hunter2")
    data, source = tmp_path / "data", a_package(tmp_path / "src", "Tiny.Env")
    code, said = rlbus_env(data, "install", str(source))
    assert code == 0, said
    venv = data / "envs" / "tiny-env"
    record = json.loads((venv / "rlbus-env.json").read_text())
    assert record["spec"] == str(source) and record["distribution"] == "Tiny.Env"
    assert record["version"] == "0.1.0" and record["modules"] == ["Tiny_Env"]
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    # Importable with the venv's python, and its build never saw rlbus's secret.
    seen = imports(venv_python(venv), "Tiny_Env")
    assert seen.returncode == 0 and seen.stdout.strip() == "None", seen.stderr
    assert "No module named 'Tiny_Env'" in imports(sys.executable, "Tiny_Env").stderr

    code, said = rlbus_env(data, "list")
    assert code == 0 and "tiny-env" in said and "0.1.0" in said and "Tiny_Env" in said

    code, said = rlbus_env(data, "install", str(source))
    assert code == 2 and "environment 'tiny-env' is already installed" in said
    assert "--force installs it again" in said

    a_package(source, "Tiny.Env", version="0.2.0")
    code, said = rlbus_env(data, "install", str(source), "--force")
    assert code == 0, said
    assert json.loads((venv / "rlbus-env.json").read_text())["version"] == "0.2.0"

    # A reinstall that fails leaves the installed one as it was.
    a_package(source, "Tiny.Env", version="0.3.0", fail=True)
    code, said = rlbus_env(data, "install", str(source), "--force")
    assert code == 2 and "failed on purpose" in said
    assert json.loads((venv / "rlbus-env.json").read_text())["version"] == "0.2.0"
    assert imports(venv_python(venv), "Tiny_Env").returncode == 0
    assert sorted(p.name for p in (data / "envs").iterdir()) == ["tiny-env"]

    code, said = rlbus_env(data, "remove", "Tiny_Env")
    assert code == 0 and f"removed tiny-env ({venv})" in said
    assert not venv.exists()
    assert "no environment installed" in rlbus_env(data, "list")[1]
    code, said = rlbus_env(data, "remove", "tiny-env")
    assert code == 2 and "no environment 'tiny-env' is installed" in said


@pytest.mark.slow
def test_a_package_that_does_not_build_leaves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with pytest.raises(EnvInstallError) as caught:
        install_env(data, str(a_package(tmp_path / "src", "broken-env", fail=True)), say=print)
    message = str(caught.value)
    assert message.startswith("environment 'broken-env': pip could not install")
    assert "RuntimeError: broken-env's build failed on purpose" in message  # pip's last lines
    assert list((data / "envs").iterdir()) == []


@pytest.mark.slow
def test_a_hub_style_index_and_a_name_only_pip_knows(tmp_path: Path) -> None:
    """--index with --index-only: pip's --index-url, here a PEP 503 folder (file://); the
    package's pyproject does not name it, so pip is asked first (a dry run)."""
    source = a_package(tmp_path / "src", "hub-env", named=False)
    wheel = subprocess.run(
        [sys.executable, "-c", "import backend; print(backend.build_wheel('..'))"],
        cwd=source,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    project = tmp_path / "simple" / "hub-env"
    project.mkdir(parents=True)
    (tmp_path / wheel).rename(project / wheel)
    (project / "index.html").write_text(f'<a href="{wheel}">{wheel}</a>')
    index = (tmp_path / "simple").as_uri()
    data = tmp_path / "data"
    said: list[str] = []
    record = install_env(data, "hub-env", index=index, index_only=True, say=said.append)
    assert record.name == "hub-env" and record.index == index and record.modules == ["hub_env"]
    assert imports(record.path + "/bin/python", "hub_env").returncode == 0
    said.clear()
    record = install_env(data, str(source), force=True, say=said.append)
    assert said[0] == f"asking pip what {source} is" and record.spec == str(source)
    assert sorted(p.name for p in (data / "envs").iterdir()) == ["hub-env"]
