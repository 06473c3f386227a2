"""Judges that score synthesized speech, one module per judge.

* :mod:`~chorus.evaluation.asr` - intelligibility: Whisper transcript, word and character error rates.
* :mod:`~chorus.evaluation.similarity` - speaker similarity: cosine of resemblyzer d-vectors.
* :mod:`~chorus.evaluation.mcd` - mel-cepstral distortion to a reference clip of the same sentence.
* :mod:`~chorus.evaluation.pitch` - F0 RMSE and voicing error to that reference, on the MCD alignment.
* :mod:`~chorus.evaluation.rate` - speaking rate and real-time factor.
* :mod:`~chorus.evaluation.report` - runs the judges over many clips (``chorus eval``).

The package itself imports nothing heavy; each module loads its model on first use, once.
"""
