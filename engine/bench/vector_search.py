"""sqlite-vec against numpy brute force for the document index's vectors: insert cost and query latency.

20,000 unit vectors of 384 dims (all-MiniLM-L6-v2's width), 1,000 documents of 20 chunks; 50 queries, the
top 10 each, over all documents and over 5 of them.  Python's ``sqlite3`` often cannot load extensions
(``enable_load_extension`` is missing from this build), so sqlite-vec is loaded through apsw; run in a
scratch environment: ``pip install --target /tmp/vecbench sqlite-vec apsw``, then
``python -m engine.bench.vector_search /tmp/vecbench`` from the repository root.  A one-off whose result and
choice (numpy) are in the module docstring of ``engine.documents.store``.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from engine.bench.common import median, percentile

N, DIM, QUERIES, TOP = 20_000, 384, 50, 10
FIVE = [1, 50, 300, 700, 999]


def timed(fn: Callable[[np.ndarray], object], queries: np.ndarray) -> str:
    times = []
    for q in queries:
        began = time.perf_counter()
        fn(q)
        times.append(time.perf_counter() - began)
    return f"median {median(times) * 1e3:.2f} ms, p95 {percentile(times, 95) * 1e3:.2f} ms"


def main(extra: str | None) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((N, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.standard_normal((QUERIES, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    docs = np.arange(N) // 20
    rows = [(i, int(docs[i]), vectors[i].tobytes()) for i in range(N)]
    folder = tempfile.mkdtemp(prefix="vector-search-")

    conn = sqlite3.connect(os.path.join(folder, "blobs.db"))
    conn.execute("CREATE TABLE c (id INTEGER PRIMARY KEY, doc INTEGER, v BLOB)")
    conn.execute("CREATE INDEX c_doc ON c (doc)")
    began = time.perf_counter()
    with conn:
        conn.executemany("INSERT INTO c VALUES (?, ?, ?)", rows)
    print(f"numpy, vectors as BLOBs: insert {N}: {time.perf_counter() - began:.2f} s")

    def from_blobs(q: np.ndarray, ids: list[int]) -> list[int]:
        marks = ",".join("?" * len(ids))
        found = conn.execute(f"SELECT id, v FROM c WHERE doc IN ({marks})", ids).fetchall()
        matrix = np.frombuffer(b"".join(r[1] for r in found), dtype=np.float32).reshape(len(found), DIM)
        scores = matrix @ q
        best = np.argpartition(-scores, TOP)[:TOP]
        return [found[i][0] for i in best[np.argsort(-scores[best])]]

    def in_memory(q: np.ndarray) -> list[int]:
        scores = vectors @ q
        best = np.argpartition(-scores, TOP)[:TOP]
        return [int(i) for i in best[np.argsort(-scores[best])]]

    print("numpy, BLOBs read each query, all documents:", timed(lambda q: from_blobs(q, list(range(1000))), queries))
    print("numpy, BLOBs read each query, 5 documents:  ", timed(lambda q: from_blobs(q, FIVE), queries))
    print("numpy, matrix kept in memory, all documents:", timed(in_memory, queries))

    if extra:
        sys.path.insert(0, extra)
    try:
        import apsw
        import sqlite_vec
    except ImportError:
        print("sqlite-vec: not installed (pip install --target DIR sqlite-vec apsw; pass DIR)")
        return
    db = apsw.Connection(os.path.join(folder, "vec.db"))
    db.enable_load_extension(True)
    db.load_extension(sqlite_vec.loadable_path())
    db.execute(f"CREATE VIRTUAL TABLE v USING vec0(doc integer, embedding float[{DIM}] distance_metric=cosine)")
    began = time.perf_counter()
    with db:
        db.executemany("INSERT INTO v (rowid, doc, embedding) VALUES (?, ?, ?)", rows)
    print(f"sqlite-vec vec0 (doc as a metadata column): insert {N}: {time.perf_counter() - began:.2f} s")
    knn = "SELECT rowid FROM v WHERE embedding MATCH ? AND k = ?"
    five = f" AND doc IN ({','.join(map(str, FIVE))})"
    print("sqlite-vec, all documents:", timed(lambda q: list(db.execute(knn, (q.tobytes(), TOP))), queries))
    print("sqlite-vec, 5 documents:  ", timed(lambda q: list(db.execute(knn + five, (q.tobytes(), TOP))), queries))
    same = [r[0] for r in db.execute(knn, (queries[0].tobytes(), TOP))] == in_memory(queries[0])
    print(f"same top {TOP} as numpy: {same}; file sizes MB: BLOBs "
          f"{os.path.getsize(os.path.join(folder, 'blobs.db')) / 1e6:.1f}, "
          f"vec0 {os.path.getsize(os.path.join(folder, 'vec.db')) / 1e6:.1f}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
