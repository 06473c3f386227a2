"""The server's routes, one ``APIRouter`` per resource: :mod:`~.speech`, :mod:`~.voices`, :mod:`~.jobs`,
:mod:`~.models`, :mod:`~.health`; each takes the server and the request's tenant through :mod:`~.deps`."""

from chorus.serving.routes import health, jobs, models, speech, voices

ROUTERS = [health.router, speech.router, models.router, voices.router, jobs.router]
