"""CI: the client SDK installs and streams without torch or any server package.

Creates a fresh virtualenv with the base install only (``pip install .``, no
extras), starts the gateway from the full environment running this script,
and runs ``scripts/base_install_client.py`` in the fresh one, outside the
checkout, so every import resolves to the installed package.

    python scripts/check_base_install.py [--engine cpu-voice]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import venv
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"listening on ([\d.]+):(\d+)")


def base_venv(where: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(where / "venv")
    python = where / "venv" / "bin" / "python"
    # From a copy: building in place would leave build/ in the checkout.
    skip = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "node_*")
    source = shutil.copytree(ROOT, where / "src", ignore=skip)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(source)], check=True)
    return python


def start_server(engine: str) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--engine", engine, "--port", "0"]
    cmd += ["--log-level", "warning"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    url = None
    for line in proc.stdout:
        print(f"  [server] {line.rstrip()}")
        if url is None and (m := LISTENING.search(line)):
            url = f"ws://{m.group(1)}:{m.group(2)}"
        if "ready in" in line:
            break
    if url is None or proc.poll() is not None:
        raise SystemExit("the gateway did not start")
    # Keep reading, or a full pipe would block the server's logging.
    threading.Thread(target=_echo, args=(proc.stdout,), daemon=True).start()
    return proc, url


def _echo(lines: IO[str]) -> None:
    for line in lines:
        print(f"  [server] {line.rstrip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", default="cpu-voice")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="base-install-") as tmp:
        print("[base install] pip install . into a fresh venv")
        python = base_venv(Path(tmp))
        proc, url = start_server(args.engine)
        try:
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            client = [str(python), str(ROOT / "scripts" / "base_install_client.py"), url]
            done = subprocess.run(client, cwd=tmp, env=env, timeout=300, check=False)
        finally:
            proc.terminate()
            proc.wait(30)
    print("[base install] ok" if done.returncode == 0 else "[base install] FAILED")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
