"""The op declarations, one module per family; ``ALL`` lists them in registry order."""
from spec.ops import binary, elementwise, loss, norm, reduce, structure

ALL = elementwise.OPS + binary.OPS + reduce.OPS + structure.OPS + norm.OPS + loss.OPS
