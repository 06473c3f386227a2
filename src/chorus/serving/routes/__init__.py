"""The server's routes, one ``APIRouter`` per resource: :mod:`~.speech`, :mod:`~.voices`, :mod:`~.jobs`,
:mod:`~.models`, :mod:`~.health`, OpenAI's custom voices :mod:`~.custom_voices`, and Piper's HTTP API
:mod:`~.piper_http` (``POST /``); each takes the server and the request's tenant through :mod:`~.deps`.

Each resource's presenters (a record of the store as its JSON answer, built from the models of
:mod:`chorus.serving.schemas`) sit beside its routes: ``voice_json``, ``speaker_json`` and ``voice_card`` in
:mod:`~.voices`, ``audio_voice_json`` and ``consent_json`` in :mod:`~.custom_voices`, ``job_json`` in
:mod:`~.jobs` (the upload of :mod:`~.voices` answers with a job too)."""

from chorus.serving.routes import custom_voices, health, jobs, models, piper_http, speech, voices

ROUTERS = [
    health.router,
    speech.router,
    piper_http.router,
    models.router,
    voices.router,
    custom_voices.router,
    jobs.router,
]
