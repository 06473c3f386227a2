"""``chorus serve``: the multi-tenant voice server, on one process or on Ray Serve.

The command reads its options as one :class:`ServeOptions`, finds what runs the server (failing with what to
install where an extra is missing), builds the server's config from the options and runs it."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from chorus.cli.common import BASE_HELP, DEVICE_OPTION, chosen_base, console, fail, user_errors
from chorus.cli.option_fields import given_option, option, takes_options

if TYPE_CHECKING:
    from chorus.serving.settings import ServeConfig

SERVER_DEFAULT = "default: the server's, from ServerSettings"


@dataclass(frozen=True)
class ServeOptions:
    """The command line of ``chorus serve``, one field an option (in the order --help lists them)."""

    store: str = option(
        ...,
        help="Voice store: a folder for voices, jobs and metadata, or an fsspec URL for the voices "
        "(s3://bucket/prefix; AWS_ENDPOINT_URL and the AWS credential variables reach any S3-compatible store).",
    )
    database: str | None = option(
        None,
        help="Voice and job metadata: a postgresql://user@host/db URL (servers on several machines share it; "
        "needs the serve extra's psycopg), or a SQLite file path or sqlite:///path (default: "
        "STORE/store.sqlite3; needed for a remote STORE).",
    )
    cache_dir: str | None = option(
        None,
        help="Where voices of a remote store are downloaded (default: beside a SQLite file, else ~/.cache/chorus).",
    )
    host: str = option("127.0.0.1", help="Address to bind. Without API keys only loopback is allowed.")
    port: int = option(8000, min=1, max=65_535, help="TCP port.")
    base: str | None = option(
        None,
        help=BASE_HELP + " A Piper base serves its own voice and voices adapted on it (chorus adapt --base); "
        "onboarding jobs and instant voices need the Chorus base.",
    )
    model: Path | None = option(None, help="Chorus base model folder (default: the shipped base).")
    vocoder: str | None = option(
        None, help="The Chorus base's vocoder: griffin-lim, neural or a folder (default: the model's)."
    )
    keys: Path | None = option(None, help='API keys file: \'KEY TENANT\' lines or JSON {"KEY": "TENANT"}.')
    cache_mb: float = option(64.0, help="Adapter cache budget in MB (least recently used voices are evicted).")
    adapt_steps: int | None = option(
        None, min=0, help=f"Most training steps of an onboarded voice (early stopping; {SERVER_DEFAULT})."
    )
    adapt_method: str | None = option(
        None, help=f"Adapter method(s) of onboarded voices, e.g. lora+speaker ({SERVER_DEFAULT})."
    )
    adapt_threads: int | None = option(None, min=1, help=f"CPU threads of an onboarding job ({SERVER_DEFAULT}).")
    sample_steps: int | None = option(
        None,
        min=0,
        help=f"Most training steps refining a voice made from one sample, POST /v1/audio/voices ({SERVER_DEFAULT}).",
    )
    max_text_chars: int | None = option(None, min=1, help=f"Longest text of one speech request ({SERVER_DEFAULT}).")
    job_niceness: int | None = option(
        None,
        help="Niceness (0-19) of onboarding jobs' processes: above 0, speech is served first and training gets "
        "less of a busy CPU (at 5 about a quarter of a core that speech also wants); 0 shares it equally "
        f"({SERVER_DEFAULT}).",
    )
    limits: Path | None = option(
        None,
        help="Limits file (JSON) per tenant and for the whole server, e.g. "
        '{"tenant": {"requests_per_minute": 120, "active_jobs": 1, "voices": 50, "voice_bytes": 1e8}, '
        '"tenants": {"acme": {"voices": 500}}, "server": {"requests_per_minute": 3000, "queued_jobs": 16}} '
        "(default: 600 requests a minute, 2 onboarding jobs, 1,000 voices and 2 GiB per tenant; "
        "6,000 requests a minute, 32 queued jobs and 64 GiB for the server).",
    )
    voice_aliases: Path | None = option(
        None,
        help='Voice aliases file (JSON {"alias": "speaker"}) replacing the built-in map of OpenAI\'s voice '
        "names (alloy, echo, fable, onyx, nova, shimmer, ...) to speakers; the server does not start when "
        "one names no speaker (or blend) of the base.",
    )
    device: str = given_option(DEVICE_OPTION)
    # -- scale-out on Ray Serve (chorus.serving.ray_app) --
    ray: bool = option(
        False,
        "--ray",
        help="Serve on a local Ray cluster started on this machine's "
        "resources: --ray-replicas copies of the base, voices routed to "
        "replicas holding them, onboarding as Ray tasks (needs the ray "
        "extra).",
    )
    ray_replicas: int = option(2, min=1, help="With --ray: speech replicas, one resident base each.")
    ray_voices_per_replica: int = option(
        32, min=1, help="With --ray: adapted voices one replica holds (least recently used dropped first)."
    )


@takes_options(ServeOptions)
def serve(options: ServeOptions) -> None:
    """Run the multi-tenant voice server (one resident base, voices loaded on demand).

    Routes: POST /v1/audio/speech (OpenAI-compatible), /v1/voices (list, onboard,
    delete), /v1/jobs/ID, /healthz, /metrics.

    API keys map to tenants, from --keys FILE and/or the environment variable
    CHORUS_API_KEYS="key1:tenant1,key2:tenant2"; clients send
    "Authorization: Bearer KEY". With no key configured the server runs
    single-tenant (tenant "default", no authentication) on loopback only.

    Servers on several machines share one store: voices under an object store
    URL (--store s3://bucket/voices) and metadata in PostgreSQL (--database
    postgresql://...). A voice onboarded through one is spoken by all; an
    onboarding job whose server dies is finished by another.

    With --ray the same HTTP API runs on Ray Serve: a local Ray cluster is
    started on this machine (no dashboard, no usage reporting); each speech
    replica holds one base and the voices it was last asked for (Ray model
    multiplexing by voice), and onboarding jobs run as Ray tasks. Install
    with pip install 'chorus-tts\\[serve,ray]'.
    """
    run = _runner(options)
    with user_errors():
        run(_config(options))


def _runner(options: ServeOptions) -> Callable[[ServeConfig], None]:
    """What runs the server on its config: uvicorn in this process, or with --ray a local Ray cluster; fails,
    saying what to install, where the extra it needs is missing."""
    extras = "serve and ray extras" if options.ray else "serve extra"
    try:
        from chorus.serving.api import serve as run_server

        if options.ray:
            from chorus.serving.ray_app import serve_ray
    except ImportError as error:
        fail(
            f"{'--ray' if options.ray else 'the server'} needs the {extras} ({error.name} is missing): "
            f"pip install 'chorus-tts[{'serve,ray' if options.ray else 'serve'}]'"
        )
    if options.ray:
        return functools.partial(
            serve_ray,
            replicas=options.ray_replicas,
            voices_per_replica=options.ray_voices_per_replica,
            announce=console.print,
        )
    return functools.partial(run_server, announce=console.print)


def _config(options: ServeOptions) -> ServeConfig:
    """The server's config: its settings (the server's defaults, what the options change, the --limits and
    --voice-aliases files), where voices and metadata are kept, the base and the address to bind."""
    from chorus.serving.settings import Limits, ServeConfig, ServerSettings, read_voice_aliases

    settings = server_settings(
        ServerSettings(),
        options.adapt_method,
        options.adapt_steps,
        options.adapt_threads,
        options.max_text_chars,
        options.sample_steps,
    )
    if options.job_niceness is not None:
        settings = dataclasses.replace(settings, job_niceness=options.job_niceness)
    if options.limits is not None:
        settings = dataclasses.replace(settings, limits=Limits.from_file(options.limits))
    if options.voice_aliases is not None:
        settings = dataclasses.replace(settings, voice_aliases=read_voice_aliases(options.voice_aliases))
    return ServeConfig(
        store=options.store,
        database=options.database,
        cache_dir=options.cache_dir,
        host=options.host,
        port=options.port,
        base=chosen_base(options.base, options.model),
        vocoder=options.vocoder,
        keys=options.keys,
        cache_mb=options.cache_mb,
        settings=settings,
        device=options.device,
    )


def server_settings(
    defaults,
    adapt_method: str | None,
    adapt_steps: int | None,
    adapt_threads: int | None,
    max_text_chars: int | None,
    sample_steps: int | None = None,
):
    """``defaults`` (a ``ServerSettings``) with what the command line gives; a bad onboarding method
    fails here, before the server starts."""
    from chorus.adapters import parse_methods

    given = {
        "methods": None if adapt_method is None else parse_methods(adapt_method),
        "steps": adapt_steps,
        "threads": adapt_threads,
    }
    adapt = dataclasses.replace(defaults.adapt, **{k: v for k, v in given.items() if v is not None})
    settings = dataclasses.replace(defaults, adapt=adapt)
    if sample_steps is not None:
        settings = dataclasses.replace(
            settings, adapt_sample=dataclasses.replace(settings.adapt_sample, steps=sample_steps)
        )
    if max_text_chars is not None:
        settings = dataclasses.replace(settings, max_text_chars=max_text_chars)
    return settings


def serve_key(
    tenant: str = typer.Argument(..., help="The tenant the key belongs to ('operator' also reads /metrics)."),
) -> None:
    """Make a new API key for TENANT: the key on stderr (give it to the tenant; it is shown once), the line
    for the --keys file on stdout (only the key's SHA-256 digest), so `chorus serve-key ann >> keys.txt`."""
    from chorus.serving.tenants import make_key

    with user_errors():
        key, line = make_key(tenant)
    # Plain lines: a terminal-width wrap would break them.
    typer.echo(f"API key for {tenant} (shown once, not stored): {key}", err=True)
    typer.echo(line)
