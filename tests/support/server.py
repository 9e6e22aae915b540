"""A real engine served over HTTP by ``engine.server`` on a free port, for the server tests."""

from __future__ import annotations

from typing import Any


class Served:
    """The local engine on ``source`` ("" = bundled) behind ``brisk serve``'s pieces, on 127.0.0.1 and port 0.

    ``client`` is the synchronous client of the same engine (its own requests bypass HTTP), ``url`` the base
    URL (``.../v1``), ``hub`` and ``service`` the server's."""

    def __init__(self, source: str, api_key: str | None = None, answer_cache: bool = False, **service: Any) -> None:
        from engine.api import AnswerCacheSettings, ModelSpec, Sampling
        from engine.client import Client, local_backend
        from engine.server import Hub, ServerThread, Service, model_id

        backend = local_backend(answer_cache=AnswerCacheSettings(enabled=answer_cache))
        self.hub = Hub(lambda r: self.client.backend.submit(r), lambda i: self.client.backend.cancel(i))
        self.client = Client(lambda sink: backend(lambda event: self.hub.dispatch(event) or sink(event)), timeout=300)
        loaded = self.client.load(ModelSpec(source=source, dtype="float32", quant="none"))
        service.setdefault("defaults", Sampling(max_tokens=24))
        service.setdefault("speculative", "off")
        self.service = Service(hub=self.hub, api_key=api_key, **service)
        self.service.model = model_id(loaded.model_name)
        self.service.aliases = (loaded.model_name,)
        self.service.context = loaded.info.context_length
        self.thread = ServerThread(self.service, "127.0.0.1", 0)
        self.url = self.thread.start()
        self.root = self.url.removesuffix("/v1")

    def openai(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("api_key", self.service.api_key or "none")
        return openai.OpenAI(base_url=self.url, max_retries=0, timeout=120, **kwargs)

    def close(self) -> None:
        self.thread.stop()
        self.client.close()
