"""Embedding over HTTP: OpenAI-compatible `/v1/embeddings` and Gemini `batchEmbedContents`.

Both probe the dimension with one request at start-up, so a wrong URL or key fails
when the memory opens, not in the middle of an import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from ..errors import EmbedderError, EmbedderUnavailableError

__all__ = ["OpenAIEmbedder", "GeminiEmbedder"]

_TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def _post(client: httpx.Client, url: str, payload: dict[str, Any], what: str) -> dict[str, Any]:
    try:
        response = client.post(url, json=payload)
    except httpx.HTTPError as exc:
        raise EmbedderError(f"{what}: request to {url} failed: {exc}") from exc
    if response.status_code >= 400:
        raise EmbedderError(f"{what}: HTTP {response.status_code} from {url}: {response.text[:300]}")
    try:
        return response.json()
    except ValueError as exc:
        raise EmbedderError(f"{what}: {url} did not return JSON") from exc


class OpenAIEmbedder:
    def __init__(self, model: str, base_url: str, api_key: str = "", batch_size: int = 64) -> None:
        self.model = model
        self.name = f"openai/{model}"
        self._url = base_url.rstrip("/") + "/embeddings"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=_TIMEOUT, headers=headers, transport=httpx.HTTPTransport(retries=2))
        self._batch = batch_size
        try:
            self.dimension = int(self._request(["dimension probe"]).shape[1])
        except EmbedderError as exc:
            raise EmbedderUnavailableError(f"OpenAI-compatible embedder at {base_url} is unavailable: {exc}") from exc

    def _request(self, texts: Sequence[str]) -> np.ndarray:
        body = _post(self._client, self._url, {"model": self.model, "input": list(texts)}, "openai embeddings")
        try:
            rows = sorted(body["data"], key=lambda item: item.get("index", 0))
            return np.asarray([row["embedding"] for row in rows], dtype=np.float32)
        except (KeyError, TypeError) as exc:
            raise EmbedderError(f"openai embeddings: unexpected response shape: {str(body)[:200]}") from exc

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        parts = [self._request(texts[i : i + self._batch]) for i in range(0, len(texts), self._batch)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dimension), np.float32)

    embed_queries = embed_passages


class GeminiEmbedder:
    def __init__(self, model: str, api_key: str, base_url: str = "", batch_size: int = 100) -> None:
        if not api_key:
            raise EmbedderUnavailableError("Gemini embeddings need an API key: set GIEOK_GEMINI_API_KEY")
        self.model = model if model.startswith("models/") else f"models/{model}"
        self.name = f"gemini/{self.model.removeprefix('models/')}"
        base = (base_url or "https://generativelanguage.googleapis.com").rstrip("/")
        self._url = f"{base}/v1beta/{self.model}:batchEmbedContents"
        self._client = httpx.Client(
            timeout=_TIMEOUT, headers={"x-goog-api-key": api_key}, transport=httpx.HTTPTransport(retries=2)
        )
        self._batch = batch_size
        try:
            self.dimension = int(self._request(["dimension probe"], "RETRIEVAL_QUERY").shape[1])
        except EmbedderError as exc:
            raise EmbedderUnavailableError(f"Gemini embedder is unavailable: {exc}") from exc

    def _request(self, texts: Sequence[str], task: str) -> np.ndarray:
        payload = {
            "requests": [
                {"model": self.model, "content": {"parts": [{"text": t}]}, "taskType": task} for t in texts
            ]
        }
        body = _post(self._client, self._url, payload, "gemini embeddings")
        try:
            return np.asarray([item["values"] for item in body["embeddings"]], dtype=np.float32)
        except (KeyError, TypeError) as exc:
            raise EmbedderError(f"gemini embeddings: unexpected response shape: {str(body)[:200]}") from exc

    def _batched(self, texts: Sequence[str], task: str) -> np.ndarray:
        parts = [self._request(texts[i : i + self._batch], task) for i in range(0, len(texts), self._batch)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dimension), np.float32)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._batched(texts, "RETRIEVAL_DOCUMENT")

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._batched(texts, "RETRIEVAL_QUERY")
