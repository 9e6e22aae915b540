"""A real engine served over HTTP by ``engine.server`` on a free port, for the server tests."""

from __future__ import annotations

from typing import Any


class Served:
    """The local engine on ``source`` ("" = bundled) behind ``brisk serve``'s pieces, on 127.0.0.1 and port 0.

    ``client`` is the synchronous client of the same engine (its own requests bypass HTTP), ``url`` the base
    URL (``.../v1``), ``hub`` and ``service`` the server's; ``options``: the engine's (``EngineOptions``)."""

    def __init__(self, source: str, api_key: str | None = None, answer_cache: bool = False, **options: Any) -> None:
        from engine.api import AnswerCacheSettings, ModelSpec, Sampling
        from engine.client import Client, Router, local_backend

        router = Router()  # as brisk serve builds it
        self.server = router.serve()
        self.hub, self.service = self.server.hub, self.server.service
        self.service.embedder = None  # the embeddings test gives it one
        backend = local_backend(answer_cache=AnswerCacheSettings(enabled=answer_cache), **options)
        self.client = Client(backend, timeout=300, router=router)
        loaded = self.client.load(ModelSpec(source=source, dtype="float32", quant="none"))
        self.server.set_model(loaded.model_name, loaded.info.context_length)
        self.url = self.server.start("127.0.0.1", 0, api_key, Sampling(max_tokens=24), "off")
        assert self.server.thread is not None
        self.thread = self.server.thread
        self.root = self.url.removesuffix("/v1")

    def openai(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("api_key", self.service.api_key or "none")
        return openai.OpenAI(base_url=self.url, max_retries=0, timeout=120, **kwargs)

    def close(self) -> None:
        self.server.stop()
        self.client.close()
