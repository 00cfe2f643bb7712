"""Ed25519 public keys the verifier may trust: canonical points of prime order (RFC 8032, section 5.1.3).

``cryptography`` loads any 32 bytes as an Ed25519 public key. A small-order key (the identity among
them) makes a forged signature verify for every message, so the bridge key is checked once, at start-up,
with plain integer arithmetic on the curve. Nothing here runs per request.
"""

from __future__ import annotations

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493  # the prime order of the base point
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_IDENTITY = (0, 1, 1, 0)

_Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z


def _decode(encoding: bytes) -> _Point | None:
    """The point ``encoding`` names, or ``None`` if it is not on the curve or not its canonical spelling."""
    if len(encoding) != 32:
        return None
    value = int.from_bytes(encoding, "little")
    sign, y = value >> 255, value & ((1 << 255) - 1)
    if y >= _P:  # another spelling of y - p
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    if x2 == 0:
        return None if sign else (0, y, 1, 0)  # x = 0 has one spelling: sign bit clear
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None  # no square root: not on the curve
    if x & 1 != sign:
        x = _P - x
    return (x, y, 1, x * y % _P)


def _add(a: _Point, b: _Point) -> _Point:
    e = (a[1] + a[0]) * (b[1] + b[0]) - (a[1] - a[0]) * (b[1] - b[0])
    h = (a[1] + a[0]) * (b[1] + b[0]) + (a[1] - a[0]) * (b[1] - b[0])
    f = 2 * a[2] * b[2] - 2 * a[3] * b[3] * _D
    g = 2 * a[2] * b[2] + 2 * a[3] * b[3] * _D
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _times(scalar: int, point: _Point) -> _Point:
    result = _IDENTITY
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _is_identity(point: _Point) -> bool:
    return point[0] % _P == 0 and (point[1] - point[2]) % _P == 0


def is_prime_order_point(encoding: bytes) -> bool:
    """Whether ``encoding`` is the canonical encoding of a curve point of order L, as every key derived
    from a private key is. Refuses the eight small-order points, points with a small-order component,
    encodings off the curve and non-canonical encodings (``y >= p``, or ``x = 0`` with the sign bit set)."""
    point = _decode(encoding)
    return point is not None and not _is_identity(point) and _is_identity(_times(_L, point))
