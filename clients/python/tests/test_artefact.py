"""The artefacts: an sdist and a wheel built from this tree (Debian's build
tools, no network), the wheel installed into a clean virtual environment,
and a tiny app run from it, outside the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

APP = """
import json, uuid, psycopg, pg_idem, pg_idem.asgi, pg_idem.django
key = str(uuid.uuid4())
outcomes = []
with psycopg.connect("", autocommit=True) as conn:
    for _ in range(2):
        with pg_idem.claim(conn, "artefact", "job", key) as c:
            outcomes.append(c.outcome)
            if c.outcome == "claimed":
                c.respond(200, b"built")
    enqueued = pg_idem.enqueue(conn, "artefact", "job", key, {"built": True}).outcome

@pg_idem.idempotent_tool("", tenant="artefact")
def tool(n: int) -> int:
    return n + 1

assert tool(1, idempotency_key=key) == {"result": 2, "idempotency": {"key": key, "replayed": False}}
assert tool(1, idempotency_key=key)["idempotency"]["replayed"]
print(json.dumps({"outcomes": outcomes, "body": c.body.decode(), "enqueued": enqueued,
                  "file": pg_idem.__file__,
                  "typed": __import__("os").path.exists(__import__("os").path.join(
                      __import__("os").path.dirname(pg_idem.__file__), "py.typed"))}))
"""


def test_build_install_and_run(db: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp, "dist")
        # build from a copy: the build writes egg-info and build/ beside the sources
        src = Path(tmp, "src")
        subprocess.run(["cp", "-r", str(ROOT), str(src)], check=True)
        subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel",
                        "--outdir", str(dist), str(src)], check=True, capture_output=True)
        wheel = next(dist.glob("pg_idem-0.4.0-*.whl"))
        sdist = next(dist.glob("pg-idem-0.4.0.tar.gz"), None) or next(dist.glob("pg_idem-0.4.0.tar.gz"))
        names = zipfile.ZipFile(wheel).namelist()
        for f in ["pg_idem/__init__.py", "pg_idem/_claim.py", "pg_idem/_http.py", "pg_idem/_outbox.py",
                  "pg_idem/_retry.py", "pg_idem/_request.py", "pg_idem/_tool.py", "pg_idem/_trace.py",
                  "pg_idem/asgi.py", "pg_idem/django.py", "pg_idem/py.typed"]:
            assert f in names, names
        assert not any(n.startswith("tests/") for n in names)
        assert any(n.endswith("src/pg_idem/py.typed") for n in tarfile.open(sdist).getnames())
        venv = Path(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
        py = venv / "bin" / "python"
        subprocess.run([str(py), "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", str(wheel)],
                       check=True, capture_output=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = subprocess.run([str(py), "-c", APP], cwd=tmp, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        import json

        r = json.loads(out.stdout)
        assert r["outcomes"] == ["claimed", "replay"] and r["body"] == "built" and r["enqueued"] == "enqueued"
        assert r["file"].startswith(str(venv)), r["file"]
        assert r["typed"]


def test_the_integrations_are_attributes_of_the_package() -> None:
    code = """
import sys, pg_idem
assert pg_idem.asgi.IdempotencyMiddleware
assert "django" not in sys.modules, "the ASGI integration imported Django"
assert pg_idem.django.IdempotencyMiddleware
try:
    pg_idem.nothing
except AttributeError:
    pass
else:
    raise AssertionError("pg_idem.nothing")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
