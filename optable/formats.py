"""The floating-point formats of the suite, declared once: float64, float32, bfloat16, float16.

Each ``Format`` is its precision ``p`` (significand bits, the implicit one included) and its
exponent range; everything else (eps, unit roundoff, largest and smallest numbers, where
rounding overflows to inf) is derived here from those three numbers. bfloat16 and float16 are
*storage* formats: engines keep them in memory and compute in a wider one. Their NumPy dtypes
come from ``ml_dtypes`` (imported when first asked for); docs/optable.md tells the story.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Format", "FORMATS", "STORAGE", "format_of", "dtype_of", "is_float", "is_storage",
           "names"]


@dataclass(frozen=True)
class Format:
    """One binary floating-point format with subnormals, signed zeros, inf and NaN.

    Attributes
    ----------
    name : str
        The NumPy dtype's name (``"bfloat16"``).
    precision : int
        ``p``: significand bits, the implicit leading one included (bfloat16 8, float16 11).
    emin, emax : int
        The exponents of the smallest and largest normal numbers (``2**emin``, ``2**emax``).
    storage : bool
        A format engines store values in but do not compute in (bfloat16, float16).
    """

    name: str
    precision: int
    emin: int
    emax: int
    storage: bool = False

    @property
    def bits(self):
        """Total width: sign, exponent and the stored significand bits."""
        return 1 + self.exponent_bits + self.precision - 1

    @property
    def exponent_bits(self):
        """Width of the biased exponent field."""
        return int(self.emax - self.emin + 3).bit_length() - 1

    @property
    def eps(self):
        """``2**(1 - p)``: the spacing of the format just above 1 (NumPy's ``finfo.eps``)."""
        return 2.0 ** (1 - self.precision)

    @property
    def unit_roundoff(self):
        """``u = 2**-p = eps / 2``: the largest relative error of rounding to nearest."""
        return 2.0 ** -self.precision

    @property
    def max(self):
        """The largest finite number, ``(2 - eps) 2**emax`` (float16: 65504)."""
        return (2.0 - self.eps) * 2.0 ** self.emax

    @property
    def tiny(self):
        """The smallest positive normal number, ``2**emin``."""
        return 2.0 ** self.emin

    @property
    def smallest_subnormal(self):
        """The smallest positive number, ``2**(emin + 1 - p)``."""
        return 2.0 ** (self.emin + 1 - self.precision)

    @property
    def overflow(self):
        """The magnitude from which rounding to nearest gives inf: ``max`` plus half its ulp
        (float16: 65520; a value exactly there is a tie and rounds to the even inf). inf for
        float64, whose threshold is not a float64 number."""
        return (2.0 - self.unit_roundoff) * 2.0 ** self.emax

    @property
    def dtype(self):
        """The NumPy dtype (bfloat16 through ``ml_dtypes``, imported on first use)."""
        return dtype_of(self.name)

    def ulp(self, x):
        """The spacing of the format at ``|x|``, elementwise (the subnormal spacing at 0)."""
        x = np.abs(np.asarray(x, dtype=np.float64))
        _, e = np.frexp(np.where(np.isfinite(x), x, 1.0))
        exponent = np.maximum(np.where(x == 0, self.emin, e - 1), self.emin)
        return np.where(np.isfinite(x), np.ldexp(1.0, exponent + 1 - self.precision), np.inf)


#: name -> Format, widest first.
FORMATS = {f.name: f for f in (
    Format("float64", 53, -1022, 1023),
    Format("float32", 24, -126, 127),
    Format("bfloat16", 8, -126, 127, storage=True),
    Format("float16", 11, -14, 15, storage=True),
)}
#: the storage formats' names, in table order
STORAGE = tuple(n for n, f in FORMATS.items() if f.storage)


def names():
    """Every format's name, widest first."""
    return tuple(FORMATS)


def dtype_of(name):
    """The NumPy dtype of format ``name`` (``ml_dtypes`` registers bfloat16 when imported)."""
    if name not in FORMATS:
        raise KeyError(f"unknown float format {name!r}; formats: {', '.join(FORMATS)}")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def format_of(dtype):
    """The :class:`Format` of ``dtype`` (a dtype, a type or a name).

    Raises
    ------
    TypeError
        A dtype that is not one of ``FORMATS`` (an integer dtype, complex, float8 ...).
    """
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    fmt = FORMATS.get(name)
    if fmt is None:
        raise TypeError(f"dtype {name} is not a float format of the suite; formats: "
                        f"{', '.join(FORMATS)}")
    return fmt


def is_float(dtype):
    """True when ``dtype`` is one of the formats (bfloat16's NumPy kind is ``'V'``, not ``'f'``)."""
    try:
        return np.dtype(dtype).name in FORMATS
    except TypeError:
        return False


def is_storage(dtype):
    """True for bfloat16 and float16: formats engines store in but compute wider."""
    return is_float(dtype) and FORMATS[np.dtype(dtype).name].storage
