"""Call a compiled kernel through its machine-code address instead of linking it in.

Numba links a callee's whole optimised module into each caller and optimises and emits it
again there. A large kernel called from a parallel loop is so rebuilt four times over (the
loop body, two wrappers, the caller), a third of a training epoch's cold compile. A caller
that takes the callee's address (:func:`fastlib.compile_once.native_entry`, compiled on its
own and cached there) and calls it with :func:`call_compiled` holds a call instruction only.
The entry carries a key of the argument types it was compiled for: a call with other types
raises instead of running the machine code on arguments it does not expect.
"""
from __future__ import annotations

import zlib

from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["call_compiled", "types_key"]


def types_key(arg_types):
    """The int64 key of a tuple of Numba types (stable across processes: from their names)."""
    return zlib.crc32(repr(tuple(str(t) for t in arg_types)).encode())


@intrinsic
def call_compiled(typingctx, entry, args):
    """``f(*args)`` for the kernel ``f`` of ``entry`` = ``(address, key)`` (from
    ``compile_once.native_entry``), which returns nothing; its exceptions propagate. A
    ``ValueError`` when ``key`` is not the key of ``args``' types."""
    if not (isinstance(entry, types.UniTuple) and entry.count == 2 and
            isinstance(entry.dtype, types.Integer) and isinstance(args, types.BaseTuple)):
        return None
    arg_types = tuple(args.types)
    key = types_key(arg_types)

    def codegen(context, builder, signature, llargs):
        packed_entry, packed = llargs
        address, passed = cgutils.unpack_tuple(builder, packed_entry, 2)
        wrong = builder.icmp_signed("!=", passed, context.get_constant(entry.dtype, key))
        with cgutils.if_unlikely(builder, wrong):
            context.call_conv.return_user_exc(
                builder, ValueError, ("call_compiled: the entry was compiled for other "
                                      "argument types",))
        values = cgutils.unpack_tuple(builder, packed, len(arg_types))
        fnty = context.call_conv.get_function_type(types.none, arg_types)
        function = builder.inttoptr(address, fnty.as_pointer())
        status, _ = context.call_conv.call_function(builder, function, types.none, arg_types,
                                                    values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return types.none(entry, args), codegen
