"""Request and response bodies of the HTTP API as pydantic models, one module per resource: the OpenAPI
page (``/docs``) shows them, and the routes build their JSON answers from them.

:mod:`~.speech` (``/v1/audio/speech``), :mod:`~.models` (``/v1/models``), :mod:`~.voices` (``/v1/voices``,
``/v1/audio/voices``), :mod:`~.custom_voices` (OpenAI's consents and voices from a sample), :mod:`~.jobs`
(onboarding jobs), :mod:`~.health` (``/healthz``) and :mod:`~.errors` (every refusal). They import nothing
of the server: the routes and the server import them.
"""
