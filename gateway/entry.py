"""The ``speech-gateway`` command.

The base install is the client SDK; the server's packages come with the
``[server]`` extra. Without them the command says so instead of a traceback.
"""

from __future__ import annotations

import sys

SERVER_EXTRA_HINT = "pip install 'realtime-speech-gateway[server]'"


def main() -> int:
    try:
        from gateway.cli import main as cli_main
    except ModuleNotFoundError as e:
        print(
            f"speech-gateway: the server needs the [server] extra ({e.name} is not installed): "
            f"{SERVER_EXTRA_HINT}",
            file=sys.stderr,
        )
        return 2
    return cli_main()
