"""The one list of pruning techniques: importing it registers each (see :mod:`chorus.pruning.registry`)."""

from chorus.pruning import dynamic, parp, snip, structured, ump  # noqa: F401
