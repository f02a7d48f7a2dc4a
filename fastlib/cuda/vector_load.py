"""128-bit loads from global memory: ``load_vector(a, i)`` reads ``a[i]`` to ``a[i + W - 1]``
(``W`` = :data:`WIDTH` of the dtype: 4 float32 or 2 float64) as one ``ld.global.v4.f32`` /
``ld.global.v2.f64`` and returns them as a tuple. The caller guarantees ``a[i]`` is 16-byte
aligned (:func:`aligned`); the simulator reads the elements one by one.
"""
from __future__ import annotations

from numba import cuda

from . import config

#: Elements of one 128-bit load, per dtype name.
WIDTH = {"float32": 4, "float64": 2}
BYTES = 16


def aligned(array, element, *strides) -> bool:
    """Whether element ``element + sum(k_i * strides_i)`` of device array ``array`` starts a
    16-byte boundary for every integer ``k_i`` (the array's address and each offset)."""
    width = BYTES // array.dtype.itemsize
    if config.SIMULATOR:
        address = array.__array_interface__["data"][0]
    else:
        address = array.__cuda_array_interface__["data"][0]
    return address % BYTES == 0 and all(int(v) % width == 0 for v in (element, *strides))


if config.SIMULATOR:
    @cuda.jit(device=True)
    def load_vector(a, i):
        return tuple(a[i + k] for k in range(BYTES // a.dtype.itemsize))
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def load_vector(typingctx, array, index):
        """One ``ld.global.v{W}`` of ``array[index:index + W]`` as a UniTuple."""
        dtype = array.dtype
        width = 8 * BYTES // dtype.bitwidth
        result = types.UniTuple(dtype, width)

        def codegen(context, builder, sig, args):
            array_type, index_type = sig.args
            ary = context.make_array(array_type)(context, builder, args[0])
            i = context.cast(builder, args[1], index_type, types.intp)
            pointer = builder.gep(ary.data, [i])
            element = context.get_value_type(dtype)
            fnty = ir.FunctionType(ir.LiteralStructType([element] * width), [pointer.type])
            register = "f" if dtype.bitwidth == 32 else "d"
            outs = ", ".join(f"${k}" for k in range(width))
            # NOTE: NVPTX has one assembler dialect, so LLVM keeps these braces as written
            asm = ir.InlineAsm(fnty, f"ld.global.v{width}.f{dtype.bitwidth} {{{outs}}}, "
                                     f"[${width}];",
                               ",".join([f"={register}"] * width + ["l"]))
            loaded = builder.call(asm, [pointer])
            return context.make_tuple(builder, result, [builder.extract_value(loaded, k)
                                                        for k in range(width)])

        return result(array, index), codegen
