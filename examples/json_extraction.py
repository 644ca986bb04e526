"""Structured extraction with json_schema: every output parses and validates.

python examples/json_extraction.py --url http://127.0.0.1:30000
"""

from __future__ import annotations

import json

from _cli import connect

import arbor as sgl

INVOICE = {
    "type": "object",
    "properties": {
        "vendor": {"type": "string", "maxLength": 24},
        "total": {"type": "number", "minimum": 0},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "items": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                },
                "required": ["name", "qty"],
            },
        },
    },
    "required": ["vendor", "total", "currency", "items"],
}


@sgl.function
def extract(s, document):
    s += sgl.system("Extract the invoice as JSON.")
    s += sgl.user(document)
    s += sgl.assistant(sgl.gen("invoice", json_schema=INVOICE, max_tokens=160))


def main() -> None:
    connect(__doc__)
    docs = [{"document": f"Invoice {i}: ACME Corp, 3 bolts and 2 nuts, total 12.50 EUR."} for i in range(4)]
    for state in extract.run_batch(docs, temperature=0.7):
        print(json.loads(state["invoice"]))


if __name__ == "__main__":
    main()
