"""Service settings: environment variables with the ``SAFETY_`` prefix, overridable by CLI flags.

Built by :func:`dialogue_safety.service.app.create_app` (or the CLI), never at import time::

    SAFETY_MODEL_DIR=models/default SAFETY_MAX_WAIT_MS=2 dialogue-safety serve --port 8000
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dialogue_safety.core import language
from dialogue_safety.core.batch_budget import MAX_BATCH_SIZE, MAX_BATCH_TOKENS
from dialogue_safety.core.limits import MAX_WINDOWS, Limits
from dialogue_safety.core.model_dir import default_model_dir
from dialogue_safety.core.schema import THRESHOLD_RANGE

ENV_PREFIX = "SAFETY_"
#: settings renamed, read under their old name with a warning: old name -> new name (None: no longer used)
DEPRECATED_SETTINGS: dict[str, str | None] = {
    "inference_token_budget": "max_batch_tokens",  # after 0.3.0: one batching budget (TEI's max_batch_tokens)
    "token_budget": None,  # after 0.3.0: batches close at max_batch_size items; max_batch_tokens cuts them
    # after 0.3.0: the request limit apart from the model's truncation setting (encoding.max_history_turns)
    "max_history_turns": "max_request_history_turns",
    # after 0.4: admission charges work in model tokens (max_pending_tokens, max_explain_tokens)
    "queue_size": None,
    "max_queue_wait_ms": None,
}
log = logging.getLogger("dialogue_safety.service.settings")
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]


class ServiceSettings(BaseSettings):
    """Everything the HTTP service can be told; one field per ``SAFETY_<NAME>`` variable."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # where to listen
    host: str = Field(default="127.0.0.1", description="interface to bind (0.0.0.0 in containers)")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0 picks a free one)")

    # which model, how it runs
    model_dir: Path = Field(default_factory=default_model_dir, description="ONNX model directory")
    variant: str | None = Field(default=None, description="ONNX variant (fp32, optimized, int8, fp16); card default")
    providers: str | None = Field(
        default=None,
        description="comma-separated onnxruntime providers, e.g. CUDAExecutionProvider,CPUExecutionProvider",
    )
    intra_op_threads: int | None = Field(
        default=None, ge=1, description="onnxruntime intra-op threads in all, shared out between the inference workers"
    )
    allow_spinning: bool | None = Field(
        default=None, description="onnxruntime intra-op threads spin while idle (default: the runtime's)"
    )
    inference_workers: int = Field(
        default=2,
        ge=1,
        le=64,
        description="inference workers run side by side, each on its own onnxruntime session with the intra-op "
        "threads shared out: a long request holds one worker while another client's rows run on the next (on cores "
        "of their own where there are enough, else time-sliced by the OS); 1: one worker with every thread",
    )
    inference_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="how much lower the inference threads' OS priority is than the rest of the server (the "
        "batcher's and onnxruntime's intra-op threads; Linux nice steps; 0: the same): where inference and the "
        "event loop share a core, requests are still read, refused (429) and health checks answered at once under "
        "overload, and inference takes the CPU left",
    )
    threshold: float | None = Field(
        default=None,
        ge=THRESHOLD_RANGE[0],
        le=THRESHOLD_RANGE[1],
        description="decision threshold override (default: the model card's)",
    )
    policy: Path | None = Field(
        default=None,
        description="operator policy file (TOML: per-category thresholds, block and allow lists; see "
        "docs/policy.example.toml), checked at start, reloaded by POST /admin/policy",
    )
    policy_dir: Path | None = Field(
        default=None,
        description="a directory of policy files POST /admin/policy may load by path (a relative path is taken "
        "in it); unset: it reloads the start-up policy file only",
    )

    # micro-batching
    max_batch_size: int = Field(
        default=MAX_BATCH_SIZE, ge=1, le=4096, description="rows (windows, utterance-alone rows) per batch at most"
    )
    max_batch_tokens: int = Field(
        default=MAX_BATCH_TOKENS,
        ge=1,
        description="tokens of rows per batch at most, and padded tokens per inference call (rows x longest): a batch "
        "runs in length-sorted calls this big (less padding waste on CPU; raise it on GPU). A long request's rows "
        "are spread over batches: nobody waits behind more than one",
    )
    max_wait_ms: float = Field(
        default=2.0, ge=0.0, le=1000.0, description="how long a batch may wait for company once traffic is concurrent"
    )

    # admission (dialogue_safety/service/admission.py; see docs/service.md, "Admission")
    max_pending_tokens: int = Field(
        default=65_536,
        ge=2,
        description="work the classify lane holds at most, admitted and not yet answered (waiting and running), in "
        "model tokens: tokens x windows x passes of every item. Beyond: 429 with Retry-After. One request may cost "
        "at most half of it (else 413); one client holds at most this over the clients holding work (at least two)",
    )
    max_explain_tokens: int = Field(
        default=32_768,
        ge=2,
        description="the same budget for explanations (their own lane: every sequence an explanation scores is "
        "charged here, never to the classify lane); an explanation is planned to cost at most half of it",
    )

    # connections and bodies (see docs/api.md, "Production settings")
    max_connections: int = Field(
        default=4096,
        ge=1,
        description="open TCP connections at most (capped below the open-files limit); beyond: the connection idle "
        "longest is closed to make room, or the new one when all are busy",
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0.0, description="seconds a new connection has to send a complete request head"
    )
    keep_alive_timeout_s: float = Field(
        default=5.0, gt=0.0, description="seconds an idle keep-alive connection stays open between requests"
    )
    body_timeout_s: float = Field(
        default=10.0, gt=0.0, description="seconds a request has to send its whole body (then 408, closed)"
    )
    max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        description="bytes a request head (request line and headers) may have; beyond: 431 and the connection "
        "is closed",
    )
    forwarded_allow_ips: str | None = Field(
        default=None,
        description="comma-separated addresses or networks (or *) of the reverse proxies whose X-Forwarded-For "
        "and X-Forwarded-Proto headers are trusted: the client address (break-it rate limits, the access log) is "
        "then the one the proxy saw. Unset: the headers are ignored (the client is the connection's peer)",
    )
    max_inflight_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="bytes all unfinished request bodies may hold together (Content-Length counts at once); "
        "beyond: 429",
    )
    refused_body_share: float = Field(
        default=0.01,
        gt=0.0,
        le=1.0,
        description="the share of the service's time one client's refused large bodies (over 64 KiB) may take: "
        "after one is answered 4xx, that client's next large body is refused 429 for (1/share - 1) x the time the "
        "refused one took (at most 60 s); its small bodies pass; 1: no pause",
    )

    # request limits (see docs/api.md, "Limits and errors")
    max_request_history_turns: int = Field(
        default=32,
        ge=0,
        description="history turns per item at most; a request with more is refused (422). Not the model's "
        "truncation (the card's encoding.max_history_turns keeps the newest turns the model reads)",
    )
    max_turn_chars: int = Field(default=4000, ge=1, description="characters per history turn at most")
    max_utterance_chars: int = Field(default=4000, ge=1, description="characters per utterance at most")
    max_windows: int = Field(
        default=MAX_WINDOWS,
        ge=1,
        description="windows of model input (~125 tokens each, overlapping) one utterance is read in at most; an "
        "item that needs more is refused (too_many_windows). 4,000 characters of prose need ~9",
    )
    max_batch_items: int = Field(default=256, ge=1, description="items per /v1/classify/batch request at most")
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1, description="request body size at most (bytes)")

    # access and logging
    api_key: SecretStr | None = Field(
        default=None,
        description="if set, /v1/* and the API docs need 'Authorization: Bearer <key>' or 'X-API-Key: <key>' "
        "(an empty value is refused: unset the variable to run without a key)",
    )
    public_docs: bool = Field(
        default=False, description="with an API key set, keep /docs, /redoc and /openapi.json open without it"
    )
    language_check: bool = Field(
        default=language.CHECK_BY_DEFAULT,
        description="say in each answer which language the utterance is in (language, language_supported: the "
        "model reads English only); off: no language fields",
    )
    log_texts: bool = Field(default=False, description="log request texts and scores (never on by default)")
    log_level: LogLevel = Field(default="info", description="uvicorn and service log level")
    access_log: bool = Field(default=True, description="uvicorn access log (method, path, status; never bodies)")
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After seconds sent with 429 and 503")

    # build it / break it / fix it (dialogue_safety/breakit): off unless a database is given
    breakit_db: str | None = Field(
        default=None,
        description="enables the break-it game at /break-it: an SQLite file (created, WAL) or a database URL "
        "(postgresql://user@host/db; put a URL with a password in the environment, not on the command line)",
    )

    @model_validator(mode="before")
    @classmethod
    def _deprecated_names(cls, data: Any) -> Any:
        """Old ``SAFETY_*`` variables still work for a while: the value moves to the new name, with a warning."""
        if not isinstance(data, dict):
            return data
        for old, new in DEPRECATED_SETTINGS.items():
            env = f"{ENV_PREFIX}{old.upper()}"
            value = data.pop(old, None)
            if value is None:
                value = next((v for k, v in os.environ.items() if k.upper() == env), None)
            if value is None:
                continue
            if new is None:
                log.warning("%s is no longer used and is ignored", env)
            elif new in data:
                log.warning("%s is deprecated and ignored: %s%s is set", env, ENV_PREFIX, new.upper())
            else:
                log.warning("%s is deprecated: use %s%s", env, ENV_PREFIX, new.upper())
                data[new] = value
        return data

    @model_validator(mode="after")
    def _api_key_is_not_empty(self) -> ServiceSettings:
        if self.api_key is not None and not self.api_key.get_secret_value().strip():
            raise ValueError(
                f"{ENV_PREFIX}API_KEY is set but empty: set it to the key clients must send, or unset it "
                "to run without authentication"
            )
        return self

    @property
    def provider_list(self) -> list[str] | None:
        if not self.providers:
            return None
        return [p.strip() for p in self.providers.split(",") if p.strip()]

    @property
    def limits(self) -> Limits:
        """The per-item request limits these settings set (the API, the break-it game, ``dialogue-safety score``)."""
        return Limits(
            max_request_history_turns=self.max_request_history_turns,
            max_turn_chars=self.max_turn_chars,
            max_utterance_chars=self.max_utterance_chars,
            max_batch_items=self.max_batch_items,
            max_body_bytes=self.max_body_bytes,
            max_windows=self.max_windows,
        )

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0
