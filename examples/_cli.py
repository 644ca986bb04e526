"""The examples' shared command line: --url and --api-key of a running `arbor serve`."""

from __future__ import annotations

import argparse

import arbor as sgl


def connect(doc: str) -> None:
    """Parse the command line and make that server the default backend."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="the server's base URL")
    parser.add_argument("--api-key", help="the server's --api-key, if it has one")
    args = parser.parse_args()
    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url, api_key=args.api_key))
