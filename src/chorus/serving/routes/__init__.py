"""The server's routes, one ``APIRouter`` per resource: :mod:`~.speech`, :mod:`~.voices`, :mod:`~.jobs`,
:mod:`~.models`, :mod:`~.health`, and OpenAI's custom voices :mod:`~.custom_voices`; each takes the server and the request's tenant through :mod:`~.deps`."""

from chorus.serving.routes import custom_voices, health, jobs, models, speech, voices

ROUTERS = [health.router, speech.router, models.router, voices.router, custom_voices.router, jobs.router]
