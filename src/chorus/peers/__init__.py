"""Other TTS systems Chorus runs beside its own models (held-out speakers, benchmark peers).

Modules import their runtimes lazily, so importing this package needs none of them.
"""
