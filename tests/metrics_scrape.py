"""A real server's /metrics scraped over HTTP, by (name, sorted labels)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, token: str | None = None) -> Samples:
    """Every sample of http://127.0.0.1:port/metrics, by (name, sorted labels); `token`: sent as
    `Authorization: Bearer TOKEN`. urllib.error.HTTPError for a refusal (401 without the token)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    with opener.open(urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers), timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))
