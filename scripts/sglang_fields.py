"""Write docs/sglang_fields.md: every request field of the installed SGLang (read from its
source, never imported) with what Arbor does with it. `--check` exits 1 if the committed
file differs or a field is missing from Arbor's schemas (tests/ecosystem runs it).

    .venv/bin/python scripts/sglang_fields.py [--check]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path

from arbor.runtime.sampling.params import DEFAULT_ONLY, FRONT_DOOR_KEYS, SamplingParams
from arbor.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "sglang_fields.md"
SOURCES = {  # schema -> (file under sglang/srt, class, its base classes to include)
    "/generate body (GenerateReqInput)": ("managers/io_struct.py", "GenerateReqInput", ()),
    "sampling_params (SamplingParams)": ("sampling/sampling_params.py", "SamplingParams", ()),
    "/v1/completions (CompletionRequest)": (
        "entrypoints/openai/protocol.py",
        "CompletionRequest",
        ("PDRoutingFields",),
    ),
    "/v1/chat/completions (ChatCompletionRequest)": (
        "entrypoints/openai/protocol.py",
        "ChatCompletionRequest",
        ("PDRoutingFields",),
    ),
}
STRUCTS = {
    "GenerateReqInput": GenerateRequest,
    "CompletionRequest": CompletionRequest,
    "ChatCompletionRequest": ChatCompletionRequest,
}
HONOURED, ADVISORY, DEFAULT, MISSING = "honoured", "accepted, no effect", "refused unless default", "MISSING"


def sglang_fields(path: Path, cls: str, bases: tuple[str, ...]) -> list[tuple[str, str]]:
    """(field, default source text) of `cls` and `bases` in `path`, public fields only."""
    tree = ast.parse(path.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out = []
    for name in (*bases, cls):
        for st in classes[name].body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not st.target.id.startswith("_"):
                default = ast.unparse(st.value) if st.value is not None else "required"
                if default.startswith(("field(", "Field(")):
                    default = next((ast.unparse(k.value) for k in st.value.keywords if k.arg == "default"), "...")
                out.append((st.target.id, default))
    return out


def status(cls: str, field: str) -> str:
    """What Arbor does with SGLang's `field` of `cls`."""
    if cls == "SamplingParams":
        if field in DEFAULT_ONLY:
            return DEFAULT
        known = {f for f in SamplingParams.__dataclass_fields__} | FRONT_DOOR_KEYS
        return HONOURED if field in known else MISSING
    struct = STRUCTS[cls]
    if field == "custom_logit_processor":
        return "always refused (carries code)"
    if field in struct.DEFAULT_ONLY:
        return DEFAULT
    if field in struct.ADVISORY:
        return ADVISORY
    return HONOURED if field in struct.__struct_fields__ else MISSING


def render() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise SystemExit("sglang is not installed; scripts/bootstrap.sh installs it (--no-deps)")
    srt = Path(spec.origin).parent / "srt"
    from importlib.metadata import version

    lines = [
        "# SGLang request fields in Arbor",
        "",
        f"Every request field of SGLang {version('sglang')}, read from its source by `scripts/sglang_fields.py`",
        "(which writes this file; the ecosystem tests check it is current).",
        "",
        f"- **{HONOURED}**: Arbor implements it.",
        f"- **{ADVISORY}**: accepted with any value; it steers something Arbor does not have (log labels,",
        "  a DP-rank hint, a reasoning parser without reasoning models).",
        f"- **{DEFAULT}**: not implemented; a request that sets it to anything but SGLang's default (or",
        "  null) gets HTTP 400 naming the field.",
        "- A field in neither SGLang's schema nor Arbor's is refused, so a typo is an error.",
    ]
    for title, (rel, cls, bases) in SOURCES.items():
        lines += ["", f"## {title}", "", "| field | SGLang default | Arbor |", "|---|---|---|"]
        for field, default in sglang_fields(srt / rel, cls, bases):
            lines.append(f"| `{field}` | `{default.replace('|', '/')}` | {status(cls, field)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args()
    text = render()
    missing = [line for line in text.splitlines() if line.endswith(f"| {MISSING} |")]
    if missing:
        print("fields Arbor's schemas lack:\n" + "\n".join(missing), file=sys.stderr)
        return 1
    if args.check:
        if DOC.read_text() != text:
            print(f"{DOC} is stale; run scripts/sglang_fields.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
