"""The adapter methods, one line each (PEFT keeps its list of tuners in ``tuners/__init__.py``).

Importing a method's module registers it (its last line calls :func:`chorus.adapters.registry.register`);
this is the one place that imports them all, and the :mod:`chorus.adapters` package imports it, so
``get_method`` knows every method by name while the registry imports none. A new method is one
module plus one line here.
"""

import chorus.adapters.bitfit  # noqa: F401
import chorus.adapters.conditional_norm  # noqa: F401
import chorus.adapters.lora  # noqa: F401
import chorus.adapters.prefix  # noqa: F401
import chorus.adapters.residual  # noqa: F401
import chorus.adapters.speaker  # noqa: F401
