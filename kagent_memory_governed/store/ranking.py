"""Ranking in the process: the exact cosine ranking of a scope's opened entries against a search's queries.

Search ranks here, after opening the scope's live entries (at most ``entry_cap``, 100), since the database holds
no embedding to rank by. Pure: values in, values out; no I/O, no key store, no cipher. The answer is the one the
definition gives (every distance in double precision, nearest first, ties by entry id), at a fraction of its cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy

# the single-precision pass's error on a cosine distance is below 2e-4 for any two admitted embeddings (768 terms,
# squared norms finite and normal in single precision: ``policy.admit_embedding``; the norms' product is formed in
# double precision); candidates are kept within five times that of the ``top_k``-th nearest
_MARGIN = 1e-3


def rank(
    matrix: numpy.ndarray, queries: Sequence[numpy.ndarray], *, top_k: int, max_distance: float
) -> list[list[tuple[int, float]]]:
    """For each query, the ``top_k`` rows of ``matrix`` (single-precision embeddings in entry-id order, as
    ``entry_format.Batch`` holds them; by index) nearest by cosine distance (``1 - cos``, as pgvector's ``<=>``)
    within ``max_distance``, nearest first, ties by entry id (the sort is stable). Exact in double precision: a
    single-precision pass over every row keeps each within ``_MARGIN`` of the ``top_k``-th nearest, and only those
    are ranked in double precision, which gives the same entries, order and distances as ranking them all in
    double precision at a fraction of its cost."""
    if not len(matrix):
        return [[] for _ in queries]
    asked = numpy.stack(queries).astype(numpy.float32)
    # einsum, not BLAS: for at most 8 x 100 products a threaded BLAS costs more in waking threads than it saves
    squares = numpy.einsum("nd,nd->n", matrix, matrix)
    norms = numpy.sqrt(numpy.einsum("qd,qd->q", asked, asked)[:, None].astype(numpy.float64) * squares)
    rough = 1.0 - numpy.einsum("qd,nd->qn", asked, matrix) / norms
    found = []
    for query, row in zip(queries, rough, strict=True):
        if len(row) <= top_k:
            candidates = numpy.arange(len(row))
        else:
            candidates = numpy.flatnonzero(row <= numpy.partition(row, top_k - 1)[top_k - 1] + _MARGIN)
        exact = _distances(query, matrix[candidates])
        order = numpy.argsort(exact, kind="stable")[:top_k]
        found.append([(int(candidates[i]), float(exact[i])) for i in order if exact[i] <= max_distance])
    return found


def _distances(query: numpy.ndarray, rows: numpy.ndarray) -> numpy.ndarray:
    """Cosine distances of ``rows`` to ``query`` in double precision."""
    asked = query.astype(numpy.float64)
    wide = rows.astype(numpy.float64)
    dots = numpy.einsum("d,nd->n", asked, wide)
    distances: numpy.ndarray = 1.0 - dots / (
        numpy.sqrt(asked @ asked) * numpy.sqrt(numpy.einsum("nd,nd->n", wide, wide))
    )
    return distances
