"""`eaglechat rm NAME`: remove a pulled model; files another alias uses stay."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("rm", help="remove a pulled model (files another alias uses stay)")
    p.add_argument("name")
    p.set_defaults(func=run)


def run(args) -> int:
    from eaglechat.models import hub
    from eaglechat.units import fmt_bytes

    result = hub.remove(args.name)
    print(f"deleted '{result.name}' ({fmt_bytes(result.freed_bytes)} freed)")
    for ref, users in result.kept:
        print(f"kept {ref} (used by {', '.join(users)})")
    return 0
