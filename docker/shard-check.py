#!/usr/bin/env python3
"""shard-check.py FULL.db MERGED.db: whether a merged sharded analysis equals the unsharded run.

Every table but meta is compared row by row (each row as all its columns, the rows sorted), as
tests/cli/shard.rs does; meta too, except the rows that legitimately differ (command, shards,
merged_from, peak_connections). Prints one line per table; exit 0 when equal, 1 when not, 2
when a database cannot be read.
"""
import sqlite3
import sys

META_DIFFERS = {"command", "shards", "merged_from", "peak_connections"}


def tables(c):
    names = [r[0] for r in c.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'meta' ORDER BY name")]
    out = {}
    for t in names:
        n = len(c.execute(f'SELECT * FROM "{t}" LIMIT 0').description)
        order = ", ".join(str(i) for i in range(1, n + 1))
        out[t] = [tuple(r) for r in c.execute(f'SELECT * FROM "{t}" ORDER BY {order}')]
    out["meta"] = sorted((k, v) for k, v in c.execute("SELECT key, value FROM meta") if k not in META_DIFFERS)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    dbs = []
    for p in sys.argv[1:]:
        try:
            dbs.append(tables(sqlite3.connect(f"file:{p}?mode=ro", uri=True)))
        except sqlite3.Error as e:
            print(f"shard-check: {p}: {e}", file=sys.stderr)
            sys.exit(2)
    full, merged = dbs
    ok = True
    for t in sorted(set(full) | set(merged)):
        a, b = full.get(t), merged.get(t)
        if a is None or b is None:
            print(f"{t:<14} only in {'the merged' if a is None else 'the unsharded'} database  DIFFER")
            ok = False
            continue
        same = a == b
        ok &= same
        extra = ""
        if not same:
            sa, sb = set(a), set(b)
            extra = f" ({len(sa - sb)} rows only unsharded, {len(sb - sa)} only merged; e.g. {sorted(sa ^ sb)[:1]})"
        print(f"{t:<14} {len(a):>8} rows unsharded {len(b):>8} merged  {'equal' if same else 'DIFFER' + extra}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
