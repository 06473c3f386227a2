"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own: HTTP requests by route
template (never by voice id) and status, requests and speech by tenant, the process, and the engine cache,
batcher and onboarding counters read at scrape time.

Tenants are labels: they are the keys file's, a set the operator keeps (a request whose key is refused
has no tenant, and is counted by route only)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.process_collector import ProcessCollector

from chorus.serving.batcher import SpeechQueue
from chorus.serving.engine import Engine
from chorus.serving.onboarding.job_runner import JobRunner


class Metrics:
    """Prometheus metrics of one server, in a registry of its own. It is given the parts it reads, not the
    server that holds them, so that the server may import it (and it nothing above)."""

    def __init__(self, engine: Engine, batcher: SpeechQueue, jobs: JobRunner):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "chorus_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "chorus_http_request_seconds",
            "Time to the end of the response, by route",
            ["route"],
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tenant_requests = Counter(
            "chorus_tenant_requests",
            "HTTP requests by tenant and status (requests with a valid key)",
            ["tenant", "status"],
            registry=self.registry,
        )
        self.audio_seconds = Counter(
            "chorus_speech_audio_seconds", "Seconds of audio synthesized, by tenant", ["tenant"], registry=self.registry
        )
        self.characters = Counter(
            "chorus_speech_characters", "Characters of text synthesized, by tenant", ["tenant"], registry=self.registry
        )
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu seconds, open fds
        self.registry.register(ServerCollector(engine, batcher, jobs))


class ServerCollector:
    """Engine cache and batcher counters, read at scrape time."""

    def __init__(self, engine: Engine, batcher: SpeechQueue, jobs: JobRunner):
        self.engine, self.batcher, self.jobs = engine, batcher, jobs

    def collect(self):
        stats = self.engine.stats()
        for name, value, text in [
            ("hits", stats.hits, "batches that found an adapted voice resident"),
            ("misses", stats.misses, "batches that had to load an adapted voice"),
            ("loads", stats.loads, "adapted voices loaded into the model"),
            ("load_failures", stats.load_failures, "adapted voice loads that failed"),
            ("evictions", stats.evictions, "adapted voices evicted from the model"),
        ]:
            yield CounterMetricFamily(f"chorus_cache_{name}", f"Voice cache: {text}", value=value)
        yield CounterMetricFamily("chorus_cache_load_seconds", "Time spent loading voices", value=stats.load_seconds)
        yield GaugeMetricFamily(
            "chorus_cache_resident_bytes", "Bytes of adapter tensors resident", value=stats.resident_bytes
        )
        yield GaugeMetricFamily("chorus_cache_resident_voices", "Adapted voices resident", value=stats.resident_voices)
        yield GaugeMetricFamily("chorus_cache_capacity_bytes", "Adapter cache budget", value=stats.capacity_bytes)
        b = self.batcher.stats
        sizes = dict(b.batch_sizes)
        bounds = [1, 2, 4, 8, 16, 32, 64]
        buckets = [(str(le), sum(c for s, c in sizes.items() if s <= le)) for le in bounds]
        buckets.append(("+Inf", sum(sizes.values())))
        yield HistogramMetricFamily(
            "chorus_batch_size",
            "Requests per forward of the acoustic model",
            buckets=buckets,
            sum_value=sum(s * c for s, c in sizes.items()),
        )
        for name, value, what in [
            ("requests", b.requests, "Speech requests the batcher was given"),
            ("completed", b.completed, "Speech requests the batcher completed"),
            ("failed", b.failed, "Speech requests that failed in the batcher"),
        ]:
            yield CounterMetricFamily(f"chorus_batcher_{name}", what, value=value)
        yield CounterMetricFamily("chorus_batcher_busy_seconds", "Batcher worker time in batches", value=b.busy_seconds)
        paths = CounterMetricFamily("chorus_batches_by_path", "Batches by path", labels=["path"])
        for path, count in b.paths.items():
            paths.add_metric([path], count)
        yield paths
        yield GaugeMetricFamily("chorus_onboarding_queued", "Onboarding jobs waiting", value=self.jobs.queued)
        yield GaugeMetricFamily(
            "chorus_onboarding_running", "Onboarding jobs running", value=int(self.jobs.running is not None)
        )
        ended = CounterMetricFamily(
            "chorus_onboarding_jobs_ended",
            "Onboarding jobs this server's worker took to their end, by tenant and status (done or failed)",
            labels=["tenant", "status"],
        )
        for (tenant, status), count in sorted(self.jobs.ended.items()):
            ended.add_metric([tenant, status], count)
        yield ended


class MetricsMiddleware:
    """Counts every HTTP request by route template (never by voice id) and status, and by tenant where its
    key named one (``request.state.tenant``, set by the server's authentication)."""

    def __init__(self, app, metrics: Callable[[], Metrics]):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            metrics = self.metrics()
            metrics.requests.labels(route=route, method=scope.get("method", ""), status=str(status[0])).inc()
            metrics.latency.labels(route=route).observe(time.perf_counter() - started)
            tenant = scope.get("state", {}).get("tenant")
            if tenant is not None:
                metrics.tenant_requests.labels(tenant=tenant, status=str(status[0])).inc()
