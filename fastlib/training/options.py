"""The rarely used options of ``train`` and ``train_sh``, grouped in one checked object.

``train(..., options=TrainOptions(gradient_clip=1.0, checkpoint_every=5))`` says the same as
``train(..., gradient_clip=1.0, checkpoint_every=5)``: each field is also accepted as a keyword
of ``train`` and ``train_sh`` (how every earlier call spells it). The object checks every value
when it is built, so a bad one is refused before any data is read.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from fastlib.training.clipping import check_clip
from fastlib.training.early_stopping import DivergenceRules, PlateauPolicy
from fastlib.training.values import check_flag, check_int

__all__ = ["TrainOptions"]

RESUME_MISMATCH = ("warn", "error")


@dataclass(frozen=True)
class TrainOptions:
    """The options of ``train`` and ``train_sh`` that most runs leave at their defaults.

    Pass them as ``options=TrainOptions(...)`` or, each one, as a keyword of ``train`` /
    ``train_sh`` (not both for one call). Every value is checked when the object is built.

    Parameters
    ----------
    gradient_clip : float, default 0.0
        0 (off) or the clipping threshold c.
    clip_mode : {"value", "norm"}, default "value"
        ``"value"`` clamps every gradient element to [-c, c] (Loom's engine); ``"norm"`` scales
        all gradients by c / norm when their global L2 norm exceeds c
        (``torch.nn.utils.clip_grad_norm_``'s rule, which divides by norm + 1e-6). Either way a NaN/Inf gradient skips the step.
    shuffle : bool, default True
        Draw a new sample order every epoch from the run's Generator.
    checkpoint_every : int, default 1
        With ``checkpoint=``: write it every this many epochs (and after the last one).
    resume_mismatch : {"warn", "error"}, default "warn"
        With ``resume=``: a setting that decides the trajectory and differs from the
        checkpoint's continues with a ``RuntimeWarning`` listing it, or is a ``ValueError``.
    divergence : None, False, dict or DivergenceRules, default None
        When a finite but exploding run stops: None applies the default rules of
        :class:`~fastlib.training.early_stopping.DivergenceRules`, a dict overrides some
        (``{"max_weight": 1e9}``; a rule set to None is off), False turns them all off (a
        non-finite loss still stops training).
    distributed : bool or fastlib.training.distributed.DataParallel, default False
        Data-parallel over MPI when launched with ``mpiexec -n K`` (needs ``verigrad[mpi]``).
    lr_factor : float, default 0.5
        ``train_sh`` only: the factor the rate is multiplied by on a plateau, in (0, 1].
    stop_patience : int or None, default None
        ``train_sh`` only: epochs without improvement before stopping (None: ``2 * patience``).
    min_lr : float, default 1e-6
        ``train_sh`` only: training stops when a reduction takes the rate below this.
    dtype : {None, "float32", "float64", "bfloat16", "float16"}, default None
        The precision the run trains in. None (or the model's own dtype): the model's.
        ``"bfloat16"`` / ``"float16"``: mixed precision over a float32 model, whose parameters
        are the master weights (:mod:`fastlib.training.mixed_precision`).
    loss_scale : None, False, "dynamic", float, dict or LossScale, default None
        With a 16-bit ``dtype``: how the loss is scaled (:mod:`fastlib.training.loss_scale`).
        None is the format's default: dynamic for float16 (``torch.amp.GradScaler``'s
        dynamics and defaults), none for bfloat16.

    Raises
    ------
    TypeError, ValueError
        A value of the wrong type or out of range, naming the field and what it takes.
    """

    gradient_clip: float = 0.0
    clip_mode: str = "value"
    shuffle: bool = True
    checkpoint_every: int = 1
    resume_mismatch: str = "warn"
    divergence: object = None
    distributed: object = False
    lr_factor: float = 0.5
    stop_patience: int | None = None
    min_lr: float = 1e-6
    dtype: str | None = None
    loss_scale: object = None

    #: the fields only ``train_sh``'s plateau policy reads (``PlateauPolicy`` checks them)
    PLATEAU_FIELDS = ("lr_factor", "stop_patience", "min_lr")

    def __post_init__(self):
        clip, mode = check_clip(self.gradient_clip, self.clip_mode)
        object.__setattr__(self, "gradient_clip", clip)
        object.__setattr__(self, "clip_mode", mode)
        object.__setattr__(self, "shuffle", check_flag(self.shuffle, "shuffle"))
        object.__setattr__(self, "checkpoint_every",
                           check_int(self.checkpoint_every, "checkpoint_every", 1))
        if self.resume_mismatch not in RESUME_MISMATCH:
            raise ValueError(f"resume_mismatch must be 'warn' or 'error', got "
                             f"{self.resume_mismatch!r}")
        self.divergence_rules        # noqa: B018 - refuses a bad value now, not at epoch 1
        self.data_parallel           # noqa: B018
        self._check_precision()
        # the plateau fields are checked by the policy that reads them (one set of rules)
        PlateauPolicy(lr=1.0, lr_factor=self.lr_factor, stop_patience=self.stop_patience,
                      min_lr=self.min_lr)

    def _check_precision(self):
        from fastlib.training import loss_scale, mixed_precision

        name = mixed_precision.check_dtype_name(self.dtype)
        object.__setattr__(self, "dtype", name)
        if name in mixed_precision.FORMATS:
            loss_scale.resolve_loss_scale(self.loss_scale, name)
        elif self.loss_scale not in (None, False):
            raise ValueError("loss_scale applies to 16-bit training only: pass dtype='float16' "
                             "(or 'bfloat16') with it, or leave loss_scale out")

    @classmethod
    def field_names(cls) -> tuple:
        """The fields, in order (each is also a keyword of ``train`` and ``train_sh``)."""
        return tuple(f.name for f in fields(cls))

    @property
    def divergence_rules(self) -> DivergenceRules | None:
        """``divergence`` as the rules that apply (None: every rule off)."""
        return DivergenceRules.from_option(self.divergence)

    @property
    def data_parallel(self):
        """``distributed`` as a ``DataParallel`` (None: one process)."""
        from fastlib.training.distributed import resolve

        return resolve(self.distributed)

    def changed_plateau_fields(self) -> list:
        """The ``train_sh``-only fields set away from their defaults (``train`` refuses them)."""
        default = TrainOptions()
        return [n for n in self.PLATEAU_FIELDS if getattr(self, n) != getattr(default, n)]
