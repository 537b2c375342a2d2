#!/usr/bin/env python3
"""Bytes of a gpuledger DuckDB file per table, from DuckDB's own block layout.

Needs the `duckdb` Python package of the version that wrote the file (the file header names
it; compare.sh installs it into a venv). Opens the file read-only.

Each table's column segments are read from pragma_storage_info: a segment owns the bytes from
its offset to the next segment's offset in the same block (or to the block's end), plus any
whole extra blocks it spans. What no segment owns (metadata, indexes, free blocks, the file
header) is reported as "other". Prints JSON on stdout.
"""

import json
import os
import sys

import duckdb


def main():
    path = sys.argv[1]
    con = duckdb.connect(path, read_only=True)
    info = con.execute("SELECT block_size, total_blocks, free_blocks FROM pragma_database_size()").fetchone()
    block_size, total_blocks, free_blocks = info
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE NOT temporary ORDER BY table_name").fetchall()]
    rows = {}
    segs = []  # (block_id, offset, table, extra_blocks)
    for t in tables:
        rows[t] = con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
        for block_id, offset, extra in con.execute(
                "SELECT block_id, block_offset, additional_block_ids FROM pragma_storage_info(?) "
                "WHERE persistent AND block_id >= 0", [t]).fetchall():
            segs.append((block_id, offset, t, len(extra or [])))
    owned = {t: 0 for t in tables}
    by_block = {}
    for block_id, offset, t, extra in segs:
        by_block.setdefault(block_id, []).append((offset, t))
        owned[t] += extra * block_size
    for entries in by_block.values():
        entries.sort()
        for i, (offset, t) in enumerate(entries):
            end = entries[i + 1][0] if i + 1 < len(entries) else block_size
            owned[t] += end - offset
    file_bytes = os.path.getsize(path)
    out = {
        "file_bytes": file_bytes,
        "block_size": block_size,
        "total_blocks": total_blocks,
        "free_blocks": free_blocks,
        "tables": {t: {"rows": rows[t], "bytes": owned[t]} for t in tables if rows[t] or owned[t]},
    }
    out["other_bytes"] = file_bytes - sum(owned.values())
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
